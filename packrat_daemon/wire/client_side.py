"""The client's side of the wire protocol: encode requests, decode replies (and turn error replies into
the typed exceptions of :mod:`packrat_daemon.wire.errors`)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import zmq

from packrat_daemon.wire import codec, errors
from packrat_daemon.wire.codec import ErrorCode, ProtocolError, RequestId

# What a result reply holds: version 1's one tensor, or version 2's named tensors.
Result = np.ndarray | dict[str, np.ndarray]

# (kind, itemsize) -> wire name; byte order is normalised on encode, so it is not part of the key.
_NAME_BY_KIND: dict[tuple[str, int], str] = {
    (dt.kind, dt.itemsize): name for name, dt in codec.DTYPES.items() if name != "bfloat16"
}


# ------------------------------------------------------------------------------------ requests


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
            f"dtype {dt} cannot be sent; supported: {', '.join(codec.DTYPES)} "
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
    elif dtype not in codec.DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; expected one of {', '.join(codec.DTYPES)}")
    elif dtype_name(array.dtype) != dtype:
        raise ValueError(f"array is {array.dtype} but dtype={dtype!r} was asked for; cast it first")
    else:
        name = dtype
    wire = codec.DTYPES[name]
    array = np.ascontiguousarray(array)
    if array.dtype == wire:  # the common case: native little-endian, nothing to convert
        return name, array
    if array.dtype.name == "bfloat16":
        array = array.view(np.uint16)  # keep the bits: astype would round the values to integers
    if array.dtype != wire:
        array = array.astype(wire)  # only byte order differs here: values are kept
    return name, array


def _validate_id(request_id: RequestId) -> None:
    problem = codec.check_request_id(request_id)
    if problem is not None:
        raise ValueError(problem)


def encode_infer_request(
    request_id: RequestId,
    array: np.ndarray,
    timeout_ms: float | None = None,
    *,
    dtype: str | None = None,
    client: str | None = None,
) -> list[bytes | memoryview]:
    """``[header, payload]`` for an infer request; the payload is a view of the array, not a copy.

    The first axis of ``array`` counts the samples. ``dtype`` overrides the wire dtype name; it is only
    needed for bfloat16, whose raw bits numpy holds as uint16. ``client`` names the end client for the
    server's fairness (a gateway's, docs/protocol.md 2.2). Raises ValueError for an array the protocol cannot
    carry (0-d, an empty dimension, an unsupported dtype).
    """
    if (
        dtype is None
        and client is None
        and type(array) is np.ndarray
        and type(request_id) is int
        and array.ndim
        and array.flags.c_contiguous
        and array.size
        and codec.MIN_INT_ID <= request_id <= codec.MAX_INT_ID
    ):
        # The common case (a native little-endian C-contiguous array, an integer id): the header from a
        # cached template, the payload a view of the array.
        template = _HEADER_TEMPLATES.get((array.dtype, array.shape[1:], timeout_ms))
        if template is not None:
            return [template % (request_id, array.shape[0]), array.reshape(-1).view(np.uint8).data]
    _validate_id(request_id)
    array = np.asarray(array)
    if array.ndim == 0 or array.ndim > codec.MAX_NDIM or 0 in array.shape:
        raise ValueError(
            f"cannot send an array of shape {array.shape}: it needs 1 to {codec.MAX_NDIM} dimensions, "
            "none of them empty, the first one counting samples"
        )
    name, wire = _wire_array(array, dtype)
    header: dict[str, Any] = {
        "v": codec.PROTOCOL_VERSION,
        "id": request_id,
        "op": "infer",
        "dtype": name,
        "shape": list(wire.shape),
    }
    if timeout_ms is not None:
        header["timeout_ms"] = timeout_ms
    if client is not None:
        header["client"] = client
    encoded = codec.dump_header(header)
    if type(request_id) is int and wire is array and array.flags.c_contiguous and dtype is None and client is None:
        _remember_template(array, header)
    # A flat uint8 view gives a 1-D byte buffer whatever the dtype (bool, float16) or strides of size-1 axes.
    return [encoded, wire.reshape(-1).view(np.uint8).data]


# (numpy dtype, sample shape, timeout_ms) -> the request header as bytes % (id, samples). Bounded: a
# client sending ever-new shapes or timeouts only fills it once.
_HEADER_TEMPLATES: dict[tuple[np.dtype, tuple[int, ...], float | None], bytes] = {}
_MAX_TEMPLATES = 256


def _remember_template(array: np.ndarray, header: dict[str, Any]) -> None:
    if len(_HEADER_TEMPLATES) >= _MAX_TEMPLATES:
        return
    # Encode with placeholder values, then turn those into %d slots (after escaping any literal %).
    marked = codec.dump_header({**header, "id": 1_234_567_890_123, "shape": [987_654_321_987, *header["shape"][1:]]})
    template = marked.replace(b"%", b"%%").replace(b"1234567890123", b"%d", 1).replace(b"987654321987", b"%d", 1)
    _HEADER_TEMPLATES[(array.dtype, array.shape[1:], header.get("timeout_ms"))] = template


def encode_tensors_request(
    request_id: RequestId,
    arrays: Mapping[str, np.ndarray],
    timeout_ms: float | None = None,
    *,
    dtypes: Mapping[str, str] | None = None,
    client: str | None = None,
) -> list[bytes | memoryview]:
    """``[header, payload, ...]`` for a version-2 infer request: one frame per named array, each a view of the
    array, not a copy. Every array's first axis counts the same samples. ``dtypes`` names the wire dtype of any
    array that needs it (bfloat16's raw bits as uint16). Raises ValueError for what the protocol cannot carry."""
    _validate_id(request_id)
    if not 0 < len(arrays) <= codec.MAX_TENSORS:
        raise ValueError(f"give 1 to {codec.MAX_TENSORS} named arrays, got {len(arrays)}")
    entries, payloads = [], []
    for name, given in arrays.items():
        problem = codec.check_tensor_name(name)
        if problem is not None:
            raise ValueError(problem)
        array = np.asarray(given)
        if array.ndim == 0 or array.ndim > codec.MAX_NDIM or 0 in array.shape:
            raise ValueError(
                f"cannot send {name!r} of shape {array.shape}: it needs 1 to {codec.MAX_NDIM} dimensions, none of them "
                "empty, the first one counting samples"
            )
        wire_name, wire = _wire_array(array, (dtypes or {}).get(name))
        entries.append({"name": name, "dtype": wire_name, "shape": list(wire.shape)})
        payloads.append(wire.reshape(-1).view(np.uint8).data)
    counts = {entry["shape"][0] for entry in entries}
    if len(counts) > 1:
        raise ValueError(_uneven_samples(entries))
    header: dict[str, Any] = {"v": codec.TENSORS_VERSION, "id": request_id, "op": "infer", "inputs": entries}
    if timeout_ms is not None:
        header["timeout_ms"] = timeout_ms
    if client is not None:
        header["client"] = client
    return [codec.dump_header(header), *payloads]


def _uneven_samples(entries: list[dict[str, Any]]) -> str:
    """What to do about named arrays whose first axes differ: most often 1-D arrays, each one sample's values,
    where the first axis is read as the samples (8 tokens of `x` as 8 samples)."""
    listed = ", ".join(f"{entry['name']} {entry['shape'][0]}" for entry in entries)
    flat = [entry for entry in entries if len(entry["shape"]) == 1]
    if flat:
        first = flat[0]
        fix = (
            f"the 1-D array(s) {', '.join(repr(entry['name']) for entry in flat)} are read as that many samples of "
            f"one value each; for one sample, add the samples axis: {first['name']}[None] (numpy), shape "
            f"(1, {first['shape'][0]})"
        )
    else:
        fix = "give every array the same number of samples along its first axis"
    return f"every array's first axis counts the samples, and these differ: {listed}; {fix}"


def encode_cancel_request(request_id: RequestId) -> list[bytes]:
    """Cancel the request of this id sent on this connection: if it has not started computing it is answered
    CANCELLED at once and never computed; otherwise this is ignored and its own reply comes as usual. Either way
    one reply comes for that id, and none for this message (docs/protocol.md, 4.5)."""
    _validate_id(request_id)
    return [codec.dump_header({"v": codec.PROTOCOL_VERSION, "id": request_id, "op": "cancel"})]


def encode_info_request(request_id: RequestId, op: str = "info") -> list[bytes]:
    """An `info` request, or with `op="status"` a `status` request (the same reply with the live state)."""
    _validate_id(request_id)
    return [codec.dump_header({"v": codec.PROTOCOL_VERSION, "id": request_id, "op": op})]


# ------------------------------------------------------------------------------------- replies


def _malformed(message: str, request_id: RequestId | None = None) -> ProtocolError:
    # A reply the client cannot read is the server's fault, hence INTERNAL rather than BAD_REQUEST.
    return ProtocolError(ErrorCode.INTERNAL, f"malformed reply from the server: {message}", request_id)


def decode_reply(frames: Sequence[codec.Frame]) -> tuple[dict[str, Any], Result | None]:
    """Read a reply: ``(header, array)`` for a result (version 2: a dict of arrays by name), ``(header, None)``
    for info and errors.

    Error replies are returned, not raised: ``header["ok"]`` is False and ``header["error"]`` holds
    ``code`` and ``message``. A reply that breaks the protocol raises :class:`ProtocolError` (INTERNAL),
    carrying the reply's id when it could be read. The array is a view of the received frame.
    """
    if frames and len(frames[0]) == 0:
        frames = frames[1:]  # the delimiter a REQ-style client gets back
    if not frames or len(frames) > 1 + codec.MAX_TENSORS:
        raise _malformed(f"{len(frames)} frames; expected [header] or [header, payload, ...]")
    try:
        header = codec.load_header(frames[0] if type(frames[0]) is zmq.Frame else codec.as_buffer(frames[0]))
    except ValueError as exc:
        raise _malformed(str(exc)) from None
    request_id = header.get("id")
    if type(request_id) not in _REPLY_ID_TYPES:  # JSON gives exact types: bool is not int here
        raise _malformed(f"'id' is {codec.json_type(request_id)}")
    ok = header.get("ok")
    if type(ok) is not bool or type(header.get("v")) is not int:
        raise _malformed("header needs an integer 'v' and a boolean 'ok'", request_id)
    if not ok:
        _check_error_header(header, request_id, len(frames))
        return header, None
    if "outputs" in header and header["v"] == codec.TENSORS_VERSION:
        return header, _decode_tensors(header, request_id, frames)
    if len(frames) > 2:
        raise _malformed(f"{len(frames)} frames; a version-1 reply is [header] or [header, payload]", request_id)
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


_INT_ONLY = {int}


def _decode_tensors(
    header: dict[str, Any], request_id: RequestId | None, frames: Sequence[codec.Frame]
) -> dict[str, np.ndarray]:
    outputs = header["outputs"]
    if type(outputs) is not list or not outputs or len(outputs) != len(frames) - 1:
        raise _malformed("a version-2 result needs 'outputs', one entry per payload frame", request_id)
    arrays: dict[str, np.ndarray] = {}
    for entry, frame in zip(outputs, frames[1:], strict=True):
        name = entry.get("name") if isinstance(entry, dict) else None
        if not isinstance(name, str) or codec.check_tensor_name(name) is not None or name in arrays:
            raise _malformed(f"output name {name!r} is not a valid, distinct tensor name", request_id)
        arrays[name] = _decode_result(entry, request_id, [frames[0], frame], f"output {name!r}: ")
    return arrays


def _decode_result(
    header: dict[str, Any], request_id: RequestId | None, frames: Sequence[codec.Frame], what: str = ""
) -> np.ndarray:
    dtype, shape = header.get("dtype"), header.get("shape")
    if dtype not in codec.DTYPES:
        raise _malformed(f"{what}unknown 'dtype' {dtype!r}", request_id)
    # Unlike a request's, an output's dimensions after the first may be 0.
    if not (
        type(shape) is list
        and len(shape) <= codec.MAX_NDIM
        and (not shape or (set(map(type, shape)) == _INT_ONLY and min(shape) >= 0))
    ):
        raise _malformed(f"'shape' {shape!r} is not an array of non-negative integers", request_id)
    if len(frames) != 2:
        raise _malformed("a result reply needs a payload frame", request_id)
    payload = codec.as_buffer(frames[1])
    expected = math.prod(shape) * codec.ITEMSIZE[dtype]
    if len(payload) != expected:
        raise _malformed(f"payload is {len(payload)} bytes, but {dtype} of shape {shape} needs {expected}", request_id)
    return np.frombuffer(payload, dtype=codec.DTYPES[dtype]).reshape(shape)


_ERROR_CLASSES: dict[str, type[errors.ServerError]] = {
    ErrorCode.BAD_REQUEST: errors.BadRequest,
    ErrorCode.UNSUPPORTED_VERSION: errors.UnsupportedVersion,
    ErrorCode.TOO_LARGE: errors.TooLarge,
    ErrorCode.OVERLOADED: errors.Overloaded,
    ErrorCode.TIMEOUT: errors.ServerTimeout,
    ErrorCode.SHUTTING_DOWN: errors.ShuttingDown,
    ErrorCode.INTERNAL: errors.InternalError,
    ErrorCode.CANCELLED: errors.Cancelled,
}


def server_error(header: dict[str, Any]) -> errors.ServerError:
    """The exception for an error reply header (as returned by decode_reply)."""
    error = header["error"]
    raw_code: str = error["code"]
    try:
        code: ErrorCode | str = ErrorCode(raw_code)
    except ValueError:
        code = raw_code  # a newer server's code: still a ServerError, with the code kept as sent
    cls = _ERROR_CLASSES.get(code, errors.ServerError)
    if cls is errors.UnsupportedVersion:
        versions = header.get("versions")
        return errors.UnsupportedVersion(code, error["message"], header.get("id"), versions or ())
    return cls(code, error["message"], header.get("id"))


def infer_result(header: dict[str, Any], array: Result | None, samples: int) -> Result:
    """The result of a decoded infer reply: the array, or for a version-2 reply of several outputs a dict of them
    by name (of one output, its array); raises the server's error, or INTERNAL for a wrong count."""
    if not header["ok"]:
        raise server_error(header)
    if isinstance(array, dict):
        for one in array.values():
            infer_result(header, one, samples)
        return next(iter(array.values())) if len(array) == 1 else array
    if array is None or array.ndim == 0 or array.shape[0] != samples:
        got = "no tensor" if array is None else f"shape {list(array.shape)}"
        raise ProtocolError(ErrorCode.INTERNAL, f"server answered {samples} samples with {got}", header.get("id"))
    return array


def info_result(header: dict[str, Any]) -> dict[str, Any]:
    """The description in a decoded info reply (without the envelope); raises the server's error."""
    if not header["ok"]:
        raise server_error(header)
    return {key: value for key, value in header.items() if key not in ("v", "id", "ok")}
