"""The frontend's side of named tensors: a request of several inputs checked and packed into records in the
model's order, a model's records of several outputs unpacked into named frames (version 2) or its first output
(version 1), and what `info` says of them."""

from __future__ import annotations

import json

import numpy as np
import pytest

from packrat_daemon.requests.batcher import Request
from packrat_daemon.requests.jobs import Completed
from packrat_daemon.requests.tensors import ModelTensors
from packrat_daemon.wire.client_side import decode_reply, encode_tensors_request
from packrat_daemon.wire.codec import ProtocolError, pack_records, unpack_records
from packrat_daemon.wire.server_side import InferRequest, parse_request
from workers.models.spec import InputSpec, TensorSpec

INPUTS = [TensorSpec("x", "float32", (2,)), TensorSpec("mask", "int64", (2,), high=2)]
OUTPUTS = [TensorSpec("scores", "float32", (3,)), TensorSpec("count", "int64", (1,))]
SPEC = InputSpec.of(INPUTS, OUTPUTS)


def parsed(arrays: dict[str, np.ndarray]) -> InferRequest:
    _, request = parse_request(encode_tensors_request(7, arrays), max_message_bytes=1 << 20)
    assert isinstance(request, InferRequest)
    return request


def answered(named: bool, output: np.ndarray) -> tuple[dict, list[bytes]]:
    request = Request(b"c", None, 7, "uint8", (output.shape[0], SPEC.shape[0]), b"", named=named)
    frames = ModelTensors(SPEC).reply(Completed(request, output, 0.5, 2.0, []), named, 3.0)
    header = json.loads(bytes(frames[0]))
    return header, [bytes(frame) for frame in frames[1:]]


def test_a_request_of_several_inputs_is_packed_into_records_in_the_models_order() -> None:
    x = np.arange(6, dtype=np.float32).reshape(3, 2)
    mask = np.array([[1, 0], [0, 1], [1, 1]], dtype=np.int64)
    packed = ModelTensors(SPEC).checked(parsed({"mask": mask, "x": x}), max_samples=4)
    assert (packed.dtype, packed.shape, packed.tensors) == ("uint8", (3, 2 * 4 + 2 * 8), None)
    rows = np.frombuffer(packed.payload, np.uint8).reshape(packed.shape)
    back = unpack_records(rows, [(t.dtype, t.shape) for t in INPUTS])
    np.testing.assert_array_equal(back[0], x)
    np.testing.assert_array_equal(back[1], mask)


def test_a_request_that_does_not_fit_is_refused_before_it_is_packed() -> None:
    tensors = ModelTensors(SPEC)
    with pytest.raises(ProtocolError, match="input 'mask' is missing"):
        tensors.checked(parsed({"x": np.zeros((1, 2), np.float32)}), max_samples=4)
    with pytest.raises(ProtocolError, match="send a version-2 request"):
        tensors.checked(InferRequest(7, "float32", (1, 2), b"\0" * 8), max_samples=4)


def test_records_of_several_outputs_are_answered_by_name_or_their_first_alone() -> None:
    scores = np.arange(6, dtype=np.float32).reshape(2, 3)
    count = np.array([[4], [5]], dtype=np.int64)
    header, frames = answered(True, pack_records([scores, count]))
    assert [(o["name"], o["dtype"], o["shape"]) for o in header["outputs"]] == [
        ("scores", "float32", [2, 3]),
        ("count", "int64", [2, 1]),
    ]
    assert frames == [scores.tobytes(), count.tobytes()]
    head, result = decode_reply([json.dumps(header).encode(), *frames])
    assert isinstance(result, dict) and head["timing"]["queue_ms"] == 0.5
    header, frames = answered(False, pack_records([scores, count]))  # version 1: the first output, as always
    assert (header["v"], header["dtype"], header["shape"], frames) == (1, "float32", [2, 3], [scores.tobytes()])


def test_info_lists_every_input_and_output_and_input_repeats_the_first() -> None:
    described = ModelTensors(SPEC).describe()
    assert [t["name"] for t in described["inputs"]] == ["x", "mask"]
    assert described["outputs"][1] == {"name": "count", "dtype": "int64", "shape": [1]}
    assert described["input"] == {"dtype": "float32", "shape": [2], "high": None}
    one = ModelTensors(InputSpec("float32", (16,))).describe()
    assert one == {"inputs": [{"name": "input", "dtype": "float32", "shape": [16], "high": None}],
                   "outputs": [{"name": "output"}]}  # fmt: skip
