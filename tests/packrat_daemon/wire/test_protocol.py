"""Wire protocol v1: round trips for every dtype and every malformed message the server must reject."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import numpy as np
import pytest
import zmq

from packrat_daemon.wire.protocol import (
    DTYPES,
    MAX_HEADER_BYTES,
    PROTOCOL_VERSION,
    SUPPORTED_VERSIONS,
    ErrorCode,
    InferRequest,
    InfoRequest,
    ProtocolError,
    check_against_model,
    decode_reply,
    dtype_name,
    encode_error,
    encode_infer_request,
    encode_info,
    encode_info_request,
    encode_result,
    parse_request,
)

LIMIT = 1 << 20


def header(**fields: Any) -> bytes:
    base: dict[str, Any] = {"v": 1, "id": "r1", "op": "infer", "dtype": "float32", "shape": [2, 3]}
    base.update(fields)
    return json.dumps({k: v for k, v in base.items() if v is not ...}).encode()


PAYLOAD = bytes(2 * 3 * 4)


def parse_error(frames: list[Any], limit: int = LIMIT) -> ProtocolError:
    with pytest.raises(ProtocolError) as info:
        parse_request(frames, max_message_bytes=limit)
    return info.value


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


def test_zmq_frames_parse_without_copying_the_payload() -> None:
    frames = [zmq.Frame(bytes(f)) for f in encode_infer_request("x", np.ones((2, 3), np.float32))]
    _, req = parse_request(frames, max_message_bytes=LIMIT)
    assert isinstance(req, InferRequest) and isinstance(req.payload, memoryview)
    np.testing.assert_array_equal(np.frombuffer(req.payload, np.float32), np.ones(6))


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
        "versions": [1],
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


def test_req_delimiter_is_accepted_and_returned() -> None:
    delimiter, req = parse_request([b"", *encode_info_request(1)], max_message_bytes=LIMIT)
    assert delimiter == b"" and req == InfoRequest(1)
    head, _ = decode_reply([b"", *encode_error(1, ErrorCode.OVERLOADED, "busy")])
    assert head["error"]["code"] == "OVERLOADED"


def test_delimiter_is_reported_on_errors_too() -> None:
    assert parse_error([b"", b"not json"]).delimiter == b""
    assert parse_error([b"not json"]).delimiter is None


def test_unknown_header_fields_are_ignored() -> None:
    _, req = parse_request([header(trace="abc"), PAYLOAD], max_message_bytes=LIMIT)
    assert isinstance(req, InferRequest)


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


@pytest.mark.parametrize("request_id", [1.5, None, True, "x" * 129, 2**63, [1]])
def test_encode_rejects_bad_ids(request_id: Any) -> None:
    with pytest.raises(ValueError):
        encode_info_request(request_id)


# ------------------------------------------------------------------------------------ malformed requests


@pytest.mark.parametrize(
    ("frames", "fragment"),
    [
        ([], "empty message"),
        ([b""], "empty message"),
        ([b"{not json", PAYLOAD], "not valid JSON"),
        ([b'{"v":1,"id":"r1","op":"inf', PAYLOAD], "not valid JSON"),  # truncated header
        ([b"\xff\xfe{}", PAYLOAD], "UTF-8"),
        ([b"[1, 2]", PAYLOAD], "JSON object"),
        ([b'"infer"', PAYLOAD], "JSON object"),
        ([b"[" * 30000 + b"]" * 30000], "nested too deeply"),
        ([b'{"v":1,"id":"r1","op":"info","timeout_ms":NaN}'], "NaN"),
        ([header(id=...), PAYLOAD], "no 'id'"),
        ([header(id=1.5), PAYLOAD], "'id'"),
        ([header(id=None), PAYLOAD], "'id'"),
        ([header(id=True), PAYLOAD], "'id'"),
        ([header(id="x" * 129), PAYLOAD], "129 characters"),
        ([header(id=2**64), PAYLOAD], "64-bit"),
    ],
)
def test_requests_without_a_usable_id_are_bad_requests_with_no_id(frames: list[bytes], fragment: str) -> None:
    error = parse_error(frames)
    assert error.code is ErrorCode.BAD_REQUEST
    assert fragment in error.message
    assert error.request_id is None


@pytest.mark.parametrize(
    ("frames", "fragment"),
    [
        ([header(v=...), PAYLOAD], "no 'v'"),
        ([header(v="1"), PAYLOAD], "'v' must be an integer"),
        ([header(v=True), PAYLOAD], "'v' must be an integer"),
        ([header(op=...), PAYLOAD], "unknown 'op'"),
        ([header(op="train"), PAYLOAD], "unknown 'op'"),
        ([header(dtype=...), PAYLOAD], "unknown 'dtype'"),
        ([header(dtype="float128"), PAYLOAD], "unknown 'dtype'"),
        ([header(dtype=4), PAYLOAD], "unknown 'dtype'"),
        ([header(shape=...), PAYLOAD], "'shape' must be"),
        ([header(shape=[]), b""], "'shape' must be"),
        ([header(shape="2,3"), PAYLOAD], "'shape' must be"),
        ([header(shape=[2, -3]), PAYLOAD], "'shape'[1] is -3"),
        ([header(shape=[0, 3]), b""], "'shape'[0] is 0"),
        ([header(shape=[2, 0]), b""], "'shape'[1] is 0"),
        ([header(shape=[2, 3.0]), PAYLOAD], "'shape'[1] is 3.0"),
        ([header(shape=[2, "3"]), PAYLOAD], "'shape'[1]"),
        ([header(shape=[2, True]), PAYLOAD], "'shape'[1]"),
        ([header(shape=[1] * 33), b"\0\0\0\0"], "33 dimensions"),
        ([header(timeout_ms=0), PAYLOAD], "'timeout_ms'"),
        ([header(timeout_ms=-5), PAYLOAD], "'timeout_ms'"),
        ([header(timeout_ms="5"), PAYLOAD], "'timeout_ms'"),
        ([header(timeout_ms=True), PAYLOAD], "'timeout_ms'"),
        ([header(), PAYLOAD[:-1]], "payload is 23 bytes"),  # truncated payload
        ([header(), PAYLOAD + b"\0"], "payload is 25 bytes"),
        ([header(), b""], "payload is 0 bytes"),
        ([header()], "needs a payload frame"),
        ([header(), PAYLOAD, b"extra"], "3 frames"),
        ([header(), PAYLOAD, b"", b""], "4 frames"),
        ([header(op="info"), PAYLOAD], "drop the payload"),
    ],
)
def test_malformed_requests_are_bad_requests_with_their_id(frames: list[bytes], fragment: str) -> None:
    error = parse_error(frames)
    assert error.code is ErrorCode.BAD_REQUEST, error
    assert fragment in error.message
    assert error.request_id == "r1"


def test_frames_may_be_memoryviews_of_any_format() -> None:
    array = np.ones((2, 3), np.float32)
    _, req = parse_request([memoryview(header()), memoryview(array)], max_message_bytes=LIMIT)
    assert isinstance(req, InferRequest) and len(req.payload) == 24


def test_header_over_the_limit_is_too_large() -> None:
    big = header(pad="x" * MAX_HEADER_BYTES)
    error = parse_error([big, PAYLOAD])
    assert error.code is ErrorCode.TOO_LARGE and str(MAX_HEADER_BYTES) in error.message


def test_header_at_the_limit_is_accepted() -> None:
    base = header(pad="")
    exact = header(pad="x" * (MAX_HEADER_BYTES - len(base)))
    assert len(exact) == MAX_HEADER_BYTES
    _, req = parse_request([exact, PAYLOAD], max_message_bytes=LIMIT)
    assert isinstance(req, InferRequest)


def test_message_over_the_server_limit_is_too_large_with_id() -> None:
    frames = [header(shape=[1000, 3]), bytes(12000)]
    error = parse_error(frames, limit=10000)
    assert (error.code, error.request_id) == (ErrorCode.TOO_LARGE, "r1")
    parse_request(frames, max_message_bytes=20000)


@pytest.mark.parametrize("version", [0, 2, 99])
def test_unknown_version_is_unsupported_and_the_reply_lists_versions(version: int) -> None:
    # Anything else in a future version's header may differ; only the version is looked at.
    error = parse_error([json.dumps({"v": version, "id": 9, "op": "whatever"}).encode()])
    assert (error.code, error.request_id) == (ErrorCode.UNSUPPORTED_VERSION, 9)
    head, _ = decode_reply(encode_error(error.request_id, error.code, error.message))
    assert head["versions"] == list(SUPPORTED_VERSIONS) == [PROTOCOL_VERSION]
    assert head["error"]["code"] == "UNSUPPORTED_VERSION"


# ----------------------------------------------------------------------------------- model-level checks


def infer_request(dtype: str = "float32", shape: tuple[int, ...] = (4, 3, 8)) -> InferRequest:
    return InferRequest("m", dtype, shape, b"", None)


def test_check_against_model_accepts_a_matching_request() -> None:
    check_against_model(infer_request(), "float32", (3, 8), max_samples=4)
    check_against_model(infer_request(shape=(1, 3, 77)), "float32", (3, -1), max_samples=4)


@pytest.mark.parametrize(
    ("req", "fragment"),
    [
        (infer_request(dtype="float64"), "dtype is float64, but the model takes float32"),
        (infer_request(shape=(4, 8, 3)), "each sample has shape [8, 3], but the model takes [3, 8]"),
        (infer_request(shape=(4, 3, 8, 1)), "but the model takes [3, 8]"),
        (infer_request(shape=(4,)), "each sample has shape []"),
        (infer_request(shape=(5, 3, 8)), "5 samples in one request; this server takes at most 4"),
    ],
)
def test_check_against_model_rejects_with_what_was_expected(req: InferRequest, fragment: str) -> None:
    with pytest.raises(ProtocolError) as info:
        check_against_model(req, "float32", (3, 8), max_samples=4)
    assert info.value.code is ErrorCode.BAD_REQUEST and info.value.request_id == "m"
    assert fragment in info.value.message


# --------------------------------------------------------------------------------------- reply decoding


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


def test_protocol_and_client_do_not_import_torch() -> None:
    code = (
        "import sys, packrat_daemon.wire.protocol, packrat_daemon.wire.client; "
        "assert 'torch' not in sys.modules, 'torch was imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


# -- the fast path for well-formed infer requests must agree with the full parser ----------------
FAST_PATH_HEADERS = [
    ({"v": 1, "id": 7, "op": "infer", "dtype": "float32", "shape": [2, 3]}, True),
    ({"v": 1, "id": "req-1", "op": "infer", "dtype": "float32", "shape": [2, 3], "timeout_ms": 250}, True),
    ({"v": 1, "id": 7, "op": "infer", "dtype": "float32", "shape": [2, 3], "timeout_ms": 0.5, "x": [1]}, True),
    ({"v": 1, "id": True, "op": "infer", "dtype": "float32", "shape": [2, 3]}, False),
    ({"v": 1, "id": 2**63, "op": "infer", "dtype": "float32", "shape": [2, 3]}, False),
    ({"v": 1, "id": "x" * 200, "op": "infer", "dtype": "float32", "shape": [2, 3]}, False),
    ({"v": True, "id": 7, "op": "infer", "dtype": "float32", "shape": [2, 3]}, False),
    ({"v": 2, "id": 7, "op": "infer", "dtype": "float32", "shape": [2, 3]}, False),
    ({"v": 1, "id": 7, "op": "info", "dtype": "float32", "shape": [2, 3]}, False),
    ({"v": 1, "id": 7, "op": "infer", "dtype": ["float32"], "shape": [2, 3]}, False),
    ({"v": 1, "id": 7, "op": "infer", "dtype": "complex64", "shape": [2, 3]}, False),
    ({"v": 1, "id": 7, "op": "infer", "dtype": "float32", "shape": [2, True, 3]}, False),
    ({"v": 1, "id": 7, "op": "infer", "dtype": "float32", "shape": [6, 0]}, False),
    ({"v": 1, "id": 7, "op": "infer", "dtype": "float32", "shape": [3, 3]}, False),
    ({"v": 1, "id": 7, "op": "infer", "dtype": "float32", "shape": [2, 3], "timeout_ms": True}, False),
    ({"v": 1, "id": 7, "op": "infer", "dtype": "float32", "shape": [2, 3], "timeout_ms": -1}, False),
    ({"v": 1, "id": "é", "op": "infer", "dtype": "float32", "shape": [2, 3]}, False),
    ({"id": 7, "op": "infer", "dtype": "float32", "shape": [2, 3]}, False),
]


@pytest.mark.parametrize(("header", "fast"), FAST_PATH_HEADERS)
def test_the_fast_path_takes_only_what_the_full_parser_accepts_and_agrees_with_it(header: dict, fast: bool) -> None:
    from packrat_daemon.wire import protocol

    raw = json.dumps(header, ensure_ascii=False).encode()
    payload = np.arange(6, dtype=np.float32).tobytes()
    quick = protocol._well_formed_infer(raw, zmq.Frame(payload), 10**6)
    assert (quick is not None) == fast
    try:
        _, full = parse_request([raw, payload], max_message_bytes=10**6)  # bytes frames: the full parser
    except ProtocolError:
        full = None
    if quick is not None:
        assert full is not None
        assert quick[:3] == full[:3] and quick.timeout_ms == full.timeout_ms
        assert bytes(quick.payload) == bytes(full.payload)
    if full is not None:  # as the daemon receives them: ZeroMQ frames, through whichever path
        _, received = parse_request([zmq.Frame(raw), zmq.Frame(payload)], max_message_bytes=10**6)
        assert received[:3] == full[:3] and received.timeout_ms == full.timeout_ms


def test_the_fast_path_respects_the_message_size_limit() -> None:
    from packrat_daemon.wire import protocol

    raw = json.dumps({"v": 1, "id": 7, "op": "infer", "dtype": "float32", "shape": [2, 3]}).encode()
    payload = zmq.Frame(np.zeros(6, dtype=np.float32).tobytes())
    assert protocol._well_formed_infer(raw, payload, len(raw) + 24) is not None
    assert protocol._well_formed_infer(raw, payload, len(raw) + 23) is None
    with pytest.raises(ProtocolError) as caught:
        parse_request([zmq.Frame(raw), payload], max_message_bytes=len(raw) + 23)
    assert caught.value.code == ErrorCode.TOO_LARGE


@pytest.mark.parametrize("request_id", [7, 'req-"7"'])
def test_a_timed_result_reads_back_with_its_timing(request_id: int | str) -> None:
    from packrat_daemon.wire.protocol import encode_timed_result

    rows = np.arange(6, dtype=np.float32).reshape(2, 3)
    frames = encode_timed_result(request_id, "float32", rows.shape, rows, 0.01234, 12.5, 13.0, 2)
    header, array = decode_reply([frames[0], rows.tobytes()])
    assert header["id"] == request_id and header["ok"] is True
    assert header["timing"] == {"queue_ms": 0.012, "compute_ms": 12.5, "total_ms": 13.0, "instances": 2}
    np.testing.assert_array_equal(array, rows)


def test_a_timed_result_refuses_a_time_that_is_not_a_number() -> None:
    from packrat_daemon.wire.protocol import encode_timed_result

    with pytest.raises(ValueError, match="JSON"):
        encode_timed_result(7, "float32", (1,), b"\0" * 4, float("nan"), 1.0, 1.0, 1)
