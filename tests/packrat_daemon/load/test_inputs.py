"""The requests `packrat load` makes from a daemon's `info`: one array for a model of one input, named arrays for
one of several, each within its declaration (token ids below `high`, masks all ones); with lengths, each request
at its own length along a free axis, or padded to a fixed-length model's length with its mask marking the tokens."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from packrat_daemon.load.inputs import Declared, Inputs, declared_inputs
from packrat_daemon.load.lengths import Fixed, Uniform, parse_lengths
from packrat_daemon.wire.client_side import encode_infer_request, encode_tensors_request
from packrat_daemon.wire.errors import ConfigError


def text_model(length: int | None = 32, free: int | None = None, vocab: int = 120) -> dict[str, Any]:
    """The `info` of a BERT-like folder: three int64 inputs of one length (fixed), or of a free axis up to `free`."""

    def entry(name: str, high: int) -> dict[str, Any]:
        if free is None:
            return {"name": name, "dtype": "int64", "shape": [length], "high": high}
        return {"name": name, "dtype": "int64", "shape": [-1], "high": high, "max_length": free, "min_length": 1}

    inputs = [entry("input_ids", vocab), entry("attention_mask", 2), entry("token_type_ids", 2)]
    return {"input": {k: inputs[0][k] for k in ("dtype", "shape", "high")}, "inputs": inputs, "max_batch": 8}


TWO_FLOATS = {
    "input": {"dtype": "float32", "shape": [4], "high": None},
    "inputs": [{"name": n, "dtype": "float32", "shape": [4], "high": None} for n in ("a", "b")],
    "max_batch": 16,
}
ONE = {"input": {"dtype": "float32", "shape": [3], "high": None}, "inputs": [{"name": "input", "dtype": "float32",
       "shape": [3], "high": None}], "max_batch": 32}  # fmt: skip


def test_a_model_of_one_input_gets_one_array_as_before() -> None:
    inputs = Inputs(ONE, 8)
    request = inputs.request(5)
    assert isinstance(request, np.ndarray) and request.shape == (5, 3) and request.dtype == np.float32
    assert inputs.rows(5).base is not None  # a view of the rows made once, no copy per request
    assert encode_infer_request(1, request)  # what version 1 carries
    # A daemon from before named inputs gives only `input`.
    assert Inputs({"input": ONE["input"], "max_batch": 32}, 8).request(2).shape == (2, 3)


def test_a_model_of_two_inputs_gets_both_by_name_in_one_version_2_request() -> None:
    inputs = Inputs(TWO_FLOATS, 4)
    request = inputs.request(3)
    assert isinstance(request, dict) and list(request) == ["a", "b"]
    assert all(array.shape == (3, 4) and array.dtype == np.float32 for array in request.values())
    assert not np.array_equal(request["a"], request["b"])
    header, *payloads = encode_tensors_request(7, request)
    assert b'"v":2' in header.replace(b" ", b"") and len(payloads) == 2
    assert inputs.describe() == {"inputs": ["a", "b"]}


def test_token_ids_stay_in_the_vocabulary_and_masks_are_all_ones() -> None:
    request = Inputs(text_model(vocab=7), 8).request(8)
    assert isinstance(request, dict) and list(request) == ["input_ids", "attention_mask", "token_type_ids"]
    assert request["input_ids"].dtype == np.int64 and request["input_ids"].shape == (8, 32)
    assert request["input_ids"].min() >= 0 and request["input_ids"].max() < 7
    assert len(np.unique(request["input_ids"])) > 3  # random ids, not one repeated
    assert (request["attention_mask"] == 1).all()
    assert set(np.unique(request["token_type_ids"]).tolist()) <= {0, 1}


def test_bfloat16_inputs_are_labelled_for_the_wire() -> None:
    one = {"input": {"dtype": "bfloat16", "shape": [2], "high": None}, "max_batch": 4}
    assert Inputs(one, 2).wire_dtype == "bfloat16" and Inputs(one, 2).request(2).dtype == np.uint16
    two = {"input": {}, "max_batch": 4, "inputs": [{"name": "x", "dtype": "bfloat16", "shape": [2]},
                                                   {"name": "y", "dtype": "float32", "shape": [2]}]}  # fmt: skip
    assert Inputs(two, 2).wire_dtype == {"x": "bfloat16"}
    assert Inputs(TWO_FLOATS, 2).wire_dtype is None


def test_with_a_free_axis_each_request_is_sent_at_its_own_length() -> None:
    inputs = Inputs(text_model(free=64), 8, lengths=Uniform(1, 64))
    assert inputs.padded_to is None and [t.name for t in inputs.varies] == ["input_ids", "attention_mask",
                                                                           "token_type_ids"]  # fmt: skip
    seen = set()
    for samples in (1, 3, 8):
        for _ in range(20):
            length = inputs.length()
            assert length is not None and 1 <= length <= 64
            request = inputs.request(samples, length)
            assert isinstance(request, dict)
            assert {name: array.shape for name, array in request.items()} == dict.fromkeys(request, (samples, length))
            assert (request["attention_mask"] == 1).all()
            encode_tensors_request(1, request)  # each one a request the protocol carries
            seen.add(length)
    assert len(seen) > 20
    # Without lengths, a free axis is sent at its longest.
    assert Inputs(text_model(free=64), 8).request(2)["input_ids"].shape == (2, 64)  # type: ignore[index]


def test_the_lengths_drawn_are_the_distribution_s_in_order_and_seeded() -> None:
    lengths = parse_lengths("lognormal:median=12,p99=64,max=128")
    first = Inputs(text_model(free=128), 1, seed=5, lengths=lengths).length()
    inputs = Inputs(text_model(free=128), 1, seed=5, lengths=lengths)
    sequence = [inputs.length() for _ in range(2500)]  # past the first thousand drawn at once
    again = Inputs(text_model(free=128), 1, seed=5, lengths=lengths)
    assert sequence == [again.length() for _ in range(2500)] and sequence[0] == first
    assert np.median(sequence) == pytest.approx(12, abs=1.5) and max(sequence) <= 128


def test_a_fixed_length_model_gets_each_request_padded_its_mask_marking_the_tokens() -> None:
    inputs = Inputs(text_model(length=32), 4, lengths=Uniform(4, 32))
    assert inputs.padded_to == 32
    assert inputs.describe() == {"inputs": ["input_ids", "attention_mask", "token_type_ids"],
                                 "lengths": "uniform:4..32", "padded_to": 32}  # fmt: skip
    request = inputs.request(3, 10)
    assert isinstance(request, dict) and all(array.shape == (3, 32) for array in request.values())
    mask = request["attention_mask"]
    assert (mask[:, :10] == 1).all() and (mask[:, 10:] == 0).all()
    assert (request["input_ids"][:, 10:] == 0).all() and (request["input_ids"][:, :10] != 0).any()
    assert (request["token_type_ids"][:, 10:] == 0).all()
    assert (inputs.request(3, 10)["attention_mask"][:, :10] == 1).all()  # type: ignore[index]  # the base unchanged
    full = inputs.request(2, 32)
    assert isinstance(full, dict) and (full["attention_mask"] == 1).all()


@pytest.mark.parametrize(
    ("info", "lengths", "match"),
    [
        (text_model(free=64), Uniform(8, 128), "sends 8 to 128 tokens; the model takes 1 to 64"),
        (text_model(length=32), Fixed(64), "up to 64 tokens, but the model takes 32, fixed: .*--input int64:1..64"),
        (TWO_FLOATS, Fixed(4), "needs a model of token inputs .* it takes a float32, b float32"),
    ],
)
def test_lengths_a_model_cannot_take_are_refused_before_sending(info: dict, lengths: Any, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        Inputs(info, 1, lengths=lengths)


def test_integer_inputs_of_different_lengths_share_no_sequence_axis() -> None:
    tensors = [{"name": name, "dtype": "int64", "shape": [n], "high": 9} for name, n in (("ids", 32), ("pos", 16))]
    info = {"input": {}, "max_batch": 4, "inputs": tensors}
    with pytest.raises(ConfigError, match="differ in length \\(ids 32, pos 16\\)"):
        Inputs(info, 1, lengths=Fixed(8))


def test_declarations_are_read_from_info() -> None:
    free = Declared.from_info({"dtype": "int64", "shape": [-1], "high": 9, "max_length": 128, "min_length": 2}, "ids")
    assert (free.shape, free.free_axis, free.min_length, free.longest) == ((128,), 0, 2, 128)
    with pytest.raises(ConfigError, match="free axis without its longest"):
        Declared.from_info({"dtype": "int64", "shape": [-1]}, "ids")
    with pytest.raises(ConfigError, match="2 free axes"):
        Declared.from_info({"dtype": "float32", "shape": [-1, -1], "max_length": 4}, "x")
    assert declared_inputs(TWO_FLOATS)[1] is True and declared_inputs(ONE)[1] is False


def test_requests_over_max_batch_are_refused() -> None:
    with pytest.raises(ConfigError, match="more than the daemon's max_batch 16"):
        Inputs(TWO_FLOATS, 17)
