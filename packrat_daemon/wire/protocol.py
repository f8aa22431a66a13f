"""Packrat wire protocol, version 1: parse and build the ZeroMQ messages of clients and the daemon.

A client message is ``[header, payload]`` (infer) or ``[header]`` (info); a reply is ``[header]`` or
``[header, payload]``. The header is a UTF-8 JSON object, the payload raw little-endian C-order tensor
bytes. docs/protocol.md is the normative description; this module is its reference implementation.

The daemon's frontend calls :func:`parse_request` and the ``encode_*`` reply builders for every
request, so they stay small and allocation-light. This module must never import torch: the client
imports it and has to start fast.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, NamedTuple

import numpy as np
import zmq

from packrat_daemon.wire.errors import PackratError

PROTOCOL_VERSION = 1
SUPPORTED_VERSIONS: tuple[int, ...] = (1,)
MAX_HEADER_BYTES = 65536
MAX_ID_CHARS = 128
# Ids cross language boundaries: keep integer ids inside a signed 64-bit range every client can hold.
_MIN_INT_ID = -(2**63)
_MAX_INT_ID = 2**63 - 1
# numpy itself refuses more than 64 dimensions; no model input comes near 32.
MAX_NDIM = 32

# bfloat16 has no numpy dtype: its payload is the raw 16-bit patterns, which numpy holds as uint16.
DTYPES: dict[str, np.dtype] = {
    "float32": np.dtype("<f4"),
    "float64": np.dtype("<f8"),
    "float16": np.dtype("<f2"),
    "bfloat16": np.dtype("<u2"),
    "int64": np.dtype("<i8"),
    "int32": np.dtype("<i4"),
    "int16": np.dtype("<i2"),
    "int8": np.dtype("i1"),
    "uint8": np.dtype("u1"),
    "bool": np.dtype("?"),
}
_ITEMSIZE: dict[str, int] = {name: dt.itemsize for name, dt in DTYPES.items()}
# (kind, itemsize) -> wire name; byte order is normalised on encode, so it is not part of the key.
_NAME_BY_KIND: dict[tuple[str, int], str] = {
    (dt.kind, dt.itemsize): name for name, dt in DTYPES.items() if name != "bfloat16"
}

Frame = bytes | bytearray | memoryview | zmq.Frame
Buffer = bytes | memoryview
RequestId = str | int


class ErrorCode(StrEnum):
    BAD_REQUEST = "BAD_REQUEST"
    UNSUPPORTED_VERSION = "UNSUPPORTED_VERSION"
    TOO_LARGE = "TOO_LARGE"
    OVERLOADED = "OVERLOADED"
    TIMEOUT = "TIMEOUT"
    SHUTTING_DOWN = "SHUTTING_DOWN"
    INTERNAL = "INTERNAL"


class ProtocolError(PackratError):
    """A message broke the protocol; ``code`` is what the server answers (or the client reports).

    ``delimiter`` is set by :func:`parse_request` to the empty frame the request started with (REQ
    clients), or None, so the frontend can echo it in the error reply as it does for results.
    """

    def __init__(self, code: ErrorCode, message: str, request_id: RequestId | None = None) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.request_id = request_id
        self.delimiter: bytes | None = None


class InferRequest(NamedTuple):
    """One parsed infer request (a tuple: one is built per request, and a frozen dataclass's fields
    cost a setattr each)."""

    request_id: RequestId
    dtype: str
    shape: tuple[int, ...]
    payload: memoryview | bytes
    timeout_ms: float | None = None


@dataclass(frozen=True, slots=True)
class InfoRequest:
    request_id: RequestId


# --------------------------------------------------------------------------------------------- helpers


def _bad(message: str, request_id: RequestId | None = None) -> ProtocolError:
    return ProtocolError(ErrorCode.BAD_REQUEST, message, request_id)


def _as_buffer(frame: Frame) -> Buffer:
    """A byte-addressed view of one frame, without copying the (possibly large) payload."""
    if isinstance(frame, bytes):
        return frame
    if isinstance(frame, zmq.Frame):
        return frame.buffer
    view = memoryview(frame)
    if view.ndim != 1 or view.itemsize != 1:
        view = view.cast("B")
    return view


def _json_default(obj: Any) -> Any:
    # Plans and timings are often computed with numpy, whose scalars json cannot serialise.
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, tuple | set | frozenset):
        return list(obj)
    raise TypeError(f"cannot put a {type(obj).__name__} into a protocol header")


_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False, default=_json_default)


def _dump(header: Mapping[str, Any]) -> bytes:
    return _ENCODER.encode(header).encode("utf-8")


def _reject_constant(name: str) -> Any:
    # NaN and Infinity are not JSON; clients in other languages could not read them back.
    raise ValueError(f"{name} is not valid JSON")


_DECODER = json.JSONDecoder(parse_constant=_reject_constant)
_SCAN_ONCE = _DECODER.scan_once


def _scan(text: str) -> tuple[Any, int]:
    """(value, end) of the JSON value at the start of ``text``; the full decoder words any failure."""
    try:
        return _SCAN_ONCE(text, 0)
    except StopIteration:
        return _DECODER.decode(text), len(text)  # raises ValueError with the position, or succeeds


def _load_header(buf: Buffer | zmq.Frame) -> dict[str, Any]:
    """Decode a header frame into a dict, or raise ``ValueError`` saying why it is not one."""
    try:
        text = (buf.bytes if type(buf) is zmq.Frame else bytes(buf)).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"header is not valid UTF-8 ({exc.reason} at byte {exc.start})") from None
    try:
        # The scanner itself, not decode(): that wraps it in two whitespace regex matches. Anything it does
        # not take in one piece (leading or trailing whitespace, extra data, bad JSON) goes the long way,
        # which also words the error.
        header, end = _scan(text)
        if end != len(text):
            header = _DECODER.decode(text)
    except RecursionError:
        raise ValueError("header JSON is nested too deeply") from None
    except ValueError as exc:
        raise ValueError(f"header is not valid JSON ({exc})") from None
    if not isinstance(header, dict):
        raise ValueError(f"header must be a JSON object, got a JSON {type(header).__name__}")
    return header


def _is_int(value: Any) -> bool:
    # bool is an int subclass in Python, but true/false are never valid where the protocol wants a number.
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def check_request_id(request_id: Any) -> str | None:
    """Return why ``request_id`` is not a valid id, or None if it is one."""
    if isinstance(request_id, str):
        if len(request_id) > MAX_ID_CHARS:
            return f"'id' is {len(request_id)} characters long; at most {MAX_ID_CHARS} are allowed"
        return None
    if _is_int(request_id):
        if not _MIN_INT_ID <= request_id <= _MAX_INT_ID:
            return "'id' integer does not fit in a signed 64-bit integer"
        return None
    return f"'id' must be a string or an integer, got {_json_type(request_id)}"


def _json_type(value: Any) -> str:
    names = {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null"}
    if _is_number(value):
        return f"the number {value!r}"
    return names.get(type(value), type(value).__name__)


def _validate_id(request_id: RequestId) -> None:
    problem = check_request_id(request_id)
    if problem is not None:
        raise ValueError(problem)


# ------------------------------------------------------------------------------------- server: parsing


def parse_request(
    frames: Sequence[Frame], *, max_message_bytes: int
) -> tuple[bytes | None, InferRequest | InfoRequest]:
    """Validate one client message (the frames after the ROUTER identity) at the protocol level.

    Returns ``(delimiter, request)``: ``delimiter`` is ``b""`` when the client sent the empty frame a
    REQ socket adds (echo it before the reply header), else None. Raises :class:`ProtocolError` with the
    code to answer and the request id once it is known. Model-level checks are
    :func:`check_against_model`'s job.
    """
    if len(frames) == 2 and type(frames[0]) is zmq.Frame:
        request = _well_formed_infer(frames[0].bytes, frames[1], max_message_bytes)
        if request is not None:
            return None, request
    buffers = [_as_buffer(frame) for frame in frames]
    delimiter: bytes | None = None
    if buffers and len(buffers[0]) == 0:
        delimiter = b""
        buffers = buffers[1:]
    try:
        return delimiter, _parse_frames(buffers, max_message_bytes)
    except ProtocolError as exc:
        exc.delimiter = delimiter
        raise


def _well_formed_infer(raw: bytes, payload_frame: Frame, max_message_bytes: int) -> InferRequest | None:
    """The request if it is a well-formed infer request, else None: the full parser then words the error.

    Every request passes here first, so it checks the same rules as the full parser with as few steps as
    it can; it never raises.
    """
    if not 0 < len(raw) <= MAX_HEADER_BYTES:
        return None
    try:
        header, end = _SCAN_ONCE(raw.decode("utf-8"), 0)
    except (StopIteration, ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        return None
    if end != len(raw) or type(header) is not dict or header.get("op") != "infer":
        return None  # (end counts characters, so a non-ASCII header also goes the long way)
    request_id, dtype, shape, timeout_ms = (
        header.get("id"),
        header.get("dtype"),
        header.get("shape"),
        header.get("timeout_ms"),
    )
    if type(header.get("v")) is not int or header["v"] not in SUPPORTED_VERSIONS:
        return None
    if type(dtype) is not str or dtype not in _ITEMSIZE:
        return None
    if type(request_id) is int:
        if not _MIN_INT_ID <= request_id <= _MAX_INT_ID:
            return None
    elif type(request_id) is not str or len(request_id) > MAX_ID_CHARS:
        return None
    if not _plain_shape(shape):
        return None
    if timeout_ms is not None and not (type(timeout_ms) in (int, float) and 0 < timeout_ms < math.inf):
        return None
    payload = _as_buffer(payload_frame)
    size = len(payload)
    if size != math.prod(shape) * _ITEMSIZE[dtype] or size + len(raw) > max_message_bytes:
        return None
    return InferRequest(request_id, dtype, tuple(shape), payload, None if timeout_ms is None else float(timeout_ms))


def _parse_frames(buffers: list[Buffer], max_message_bytes: int) -> InferRequest | InfoRequest:
    if not buffers:
        raise _bad("empty message: expected frames [header] or [header, payload]")
    header_buf = buffers[0]
    if len(header_buf) > MAX_HEADER_BYTES:
        raise ProtocolError(
            ErrorCode.TOO_LARGE,
            f"header is {len(header_buf)} bytes; at most {MAX_HEADER_BYTES} are allowed",
        )
    try:
        header = _load_header(header_buf)
    except ValueError as exc:
        raise _bad(str(exc)) from None

    # The id comes first so that every later error can be matched to its request by the client.
    if "id" not in header:
        raise _bad("header has no 'id'; give every request a string or integer id")
    request_id = header["id"]
    problem = check_request_id(request_id)
    if problem is not None:
        raise _bad(problem)

    total = sum(len(buf) for buf in buffers)
    if total > max_message_bytes:
        raise ProtocolError(
            ErrorCode.TOO_LARGE,
            f"message is {total} bytes; this server accepts at most {max_message_bytes}: send fewer samples",
            request_id,
        )
    _check_version(header, request_id)
    if len(buffers) > 2:
        raise _bad(f"message has {len(buffers)} frames; expected [header] or [header, payload]", request_id)

    op = header.get("op")
    if op == "infer":
        return _parse_infer(header, request_id, buffers)
    if op == "info":
        if len(buffers) != 1:
            raise _bad("an 'info' request is the header frame alone; drop the payload frame", request_id)
        return InfoRequest(request_id)
    raise _bad(f"unknown 'op' {op!r}; expected 'infer' or 'info'", request_id)


def _check_version(header: dict[str, Any], request_id: RequestId) -> None:
    if "v" not in header:
        raise _bad("header has no 'v'; set it to the protocol version, 1", request_id)
    version = header["v"]
    if not _is_int(version):
        raise _bad(f"'v' must be an integer protocol version, got {_json_type(version)}", request_id)
    if version not in SUPPORTED_VERSIONS:
        raise ProtocolError(
            ErrorCode.UNSUPPORTED_VERSION,
            f"protocol version {version} is not supported; this server speaks {list(SUPPORTED_VERSIONS)}",
            request_id,
        )


def _parse_infer(header: dict[str, Any], request_id: RequestId, buffers: list[Buffer]) -> InferRequest:
    if len(buffers) != 2:
        raise _bad("an 'infer' request needs a payload frame after the header", request_id)
    dtype = header.get("dtype")
    if not isinstance(dtype, str) or dtype not in DTYPES:
        raise _bad(f"unknown 'dtype' {dtype!r}; expected one of {', '.join(DTYPES)}", request_id)
    shape = _parse_shape(header.get("shape"), request_id)
    timeout_ms = _parse_timeout(header.get("timeout_ms"), request_id)

    payload = buffers[1]
    expected = math.prod(shape) * _ITEMSIZE[dtype]
    if len(payload) != expected:
        raise _bad(
            f"payload is {len(payload)} bytes, but {dtype} of shape {list(shape)} needs {expected}",
            request_id,
        )
    return InferRequest(request_id, dtype, shape, payload, timeout_ms)


def _parse_shape(shape: Any, request_id: RequestId) -> tuple[int, ...]:
    if _plain_shape(shape):
        return tuple(shape)
    if not isinstance(shape, list) or not shape:
        raise _bad(f"'shape' must be a non-empty array of integers, got {_json_type(shape)}", request_id)
    if len(shape) > MAX_NDIM:
        raise _bad(f"'shape' has {len(shape)} dimensions; at most {MAX_NDIM} are allowed", request_id)
    for axis, size in enumerate(shape):
        if not _is_int(size) or size < 1:
            raise _bad(
                f"'shape'[{axis}] is {size!r}; every dimension must be a positive integer "
                "(the first one, the number of samples, too)",
                request_id,
            )
    return tuple(shape)


_INT_ONLY = {int}


def _plain_shape(shape: Any) -> bool:
    """The common case in one pass: a short list of positive ints (bool is an int subclass, not an int type)."""
    return type(shape) is list and 0 < len(shape) <= MAX_NDIM and set(map(type, shape)) == _INT_ONLY and min(shape) > 0


def _parse_timeout(timeout_ms: Any, request_id: RequestId) -> float | None:
    if timeout_ms is None:
        return None
    if not _is_number(timeout_ms) or not math.isfinite(timeout_ms) or timeout_ms <= 0:
        raise _bad(f"'timeout_ms' must be a positive number of milliseconds, got {timeout_ms!r}", request_id)
    return float(timeout_ms)


def check_against_model(req: InferRequest, input_dtype: str, sample_shape: tuple[int, ...], max_samples: int) -> None:
    """Raise BAD_REQUEST unless ``req`` fits the model's input; a -1 in ``sample_shape`` matches any size."""
    if req.dtype == input_dtype and req.shape[1:] == sample_shape and req.shape[0] <= max_samples:
        return  # the common case, checked with three comparisons
    if req.dtype != input_dtype:
        raise _bad(f"dtype is {req.dtype}, but the model takes {input_dtype}; cast the input", req.request_id)
    got = req.shape[1:]
    if len(got) != len(sample_shape) or any(
        want != -1 and want != size for want, size in zip(sample_shape, got, strict=True)
    ):
        raise _bad(
            f"each sample has shape {list(got)}, but the model takes {list(sample_shape)} "
            f"(send shape [samples, {', '.join(map(str, sample_shape))}])",
            req.request_id,
        )
    if req.shape[0] > max_samples:
        raise _bad(
            f"{req.shape[0]} samples in one request; this server takes at most {max_samples}: split the request",
            req.request_id,
        )


# ------------------------------------------------------------------------------------- server: replies


def encode_result(
    request_id: RequestId,
    dtype: str,
    shape: Sequence[int],
    payload: Buffer | np.ndarray,
    timing: Mapping[str, float],
) -> list[bytes | memoryview | np.ndarray]:
    """The reply to an infer request: ``[header, payload]``; the payload is passed through uncopied."""
    header = {
        "v": PROTOCOL_VERSION,
        "id": request_id,
        "ok": True,
        "dtype": dtype,
        "shape": list(map(int, shape)),
        "timing": timing,
    }
    return [_dump(header), payload]


def encode_timed_result(
    request_id: RequestId,
    dtype: str,
    shape: Sequence[int],
    payload: Buffer | np.ndarray,
    queue_ms: float,
    compute_ms: float,
    total_ms: float,
    instances: int,
) -> list[bytes | memoryview | np.ndarray]:
    """:func:`encode_result` with the daemon's own timing fields, formatted in one step (once per reply).

    Milliseconds are written with three decimals; a value that is not a finite number goes through
    :func:`encode_result`, which refuses it.
    """
    if type(request_id) is int and dtype in DTYPES and math.isfinite(queue_ms + compute_ms + total_ms):
        dims = ",".join(map(str, map(int, shape)))
        text = _TIMED_RESULT % (request_id, dtype, dims, queue_ms, compute_ms, total_ms, instances)
        return [text.encode(), payload]
    timing = {"queue_ms": round(queue_ms, 3), "compute_ms": round(compute_ms, 3), "total_ms": round(total_ms, 3)}
    return encode_result(request_id, dtype, shape, payload, {**timing, "instances": instances})


_TIMED_RESULT = (
    f'{{"v":{PROTOCOL_VERSION},"id":%d,"ok":true,"dtype":"%s","shape":[%s],'
    '"timing":{"queue_ms":%.3f,"compute_ms":%.3f,"total_ms":%.3f,"instances":%d}}'
)


def encode_info(request_id: RequestId, info: Mapping[str, Any]) -> list[bytes]:
    """The reply to an info request; ``info`` holds model, input, max_batch and plan."""
    header: dict[str, Any] = {"v": PROTOCOL_VERSION, "id": request_id, "ok": True}
    header["versions"] = list(SUPPORTED_VERSIONS)
    header.update(info)
    return [_dump(header)]


def encode_error(request_id: RequestId | None, code: ErrorCode, message: str) -> list[bytes]:
    """An error reply. UNSUPPORTED_VERSION also lists the versions this server speaks."""
    header: dict[str, Any] = {
        "v": PROTOCOL_VERSION,
        "id": request_id,
        "ok": False,
        "error": {"code": str(code), "message": message},
    }
    if code == ErrorCode.UNSUPPORTED_VERSION:
        header["versions"] = list(SUPPORTED_VERSIONS)
    return [_dump(header)]


# -------------------------------------------------------------------------------------- client side


def dtype_name(np_dtype: Any) -> str:
    """The wire name of a numpy dtype (any byte order); ValueError if the protocol cannot carry it."""
    known = _WIRE_NAME_CACHE.get(np_dtype) if isinstance(np_dtype, np.dtype) else None
    if known is not None:
        return known
    dt = np.dtype(np_dtype)
    if dt.name == "bfloat16" and dt.itemsize == 2:  # ml_dtypes.bfloat16, when installed
        return "bfloat16"
    name = _NAME_BY_KIND.get((dt.kind, dt.itemsize))
    if name is None:
        raise ValueError(
            f"dtype {dt} cannot be sent; supported: {', '.join(DTYPES)} "
            "(for bfloat16 pass its raw bits as uint16 with dtype='bfloat16')"
        )
    _WIRE_NAME_CACHE[dt] = name
    return name


# numpy's dtype.name is computed in Python on every access; the client encodes on every call.
_WIRE_NAME_CACHE: dict[np.dtype, str] = {}


def _wire_array(array: np.ndarray, dtype: str | None) -> tuple[str, np.ndarray]:
    """The wire dtype name and a C-contiguous little-endian array holding exactly the bytes to send."""
    if dtype is None:
        name = dtype_name(array.dtype)
    elif dtype == "bfloat16":
        if array.dtype.itemsize != 2 or not (array.dtype.kind == "u" or array.dtype.name == "bfloat16"):
            raise ValueError(f"dtype='bfloat16' needs the raw bits as a uint16 array, got {array.dtype}")
        name = dtype
    elif dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; expected one of {', '.join(DTYPES)}")
    elif dtype_name(array.dtype) != dtype:
        raise ValueError(f"array is {array.dtype} but dtype={dtype!r} was asked for; cast it first")
    else:
        name = dtype
    wire = DTYPES[name]
    array = np.ascontiguousarray(array)
    if array.dtype == wire:  # the common case: native little-endian, nothing to convert
        return name, array
    if array.dtype.name == "bfloat16":
        array = array.view(np.uint16)  # keep the bits: astype would round the values to integers
    if array.dtype != wire:
        array = array.astype(wire)  # only byte order differs here: values are kept
    return name, array


def encode_infer_request(
    request_id: RequestId,
    array: np.ndarray,
    timeout_ms: float | None = None,
    *,
    dtype: str | None = None,
) -> list[bytes | memoryview]:
    """``[header, payload]`` for an infer request; the payload is a view of the array, not a copy.

    The first axis of ``array`` counts the samples. ``dtype`` overrides the wire dtype name; it is only
    needed for bfloat16, whose raw bits numpy holds as uint16. Raises ValueError for an array the
    protocol cannot carry (0-d, an empty dimension, an unsupported dtype).
    """
    if (
        dtype is None
        and type(array) is np.ndarray
        and type(request_id) is int
        and array.ndim
        and array.flags.c_contiguous
        and array.size
        and _MIN_INT_ID <= request_id <= _MAX_INT_ID
    ):
        # The common case (a native little-endian C-contiguous array, an integer id): the header from a
        # cached template, the payload a view of the array.
        template = _HEADER_TEMPLATES.get((array.dtype, array.shape[1:], timeout_ms))
        if template is not None:
            return [template % (request_id, array.shape[0]), memoryview(array.reshape(-1).view(np.uint8))]
    _validate_id(request_id)
    array = np.asarray(array)
    if array.ndim == 0 or array.ndim > MAX_NDIM or 0 in array.shape:
        raise ValueError(
            f"cannot send an array of shape {array.shape}: it needs 1 to {MAX_NDIM} dimensions, "
            "none of them empty, the first one counting samples"
        )
    name, wire = _wire_array(array, dtype)
    header: dict[str, Any] = {
        "v": PROTOCOL_VERSION,
        "id": request_id,
        "op": "infer",
        "dtype": name,
        "shape": list(wire.shape),
    }
    if timeout_ms is not None:
        header["timeout_ms"] = timeout_ms
    encoded = _dump(header)
    if type(request_id) is int and wire is array and array.flags.c_contiguous and dtype is None:
        _remember_template(array, header)
    # A flat uint8 view gives a 1-D byte buffer whatever the dtype (bool, float16) or strides of size-1 axes.
    return [encoded, memoryview(wire.reshape(-1).view(np.uint8))]


# (numpy dtype, sample shape, timeout_ms) -> the request header as bytes % (id, samples). Bounded: a
# client sending ever-new shapes or timeouts only fills it once.
_HEADER_TEMPLATES: dict[tuple[np.dtype, tuple[int, ...], float | None], bytes] = {}
_MAX_TEMPLATES = 256


def _remember_template(array: np.ndarray, header: dict[str, Any]) -> None:
    if len(_HEADER_TEMPLATES) >= _MAX_TEMPLATES:
        return
    # Encode with placeholder values, then turn those into %d slots (after escaping any literal %).
    marked = _dump({**header, "id": 1_234_567_890_123, "shape": [987_654_321_987, *header["shape"][1:]]})
    template = marked.replace(b"%", b"%%").replace(b"1234567890123", b"%d", 1).replace(b"987654321987", b"%d", 1)
    _HEADER_TEMPLATES[(array.dtype, array.shape[1:], header.get("timeout_ms"))] = template


def encode_info_request(request_id: RequestId) -> list[bytes]:
    _validate_id(request_id)
    return [_dump({"v": PROTOCOL_VERSION, "id": request_id, "op": "info"})]


def _malformed(message: str, request_id: RequestId | None = None) -> ProtocolError:
    # A reply the client cannot read is the server's fault, hence INTERNAL rather than BAD_REQUEST.
    return ProtocolError(ErrorCode.INTERNAL, f"malformed reply from the server: {message}", request_id)


def decode_reply(frames: Sequence[Frame]) -> tuple[dict[str, Any], np.ndarray | None]:
    """Read a reply: ``(header, array)`` for a result, ``(header, None)`` for info and errors.

    Error replies are returned, not raised: ``header["ok"]`` is False and ``header["error"]`` holds
    ``code`` and ``message``. A reply that breaks the protocol raises :class:`ProtocolError` (INTERNAL),
    carrying the reply's id when it could be read. The array is a view of the received frame.
    """
    if frames and len(frames[0]) == 0:
        frames = frames[1:]  # the delimiter a REQ-style client gets back
    if not frames or len(frames) > 2:
        raise _malformed(f"{len(frames)} frames; expected [header] or [header, payload]")
    try:
        header = _load_header(frames[0] if type(frames[0]) is zmq.Frame else _as_buffer(frames[0]))
    except ValueError as exc:
        raise _malformed(str(exc)) from None
    request_id = header.get("id")
    if type(request_id) not in _REPLY_ID_TYPES:  # JSON gives exact types: bool is not int here
        raise _malformed(f"'id' is {_json_type(request_id)}")
    ok = header.get("ok")
    if type(ok) is not bool or type(header.get("v")) is not int:
        raise _malformed("header needs an integer 'v' and a boolean 'ok'", request_id)
    if not ok:
        _check_error_header(header, request_id, len(frames))
        return header, None
    if "dtype" not in header:
        if len(frames) != 1:
            raise _malformed("a reply without 'dtype' must not carry a payload frame", request_id)
        return header, None
    return header, _decode_result(header, request_id, frames)


_REPLY_ID_TYPES = {str, int, type(None)}


def _check_error_header(header: dict[str, Any], request_id: RequestId | None, n_frames: int) -> None:
    error = header.get("error")
    if (
        not isinstance(error, dict)
        or not isinstance(error.get("code"), str)
        or not isinstance(error.get("message"), str)
    ):
        raise _malformed("an error reply needs 'error': {'code': string, 'message': string}", request_id)
    if n_frames != 1:
        raise _malformed("an error reply must not carry a payload frame", request_id)


def _decode_result(header: dict[str, Any], request_id: RequestId | None, frames: Sequence[Frame]) -> np.ndarray:
    dtype, shape = header.get("dtype"), header.get("shape")
    if dtype not in DTYPES:
        raise _malformed(f"unknown 'dtype' {dtype!r}", request_id)
    if not (
        type(shape) is list
        and len(shape) <= MAX_NDIM
        and (not shape or (set(map(type, shape)) == _INT_ONLY and min(shape) >= 0))
    ):
        raise _malformed(f"'shape' {shape!r} is not an array of non-negative integers", request_id)
    if len(frames) != 2:
        raise _malformed("a result reply needs a payload frame", request_id)
    payload = _as_buffer(frames[1])
    expected = math.prod(shape) * _ITEMSIZE[dtype]
    if len(payload) != expected:
        raise _malformed(f"payload is {len(payload)} bytes, but {dtype} of shape {shape} needs {expected}", request_id)
    return np.frombuffer(payload, dtype=DTYPES[dtype]).reshape(shape)
