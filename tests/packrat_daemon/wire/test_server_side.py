"""The server side of protocol v1: every malformed message gets a typed error with the request's id when
it can be read, the fast path for infer requests agrees with the full parser, and replies encode.
Over 400 lines: the parser's rules are tested in one place, beside the generated cases."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
import zmq
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from packrat_daemon.wire.client_side import decode_reply, encode_infer_request, encode_info_request
from packrat_daemon.wire.codec import (
    DTYPES,
    MAX_HEADER_BYTES,
    PROTOCOL_VERSION,
    SUPPORTED_VERSIONS,
    ErrorCode,
    ProtocolError,
)
from packrat_daemon.wire.model_checks import check_against_model, request_length
from packrat_daemon.wire.server_replies import encode_error, encode_info, encode_timed_result
from packrat_daemon.wire.server_side import InferRequest, InfoRequest, _well_formed_infer, parse_request

LIMIT = 1 << 20
PAYLOAD = bytes(2 * 3 * 4)


def header(**fields: Any) -> bytes:
    base: dict[str, Any] = {"v": 1, "id": "r1", "op": "infer", "dtype": "float32", "shape": [2, 3]}
    base.update(fields)
    return json.dumps({k: v for k, v in base.items() if v is not ...}).encode()


def parse_error(frames: list[Any], limit: int = LIMIT) -> ProtocolError:
    with pytest.raises(ProtocolError) as info:
        parse_request(frames, max_message_bytes=limit)
    return info.value


def test_zmq_frames_parse_without_copying_the_payload() -> None:
    frames = [zmq.Frame(bytes(f)) for f in encode_infer_request("x", np.ones((2, 3), np.float32))]
    _, req = parse_request(frames, max_message_bytes=LIMIT)
    assert isinstance(req, InferRequest) and isinstance(req.payload, memoryview)
    np.testing.assert_array_equal(np.frombuffer(req.payload, np.float32), np.ones(6))


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


def test_frames_may_be_memoryviews_of_any_format() -> None:
    array = np.ones((2, 3), np.float32)
    _, req = parse_request([memoryview(header()), memoryview(array)], max_message_bytes=LIMIT)
    assert isinstance(req, InferRequest) and len(req.payload) == 24


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
        ([header(id="\ud800"), PAYLOAD], "lone surrogate"),
        ([b'{"v":1,"id":"\\ud800","op":"info"}'], "lone surrogate"),
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
        ([header(timeout_ms=10**400), PAYLOAD], "'timeout_ms'"),
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


@pytest.mark.parametrize("version", [0, 3, 99])
def test_unknown_version_is_unsupported_and_the_reply_lists_versions(version: int) -> None:
    # Anything else in a future version's header may differ; only the version is looked at.
    error = parse_error([json.dumps({"v": version, "id": 9, "op": "whatever"}).encode()])
    assert (error.code, error.request_id) == (ErrorCode.UNSUPPORTED_VERSION, 9)
    head, _ = decode_reply(encode_error(error.request_id, error.code, error.message))
    assert head["versions"] == list(SUPPORTED_VERSIONS) == [PROTOCOL_VERSION, 2]
    assert head["error"]["code"] == "UNSUPPORTED_VERSION"


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
    ],
)
def test_check_against_model_rejects_with_what_was_expected(req: InferRequest, fragment: str) -> None:
    with pytest.raises(ProtocolError) as info:
        check_against_model(req, "float32", (3, 8), max_samples=4)
    assert info.value.code is ErrorCode.BAD_REQUEST and info.value.request_id == "m"
    assert fragment in info.value.message


def test_too_many_samples_is_too_large_whatever_the_sample_size() -> None:
    # The byte limit answers TOO_LARGE; more samples than max_batch must get the same code (spec defect).
    with pytest.raises(ProtocolError) as info:
        check_against_model(infer_request(shape=(5, 3, 8)), "float32", (3, 8), max_samples=4)
    assert info.value.code is ErrorCode.TOO_LARGE and info.value.request_id == "m"
    assert "5 samples in one request; this server takes at most 4" in info.value.message


def test_the_fast_path_respects_the_message_size_limit() -> None:
    raw = json.dumps({"v": 1, "id": 7, "op": "infer", "dtype": "float32", "shape": [2, 3]}).encode()
    payload = zmq.Frame(np.zeros(6, dtype=np.float32).tobytes())
    assert _well_formed_infer(raw, payload, len(raw) + 24) is not None
    assert _well_formed_infer(raw, payload, len(raw) + 23) is None
    with pytest.raises(ProtocolError) as caught:
        parse_request([zmq.Frame(raw), payload], max_message_bytes=len(raw) + 23)
    assert caught.value.code == ErrorCode.TOO_LARGE


@pytest.mark.parametrize("request_id", [7, 'req-"7"'])
def test_a_timed_result_reads_back_with_its_timing(request_id: int | str) -> None:
    rows = np.arange(6, dtype=np.float32).reshape(2, 3)
    frames = encode_timed_result(request_id, "float32", rows.shape, rows, 0.01234, 12.5, 13.0, 2)
    header, array = decode_reply([frames[0], rows.tobytes()])
    assert header["id"] == request_id and header["ok"] is True
    assert header["timing"] == {"queue_ms": 0.012, "compute_ms": 12.5, "total_ms": 13.0, "instances": 2}
    np.testing.assert_array_equal(array, rows)


def test_a_timed_result_refuses_a_time_that_is_not_a_number() -> None:
    with pytest.raises(ValueError, match="JSON"):
        encode_timed_result(7, "float32", (1,), b"\0" * 4, float("nan"), 1.0, 1.0, 1)


# ------------------------------------------------------------------ crashers: a typed reply, never an exception


@pytest.mark.parametrize(
    "frames",
    [
        [b'{"v":1,"id":"\\ud800","op":"info"}'],  # info
        [b"", b'{"v":1,"id":"\\ud800","op":"info"}'],  # info over REQ
        [b'{"v":1,"id":"\\ud800","op":"infer","dtype":"float32","shape":[2,3]}', PAYLOAD],  # infer
        [b"", b'{"v":1,"id":"a\\udc00b","op":"infer","dtype":"float32","shape":[2,3]}', PAYLOAD],  # over REQ
    ],
)
@pytest.mark.parametrize("as_zmq_frames", [True, False], ids=["zmq-frames", "bytes"])
def test_a_lone_surrogate_id_is_a_bad_request_that_can_be_answered(frames: list[bytes], as_zmq_frames: bool) -> None:
    error = parse_error([zmq.Frame(f) for f in frames] if as_zmq_frames else frames)
    delimiter = b"" if frames[0] == b"" else None
    assert (error.code, error.request_id, error.delimiter) == (ErrorCode.BAD_REQUEST, None, delimiter)
    head, _ = decode_reply(encode_error(error.request_id, error.code, error.message))
    assert head["id"] is None and "surrogate" in head["error"]["message"]


@pytest.mark.parametrize("timeout", ["1" + "0" * 400, "-" + "9" * 400, "1e400", "2e308"])
@pytest.mark.parametrize("as_zmq_frames", [True, False], ids=["zmq-frames", "bytes"])
def test_a_timeout_beyond_every_double_is_a_bad_request(timeout: str, as_zmq_frames: bool) -> None:
    raw = b'{"v":1,"id":"r1","op":"infer","dtype":"float32","shape":[2,3],"timeout_ms":%s}' % timeout.encode()
    assert _well_formed_infer(raw, zmq.Frame(PAYLOAD), LIMIT) is None
    error = parse_error([zmq.Frame(raw), zmq.Frame(PAYLOAD)] if as_zmq_frames else [raw, PAYLOAD])
    assert (error.code, error.request_id) == (ErrorCode.BAD_REQUEST, "r1")
    assert "'timeout_ms'" in error.message and len(error.message) < 200


def test_timeout_ms_is_bounded_by_the_documented_limit() -> None:
    _, req = parse_request([header(timeout_ms=2**31 - 1), PAYLOAD], max_message_bytes=LIMIT)
    assert isinstance(req, InferRequest) and req.timeout_ms == 2**31 - 1
    for beyond in (2**31, 2**31 - 0.5 + 1, 1.7976931348623157e308):
        with pytest.raises(ProtocolError, match="no larger than 2147483647") as info:
            parse_request([header(timeout_ms=beyond), PAYLOAD], max_message_bytes=LIMIT)
        assert info.value.code is ErrorCode.BAD_REQUEST and info.value.request_id == "r1"


# ------------------------------------------- the fast path must agree with the full parser, case by case


def assert_fast_path_agrees(raw: bytes, payload: bytes, limit: int) -> InferRequest | None:
    """Run one two-frame message through the fast path and through the full parser; fail on any
    disagreement. Returns what the fast path took, if anything."""
    quick = _well_formed_infer(raw, zmq.Frame(payload), limit)  # never raises
    try:
        _, full = parse_request([raw, payload], max_message_bytes=limit)  # bytes frames: the full parser only
    except ProtocolError as exc:
        assert quick is None, f"the fast path took what the full parser refuses: {exc}"
        encode_error(exc.request_id, exc.code, exc.message)  # the frontend answers every refusal
        failure: ProtocolError | None = exc
    else:
        failure = None
        encode_error(full.request_id, ErrorCode.TIMEOUT, "any reply can echo the id")
        if quick is not None:
            assert isinstance(full, InferRequest)
            assert quick[:3] == full[:3] and type(quick.request_id) is type(full.request_id)
            assert quick.timeout_ms == full.timeout_ms and bytes(quick.payload) == bytes(full.payload)
        elif isinstance(full, InferRequest):
            # Only headers the one-piece scan cannot measure in bytes go the long way when valid.
            assert not raw.isascii() or raw != raw.strip(), "the fast path refused a compact valid request"
    # As the daemon receives messages: ZeroMQ frames, through whichever path takes them.
    try:
        _, received = parse_request([zmq.Frame(raw), zmq.Frame(payload)], max_message_bytes=limit)
    except ProtocolError as exc:
        assert failure is not None and (exc.code, exc.request_id, exc.message) == (
            failure.code,
            failure.request_id,
            failure.message,
        )
    else:
        assert failure is None and received[:3] == full[:3]
    return quick


FAST_PATH_HEADERS = [
    ({"v": 1, "id": 7, "op": "infer", "dtype": "float32", "shape": [2, 3]}, True),
    ({"v": 1, "id": "req-1", "op": "infer", "dtype": "float32", "shape": [2, 3], "timeout_ms": 250}, True),
    ({"v": 1, "id": 7, "op": "infer", "dtype": "float32", "shape": [2, 3], "timeout_ms": 0.5, "x": [1]}, True),
    ({"v": 1, "id": True, "op": "infer", "dtype": "float32", "shape": [2, 3]}, False),
    ({"v": 1, "id": 2**63, "op": "infer", "dtype": "float32", "shape": [2, 3]}, False),
    ({"v": 1, "id": "x" * 200, "op": "infer", "dtype": "float32", "shape": [2, 3]}, False),
    ({"v": 1, "id": "\ud800", "op": "infer", "dtype": "float32", "shape": [2, 3]}, False),
    ({"v": True, "id": 7, "op": "infer", "dtype": "float32", "shape": [2, 3]}, False),
    ({"v": 1.0, "id": 7, "op": "infer", "dtype": "float32", "shape": [2, 3]}, False),
    ({"v": 2, "id": 7, "op": "infer", "dtype": "float32", "shape": [2, 3]}, False),
    ({"v": 1, "id": 7, "op": "info", "dtype": "float32", "shape": [2, 3]}, False),
    ({"v": 1, "id": 7, "op": "infer", "dtype": ["float32"], "shape": [2, 3]}, False),
    ({"v": 1, "id": 7, "op": "infer", "dtype": "complex64", "shape": [2, 3]}, False),
    ({"v": 1, "id": 7, "op": "infer", "dtype": "float32", "shape": [2, True, 3]}, False),
    ({"v": 1, "id": 7, "op": "infer", "dtype": "float32", "shape": [6, 0]}, False),
    ({"v": 1, "id": 7, "op": "infer", "dtype": "float32", "shape": [3, 3]}, False),
    ({"v": 1, "id": 7, "op": "infer", "dtype": "float32", "shape": [2, 3], "timeout_ms": True}, False),
    ({"v": 1, "id": 7, "op": "infer", "dtype": "float32", "shape": [2, 3], "timeout_ms": -1}, False),
    ({"v": 1, "id": 7, "op": "infer", "dtype": "float32", "shape": [2, 3], "timeout_ms": 10**400}, False),
    ({"v": 1, "id": "é", "op": "infer", "dtype": "float32", "shape": [2, 3]}, False),
    ({"id": 7, "op": "infer", "dtype": "float32", "shape": [2, 3]}, False),
]


@pytest.mark.parametrize(("header", "fast"), FAST_PATH_HEADERS)
def test_the_fast_path_takes_only_what_the_full_parser_accepts_and_agrees_with_it(header: dict, fast: bool) -> None:
    raw = json.dumps(header, ensure_ascii=False).encode("utf-8", "surrogatepass")
    quick = assert_fast_path_agrees(raw, np.arange(6, dtype=np.float32).tobytes(), 10**6)
    assert (quick is not None) == fast


# Odd JSON values for any field.
ODD = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(),  # NaN and infinities too: json.dumps writes them, and both parsers must refuse them
    st.sampled_from([10**400, -(10**400), 2**63, -(2**63) - 1, 2**64]),
    st.text(max_size=4),
    st.lists(st.integers(0, 3), max_size=3),
    st.dictionaries(st.text(max_size=2), st.integers(), max_size=2),
)
# Per field: (valid values, values near the edge or of the wrong kind).
FIELDS: dict[str, tuple[st.SearchStrategy[Any], st.SearchStrategy[Any]]] = {
    "v": (st.sampled_from(SUPPORTED_VERSIONS), st.one_of(st.sampled_from([0, 3, 1.0, True, "1"]), ODD)),
    "id": (
        st.one_of(st.integers(-(2**63), 2**63 - 1), st.text(max_size=128)),
        st.one_of(
            st.sampled_from([2**63, -(2**63) - 1, "x" * 129, 1.0]),
            st.text(st.characters(min_codepoint=0xD7F0, max_codepoint=0xE010), min_size=1, max_size=3),
            ODD,
        ),
    ),
    "op": (st.just("infer"), st.one_of(st.sampled_from(["info", "Infer", "infer "]), ODD)),
    "dtype": (st.sampled_from(list(DTYPES)), st.one_of(st.sampled_from(["float128", "Float32"]), ODD)),
    "shape": (
        st.lists(st.integers(1, 3), min_size=1, max_size=4),
        st.one_of(
            st.lists(st.one_of(st.integers(-1, 3), st.sampled_from([True, 2.0, "2", None, 10**400])), max_size=5),
            st.lists(st.just(1), min_size=32, max_size=34),
            ODD,
        ),
    ),
    "timeout_ms": (
        st.one_of(
            st.none(), st.floats(min_value=1e-3, max_value=1e9), st.integers(1, 10**6), st.just(1.7976931348623157e308)
        ),
        st.one_of(st.sampled_from([0, -1, 0.0, 10**400, True, "5"]), ODD),
    ),
    "trace": (ODD, ODD),  # a field the server does not know: anything goes
}


@st.composite
def field_value(draw: st.DrawFn, key: str) -> Any:
    valid, invalid = FIELDS[key]
    # Hypothesis favours the low end of a range: the common case is the valid value.
    return draw(invalid) if draw(st.integers(0, 3)) == 3 else draw(valid)


@st.composite
def messages(draw: st.DrawFn) -> tuple[bytes, bytes, int]:
    """A header (each field absent, valid, near the edge or odd; maybe a duplicate key, maybe whitespace),
    a payload of the right size or one byte off, and a size limit that sometimes cuts it."""
    header = {key: draw(field_value(key)) for key in FIELDS if draw(st.integers(0, 9)) != 9}
    text = json.dumps(header, ensure_ascii=draw(st.booleans()))
    if header and draw(st.integers(0, 4)) == 4:  # JSON allows duplicate keys; the last one counts
        key = draw(st.sampled_from(list(FIELDS)))
        text = f"{text[:-1]}, {json.dumps(key)}: {json.dumps(draw(field_value(key)))}}}"
    if draw(st.integers(0, 9)) == 9:
        text = draw(st.sampled_from([" ", "\n"])) + text
    raw = text.encode("utf-8", "surrogatepass")  # a lone surrogate becomes bytes that are not UTF-8
    shape, dtype = header.get("shape"), header.get("dtype")
    if type(shape) is list and all(type(d) is int and 0 <= d < 10 for d in shape) and str(dtype) in DTYPES:
        size = int(np.prod(shape)) * DTYPES[dtype].itemsize + draw(st.sampled_from([0, 0, 0, 0, -1, 1]))
    else:
        size = draw(st.integers(0, 16))
    payload = bytes(max(size, 0))
    limit = len(raw) + len(payload) + draw(st.sampled_from([10**6, 10**6, 0, -1]))
    return raw, payload, limit


@pytest.mark.slow
@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(messages())
def test_the_fast_path_agrees_with_the_full_parser_on_generated_messages(message: tuple[bytes, bytes, int]) -> None:
    quick = assert_fast_path_agrees(*message)
    event("the fast path took it" if quick is not None else "the full parser took it")


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(list(FIELDS)), ODD), st.booleans())
def test_info_and_odd_messages_get_a_reply_that_encodes(fields: dict[str, Any], req: bool) -> None:
    frames = [json.dumps({"op": "info", **fields}).encode("utf-8", "surrogatepass")]
    try:
        delimiter, request = parse_request([b""] * req + frames, max_message_bytes=LIMIT)
    except ProtocolError as exc:
        encode_error(exc.request_id, exc.code, exc.message)
        return
    assert delimiter == (b"" if req else None)
    encode_info(request.request_id, {"model": "m"})


def test_a_cancel_is_the_header_alone_and_names_the_request_by_its_id() -> None:
    from packrat_daemon.wire.client_side import encode_cancel_request
    from packrat_daemon.wire.server_side import CancelRequest

    assert parse_request(encode_cancel_request(42), max_message_bytes=1 << 20) == (None, CancelRequest(42))
    with pytest.raises(ProtocolError, match="header frame alone"):
        parse_request([*encode_cancel_request("a"), b"x"], max_message_bytes=1 << 20)


def test_the_end_client_a_gateway_names_is_kept_and_checked_on_both_paths() -> None:
    from packrat_daemon.wire.client_side import encode_infer_request, encode_tensors_request

    array = np.zeros((2, 3), np.float32)
    for frames in (
        encode_infer_request(1, array, client="rest:127.0.0.1:5000"),
        encode_tensors_request(1, {"a": array}, client="rest:127.0.0.1:5000"),
        [zmq.Frame(bytes(f)) for f in encode_infer_request(1, array, client="rest:127.0.0.1:5000")],  # fast path
    ):
        _, request = parse_request(frames, max_message_bytes=1 << 20)
        assert request.client == "rest:127.0.0.1:5000"  # type: ignore[union-attr]
    _, request = parse_request(encode_infer_request(1, array), max_message_bytes=1 << 20)
    assert request.client is None  # type: ignore[union-attr]
    header = json.loads(bytes(encode_infer_request(1, array)[0]))
    for bad in ("", "x" * 129, 7, ["a"]):
        frames = [json.dumps({**header, "client": bad}).encode(), array.tobytes()]
        with pytest.raises(ProtocolError, match="'client' must be a string"):
            parse_request(frames, max_message_bytes=1 << 20)


def test_along_a_free_axis_any_length_from_the_least_to_the_longest_is_taken() -> None:
    for length in (2, 9, 16):
        check_against_model(infer_request("int64", (3, length)), "int64", (16,), 4, free_axis=0, min_length=2)
    for length, words in ((1, "axis 1 is 1 long; the model takes 2 to 16"), (17, "axis 1 is 17 long")):
        with pytest.raises(ProtocolError, match=words):
            check_against_model(infer_request("int64", (3, length)), "int64", (16,), 4, free_axis=0, min_length=2)
    assert request_length(infer_request("int64", (3, 9)), 0) == 9 and request_length(infer_request(), None) == 0
