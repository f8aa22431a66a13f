"""Protocol version 2, named tensors: the records the daemon batches them as, the request's parsing and its
checks against a model of several inputs (each refusal a typed BAD_REQUEST naming what to fix), and the reply of
several named outputs, read back by the client's side."""

from __future__ import annotations

import json

import numpy as np
import pytest

from packrat_daemon.wire.client_side import decode_reply, encode_tensors_request, infer_result
from packrat_daemon.wire.codec import (
    MAX_NAME_CHARS,
    MAX_TENSORS,
    ErrorCode,
    ProtocolError,
    check_tensor_name,
    pack_records,
    record_bytes,
    unpack_records,
)
from packrat_daemon.wire.model_checks import check_named_input, check_tensors_against_model
from packrat_daemon.wire.server_replies import encode_tensors_result
from packrat_daemon.wire.server_side import InferRequest, ModelTensor, Tensor, parse_request

LIMIT = 1 << 20
TEXT = [ModelTensor("input_ids", "int64", (4,), 50), ModelTensor("attention_mask", "int64", (4,), 2)]


def text_arrays(samples: int = 2) -> dict[str, np.ndarray]:
    ids = np.arange(samples * 4, dtype=np.int64).reshape(samples, 4)
    return {"input_ids": ids, "attention_mask": np.ones((samples, 4), dtype=np.int64)}


def parsed(arrays: dict[str, np.ndarray], **options: object) -> InferRequest:
    frames = encode_tensors_request(5, arrays, **options)  # type: ignore[arg-type]
    _, request = parse_request(frames, max_message_bytes=LIMIT)
    assert isinstance(request, InferRequest)
    return request


def refusal(frames: list[bytes]) -> ProtocolError:
    with pytest.raises(ProtocolError) as caught:
        parse_request(frames, max_message_bytes=LIMIT)
    return caught.value


def test_records_hold_each_samples_bytes_of_every_tensor_in_turn() -> None:
    x = np.arange(6, dtype=np.float32).reshape(3, 2)
    ids = np.array([[1], [2], [3]], dtype=np.int64)
    rows = pack_records([x, ids])
    assert rows.shape == (3, 2 * 4 + 8) and rows.dtype == np.uint8
    assert rows[1].tobytes() == x[1].tobytes() + ids[1].tobytes()
    layout = [("float32", (2,)), ("int64", (1,))]
    assert record_bytes(layout) == 16
    back = unpack_records(rows[1:], layout)  # a slice of the rows, as a worker's share of a batch
    np.testing.assert_array_equal(back[0], x[1:])
    np.testing.assert_array_equal(back[1], ids[1:])
    with pytest.raises(ValueError, match="records of 16 bytes, but the layout needs 8"):
        unpack_records(rows, [("int64", (1,))])


@pytest.mark.parametrize(
    ("name", "problem"),
    [("input_ids", None), ("", "has 0 characters"), ("x" * (MAX_NAME_CHARS + 1), "has 129 characters"),
     ("naïve", "printable ASCII"), ("a\nb", "printable ASCII"), (3, "must be a string")],
)  # fmt: skip
def test_a_tensor_name_is_1_to_128_printable_ascii_characters(name: object, problem: str | None) -> None:
    found = check_tensor_name(name)
    assert found is None if problem is None else problem in (found or "")


def test_a_request_of_named_tensors_is_parsed_one_frame_each() -> None:
    arrays = text_arrays(3)
    request = parsed(arrays, timeout_ms=250.0)
    assert request.tensors is not None and [t.name for t in request.tensors] == ["input_ids", "attention_mask"]
    assert (request.dtype, request.shape, request.timeout_ms) == ("int64", (3, 4), 250.0)
    for tensor, array in zip(request.tensors, arrays.values(), strict=True):
        assert (tensor.dtype, tensor.shape, bytes(tensor.payload)) == ("int64", (3, 4), array.tobytes())
    payloads = check_tensors_against_model(request, TEXT, max_samples=8)
    assert [bytes(p) for p in payloads] == [array.tobytes() for array in arrays.values()]


def test_inputs_are_taken_in_the_models_order_whatever_the_requests() -> None:
    arrays = text_arrays()
    request = parsed({"attention_mask": arrays["attention_mask"], "input_ids": arrays["input_ids"]})
    payloads = check_tensors_against_model(request, TEXT, max_samples=8)
    assert bytes(payloads[0]) == arrays["input_ids"].tobytes()


def header(inputs: object, **extra: object) -> bytes:
    return json.dumps({"v": 2, "id": 9, "op": "infer", "inputs": inputs, **extra}).encode()


ONE = {"name": "x", "dtype": "float32", "shape": [1, 2]}
EIGHT_BYTES = b"\0" * 8


@pytest.mark.parametrize(
    ("frames", "message"),
    [
        ([header(None)], "needs 'inputs': an array of 1 to 32 objects"),
        ([header([])], "needs 'inputs'"),
        ([header([ONE] * (MAX_TENSORS + 1)), *[EIGHT_BYTES] * (MAX_TENSORS + 1)], "got 33 tensors"),
        ([header([ONE])], "'inputs' lists 1 tensors, but the message has 0 payload frames"),
        ([header([ONE]), EIGHT_BYTES, EIGHT_BYTES], "lists 1 tensors, but the message has 2 payload frames"),
        ([header([ONE, ONE]), EIGHT_BYTES, EIGHT_BYTES], "input 'x' is listed twice"),
        ([header(["x"]), EIGHT_BYTES], "'inputs'[0] must be an object"),
        ([header([{**ONE, "name": ""}]), EIGHT_BYTES], "'inputs'[0]: a tensor's 'name' has 0 characters"),
        ([header([{**ONE, "dtype": "complex64"}]), EIGHT_BYTES], "input 'x': unknown 'dtype' 'complex64'"),
        ([header([{**ONE, "shape": [1, 0]}]), EIGHT_BYTES], "input 'x': 'shape'[1] is 0"),
        ([header([ONE]), b"\0" * 4], "input 'x': its frame is 4 bytes; float32 of shape [1, 2] needs 8"),
        (
            [header([ONE, {**ONE, "name": "y", "shape": [2, 1]}]), EIGHT_BYTES, EIGHT_BYTES],
            "the inputs have different numbers of samples (x 1, y 2)",
        ),
        ([header([ONE], timeout_ms=-1), EIGHT_BYTES], "'timeout_ms' must be a positive number"),
    ],
)
def test_a_malformed_request_of_named_tensors_is_a_bad_request_saying_what_to_fix(
    frames: list[bytes], message: str
) -> None:
    error = refusal(frames)
    assert (error.code, error.request_id) == (ErrorCode.BAD_REQUEST, 9)
    assert message in error.message


def test_a_request_that_does_not_fit_the_models_inputs_says_which_and_how() -> None:
    arrays = text_arrays()
    cases = [
        ({**arrays, "token_type_ids": arrays["input_ids"]}, "unknown input 'token_type_ids'; the model takes "
         "input_ids, attention_mask"),
        ({"input_ids": arrays["input_ids"]}, "input 'attention_mask' is missing; the model takes input_ids, "
         "attention_mask, all of them"),
        ({**arrays, "attention_mask": arrays["attention_mask"].astype(np.int32)}, "input 'attention_mask': dtype "
         "is int32, but the model takes int64"),
        ({**arrays, "input_ids": np.zeros((2, 5), np.int64)}, "input 'input_ids': each sample has shape [5], but "
         "the model takes [4]"),
        ({**arrays, "attention_mask": np.full((2, 4), 2, np.int64)}, "input 'attention_mask''s values must lie in "
         "[0, 2)"),
    ]  # fmt: skip
    for given, message in cases:
        with pytest.raises(ProtocolError) as caught:
            check_tensors_against_model(parsed(given), TEXT, max_samples=8)
        assert caught.value.code == ErrorCode.BAD_REQUEST and message in caught.value.message, given
    with pytest.raises(ProtocolError) as caught:
        check_tensors_against_model(parsed(text_arrays(9)), TEXT, max_samples=8)
    assert caught.value.code == ErrorCode.TOO_LARGE


def test_a_version_1_request_to_a_model_of_several_inputs_is_told_to_name_them() -> None:
    request = InferRequest(3, "int64", (2, 4), np.zeros((2, 4), np.int64).tobytes())
    with pytest.raises(ProtocolError) as caught:
        check_tensors_against_model(request, TEXT, max_samples=8)
    assert caught.value.code == ErrorCode.BAD_REQUEST
    message = caught.value.message
    assert (
        "takes 2 inputs (input_ids, attention_mask), and one array was sent: pass a dict of arrays, one per "
        'input: input_ids, attention_mask (in Python, client.infer({"input_ids": ..., "attention_mask": ...}))'
        in message
    )
    assert 'a protocol client must send a version-2 request ("v": 2)' in message


def test_a_named_request_to_a_model_of_one_input_must_name_it() -> None:
    check_named_input(parsed({"input": np.zeros((1, 2), np.float32)}), "input")
    check_named_input(InferRequest(3, "float32", (1, 2), b"\0" * 8), "input")  # version 1 names none
    with pytest.raises(ProtocolError, match="the model takes one input, 'input'; got 'x'"):
        check_named_input(parsed({"x": np.zeros((1, 2), np.float32)}), "input")


def test_a_reply_of_several_named_outputs_reads_back_as_a_dict() -> None:
    scores = np.arange(6, dtype=np.float32).reshape(3, 2)
    count = np.array([[1], [2], [3]], dtype=np.int64)
    outputs = [Tensor("scores", "float32", scores.shape, scores.data.cast("B")),
               Tensor("count", "int64", count.shape, count.data.cast("B"))]  # fmt: skip
    frames = encode_tensors_result(5, outputs, 1.0, 2.0, 3.5, 1)
    assert json.loads(frames[0])["outputs"][1] == {"name": "count", "dtype": "int64", "shape": [3, 1]}
    head, result = decode_reply([bytes(frame) for frame in frames])
    assert head["v"] == 2 and head["timing"]["total_ms"] == 3.5
    answer = infer_result(head, result, 3)
    assert isinstance(answer, dict) and list(answer) == ["scores", "count"]
    np.testing.assert_array_equal(answer["scores"], scores)
    np.testing.assert_array_equal(answer["count"], count)
    one = encode_tensors_result(5, outputs[:1], 1.0, 2.0, 3.5, 1)
    head, result = decode_reply([bytes(frame) for frame in one])
    np.testing.assert_array_equal(infer_result(head, result, 3), scores)  # one output: its array, as version 1


def test_the_client_refuses_what_it_cannot_send_before_sending() -> None:
    with pytest.raises(ValueError, match="these differ: a 2, b 3; give every array the same number of samples"):
        encode_tensors_request(1, {"a": np.zeros((2, 1)), "b": np.zeros((3, 1))})
    # 1-D arrays, one sample's values each: told to add the samples axis.
    with pytest.raises(ValueError, match=r"these differ: x 8, y 6; the 1-D array\(s\) 'x', 'y' are read as that "
                       r"many samples of one value each; for one sample, add the samples axis: x\[None\] \(numpy\), "
                       r"shape \(1, 8\)"):  # fmt: skip
        encode_tensors_request(1, {"x": np.zeros(8), "y": np.zeros(6)})
    with pytest.raises(ValueError, match="give 1 to 32 named arrays, got 0"):
        encode_tensors_request(1, {})
    with pytest.raises(ValueError, match="printable ASCII"):
        encode_tensors_request(1, {"é": np.zeros((1, 1))})
