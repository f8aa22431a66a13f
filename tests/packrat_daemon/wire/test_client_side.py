"""The client side of protocol v1: requests it encodes parse on the server, replies the server encodes
decode here (every dtype, both directions), and what it refuses to send or to read."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
import zmq

from packrat_daemon.wire.client_side import decode_reply, dtype_name, encode_infer_request, encode_info_request
from packrat_daemon.wire.codec import DTYPES, ErrorCode, ProtocolError
from packrat_daemon.wire.server_replies import encode_error, encode_info, encode_result
from packrat_daemon.wire.server_side import InferRequest, InfoRequest, parse_request

LIMIT = 1 << 20


def sample(name: str) -> np.ndarray:
    rng = np.random.default_rng(0)
    if name == "bool":
        return rng.random((3, 2, 4)) > 0.5
    if name == "bfloat16":
        return rng.integers(0, 2**16, size=(3, 2, 4), dtype=np.uint16)
    return (rng.random((3, 2, 4)) * 100 - 50).astype(DTYPES[name])


# ----------------------------------------------------------------------------------------- round trips


@pytest.mark.parametrize("name", list(DTYPES))
def test_infer_request_round_trip_every_dtype(name: str) -> None:
    array = sample(name)
    frames = encode_infer_request(7, array, timeout_ms=250, dtype=name)
    assert isinstance(frames[1], memoryview)
    delimiter, req = parse_request(frames, max_message_bytes=LIMIT)
    assert delimiter is None
    assert isinstance(req, InferRequest)
    assert (req.request_id, req.dtype, req.shape, req.timeout_ms) == (7, name, (3, 2, 4), 250.0)
    back = np.frombuffer(req.payload, dtype=DTYPES[name]).reshape(req.shape)
    np.testing.assert_array_equal(back, array)


@pytest.mark.parametrize("name", list(DTYPES))
def test_result_round_trip_every_dtype(name: str) -> None:
    array = sample(name)
    timing = {"queue_ms": 0.5, "compute_ms": 3.25, "total_ms": 3.75}
    frames = encode_result("abc", name, array.shape, memoryview(array.reshape(-1).view(np.uint8)), timing)
    head, result = decode_reply([zmq.Frame(bytes(f)) for f in frames])
    assert head == {"v": 1, "id": "abc", "ok": True, "dtype": name, "shape": [3, 2, 4], "timing": timing}
    assert result is not None and result.dtype == DTYPES[name]
    np.testing.assert_array_equal(result, array)


def test_big_endian_and_non_contiguous_arrays_are_sent_as_little_endian_c_order() -> None:
    array = np.arange(12, dtype=">f4").reshape(3, 4)[:, ::2]
    frames = encode_infer_request(1, array)
    _, req = parse_request(frames, max_message_bytes=LIMIT)
    assert isinstance(req, InferRequest)
    assert (req.dtype, req.shape) == ("float32", (3, 2))
    assert bytes(req.payload) == np.array([[0, 2], [4, 6], [8, 10]], dtype="<f4").tobytes()


def test_no_timeout_is_left_out_and_parses_as_none() -> None:
    frames = encode_infer_request(1, np.zeros((1, 2), np.int8))
    assert "timeout_ms" not in json.loads(frames[0])
    _, req = parse_request(frames, max_message_bytes=LIMIT)
    assert isinstance(req, InferRequest) and req.timeout_ms is None


def test_info_request_and_reply_round_trip() -> None:
    _, req = parse_request(encode_info_request("q"), max_message_bytes=LIMIT)
    assert req == InfoRequest("q")
    info = {
        "model": "resnet50",
        "input": {"dtype": "float32", "shape": [3, 224, 224]},
        "max_batch": np.int64(64),
        "plan": {"instances": [(4, np.int32(16))]},
    }
    head, result = decode_reply(encode_info("q", info))
    assert result is None
    assert head == {
        "v": 1,
        "id": "q",
        "ok": True,
        "versions": [1, 2],
        "model": "resnet50",
        "input": {"dtype": "float32", "shape": [3, 224, 224]},
        "max_batch": 64,
        "plan": {"instances": [[4, 16]]},
    }


@pytest.mark.parametrize("code", list(ErrorCode))
def test_error_reply_round_trip(code: ErrorCode) -> None:
    frames = encode_error(5, code, "what went wrong")
    assert len(frames) == 1
    head, result = decode_reply(frames)
    assert result is None
    assert head["ok"] is False and head["id"] == 5
    assert head["error"] == {"code": code.value, "message": "what went wrong"}
    assert ("versions" in head) == (code is ErrorCode.UNSUPPORTED_VERSION)


def test_error_reply_may_have_null_id() -> None:
    head, _ = decode_reply(encode_error(None, ErrorCode.BAD_REQUEST, "no id"))
    assert head["id"] is None


# ------------------------------------------------------------------------------ what it will not send


def test_dtype_name() -> None:
    assert dtype_name(np.float32) == "float32"
    assert dtype_name(np.dtype(">i8")) == "int64"
    assert dtype_name(bool) == "bool"
    for unsupported in (np.uint16, np.complex64, np.uint32, "U3", object):
        with pytest.raises(ValueError, match="cannot be sent"):
            dtype_name(unsupported)


@pytest.mark.parametrize(
    ("array", "kwargs"),
    [
        (np.float32(1.0), {}),
        (np.zeros((0, 3), np.float32), {}),
        (np.zeros((2, 0), np.float32), {}),
        (np.zeros(2, np.complex64), {}),
        (np.zeros(2, np.float32), {"dtype": "int32"}),
        (np.zeros(2, np.float32), {"dtype": "bfloat16"}),
        (np.zeros(2, np.float32), {"dtype": "float128"}),
    ],
)
def test_encode_rejects_arrays_the_protocol_cannot_carry(array: np.ndarray, kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        encode_infer_request(1, array, **kwargs)


@pytest.mark.parametrize("request_id", [1.5, None, True, "x" * 129, 2**63, [1], "\ud800"])
def test_encode_rejects_bad_ids(request_id: Any) -> None:
    with pytest.raises(ValueError):
        encode_info_request(request_id)


# ------------------------------------------------------------------------------ what it will not read


@pytest.mark.parametrize(
    "frames",
    [
        [],
        [b"nope"],
        [b"[]"],
        [b'{"v":1,"id":1}'],
        [b'{"v":1,"id":1,"ok":"yes"}'],
        [b'{"v":1,"id":[1],"ok":true}'],
        [b'{"v":1,"id":1,"ok":false}'],
        [b'{"v":1,"id":1,"ok":false,"error":{"code":"X"}}'],
        [b'{"v":1,"id":1,"ok":false,"error":{"code":"X","message":"m"}}', b"payload"],
        [b'{"v":1,"id":1,"ok":true}', b"payload"],
        [b'{"v":1,"id":1,"ok":true,"dtype":"float32","shape":[2]}'],
        [b'{"v":1,"id":1,"ok":true,"dtype":"float32","shape":[2]}', bytes(7)],
        [b'{"v":1,"id":1,"ok":true,"dtype":"complex","shape":[2]}', bytes(8)],
        [b'{"v":1,"id":1,"ok":true,"dtype":"float32","shape":[-2]}', bytes(8)],
        [b'{"v":1,"id":1,"ok":true}', b"a", b"b"],
    ],
)
def test_malformed_replies_raise(frames: list[bytes]) -> None:
    with pytest.raises(ProtocolError) as info:
        decode_reply(frames)
    assert info.value.code is ErrorCode.INTERNAL
