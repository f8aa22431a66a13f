"""The server's side of the wire protocol: parse and check requests, encode replies.

The daemon's frontend calls :func:`parse_request` and the ``encode_*`` reply builders for every
request, so they stay small and allocation-light. Every well-formed infer request takes a fast path
that decides with as few steps as it can; the full parser takes everything else and words the error.
Both decide each header field by the same rule function (the codec's ``check_request_id``, and
``_version_known``, ``_dtype_known``, ``_plain_shape`` and ``_timeout_ok`` below), so that they cannot
drift apart: the fast path only asks the rule, the full parser asks it and, on a no, says why.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, TypeGuard

import zmq

from packrat_daemon.wire.codec import (
    DTYPES,
    ITEMSIZE,
    MAX_HEADER_BYTES,
    MAX_ID_CHARS,
    MAX_NDIM,
    MAX_TENSORS,
    MAX_TIMEOUT_MS,
    PROTOCOL_VERSION,
    SCAN_ONCE,
    SUPPORTED_VERSIONS,
    TENSORS_VERSION,
    Buffer,
    ErrorCode,
    Frame,
    ProtocolError,
    RequestId,
    as_buffer,
    check_request_id,
    check_tensor_name,
    is_int,
    json_type,
    load_header,
    short_repr,
)


class Tensor(NamedTuple):
    """One named tensor of a version-2 request."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    payload: memoryview | bytes


class InferRequest(NamedTuple):
    """One parsed infer request (a tuple: one is built per request, and a frozen dataclass's fields
    cost a setattr each). A version-2 request lists its named `tensors`; dtype, shape and payload are then
    its first one's (None: version 1, one unnamed tensor)."""

    request_id: RequestId
    dtype: str
    shape: tuple[int, ...]
    payload: memoryview | bytes
    timeout_ms: float | None = None
    tensors: tuple[Tensor, ...] | None = None
    client: str | None = None  # the end client a gateway names, for the batcher's fairness (docs/protocol.md 2.2)


class ModelTensor(NamedTuple):
    """One input a model takes, as requests are checked against it."""

    name: str
    dtype: str
    shape: tuple[int, ...]  # per sample (the longest, along a free axis); -1 matches any size
    high: int | None = None
    free_axis: int | None = None  # the per-sample axis whose size varies, from min_length to shape[free_axis]
    min_length: int = 1


@dataclass(frozen=True, slots=True)
class CancelRequest:
    """Cancel the request of this id from the same connection, if it has not started (docs/protocol.md, 4.5)."""

    request_id: RequestId


@dataclass(frozen=True, slots=True)
class InfoRequest:
    request_id: RequestId
    op: str = "info"  # or "status": the description with the daemon's live state (docs/status.md)


def bad_request(message: str, request_id: RequestId | None = None) -> ProtocolError:
    return ProtocolError(ErrorCode.BAD_REQUEST, message, request_id)


# ------------------------------------------------------------------------- rules, one per field


def _version_known(version: Any) -> bool:
    # The type first: True == 1 and 1.0 == 1, but neither is a version.
    return type(version) is int and version in SUPPORTED_VERSIONS


def _dtype_known(dtype: Any) -> TypeGuard[str]:
    return type(dtype) is str and dtype in ITEMSIZE


_INT_ONLY = {int}


def _plain_shape(shape: Any) -> TypeGuard[list[int]]:
    """A list of 1 to MAX_NDIM positive ints, in one pass (bool is an int subclass, but not of type int)."""
    return type(shape) is list and 0 < len(shape) <= MAX_NDIM and set(map(type, shape)) == _INT_ONLY and min(shape) > 0


_NUMBER_TYPES = (int, float)


def _client_ok(client: Any) -> bool:
    return client is None or (type(client) is str and 0 < len(client) <= MAX_ID_CHARS)


def _timeout_ok(timeout_ms: Any) -> bool:
    # Compared as numbers, never converted: float() of a 400-digit integer raises OverflowError.
    return timeout_ms is None or (type(timeout_ms) in _NUMBER_TYPES and 0 < timeout_ms <= MAX_TIMEOUT_MS)


# ------------------------------------------------------------------------------------- parsing


def parse_request(
    frames: Sequence[Frame], *, max_message_bytes: int
) -> tuple[bytes | None, InferRequest | InfoRequest | CancelRequest]:
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
    buffers = [as_buffer(frame) for frame in frames]
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

    Every request passes here first, so it asks the field rules in as few steps as it can; it never raises.
    """
    if not 0 < len(raw) <= MAX_HEADER_BYTES:
        return None
    try:
        header, end = SCAN_ONCE(raw.decode("utf-8"), 0)
    except (StopIteration, ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        return None
    if end != len(raw) or type(header) is not dict or header.get("op") != "infer":
        return None  # (end counts characters, so a non-ASCII header also goes the long way)
    request_id: Any
    request_id, dtype, shape, timeout_ms = (
        header.get("id"),
        header.get("dtype"),
        header.get("shape"),
        header.get("timeout_ms"),
    )
    version = header.get("v")
    if not (
        type(version) is int
        and version == PROTOCOL_VERSION  # version 2's tensors go the long way
        and _dtype_known(dtype)
        and check_request_id(request_id) is None
        and _plain_shape(shape)
        and _timeout_ok(timeout_ms)
        and _client_ok(client := header.get("client"))
    ):
        return None
    payload = payload_frame.buffer if type(payload_frame) is zmq.Frame else as_buffer(payload_frame)
    size = len(payload)
    if size != math.prod(shape) * ITEMSIZE[dtype] or size + len(raw) > max_message_bytes:
        return None
    timeout = None if timeout_ms is None else float(timeout_ms)
    return InferRequest(request_id, dtype, tuple(shape), payload, timeout, None, client)


def _parse_frames(buffers: list[Buffer], max_message_bytes: int) -> InferRequest | InfoRequest | CancelRequest:
    if not buffers:
        raise bad_request("empty message: expected frames [header] or [header, payload]")
    header_buf = buffers[0]
    if len(header_buf) > MAX_HEADER_BYTES:
        raise ProtocolError(
            ErrorCode.TOO_LARGE,
            f"header is {len(header_buf)} bytes; at most {MAX_HEADER_BYTES} are allowed",
        )
    try:
        header = load_header(header_buf)
    except ValueError as exc:
        raise bad_request(str(exc)) from None

    # The id comes first so that every later error can be matched to its request by the client.
    if "id" not in header:
        raise bad_request("header has no 'id'; give every request a string or integer id")
    request_id = header["id"]
    problem = check_request_id(request_id)
    if problem is not None:
        raise bad_request(problem)

    total = sum(len(buf) for buf in buffers)
    if total > max_message_bytes:
        raise ProtocolError(ErrorCode.TOO_LARGE, oversized_message(total, max_message_bytes, header, None), request_id)
    _check_version(header, request_id)
    op = header.get("op")
    if op == "infer" and header["v"] == TENSORS_VERSION:
        return _parse_tensors(header, request_id, buffers)
    if len(buffers) > 2:
        raise bad_request(f"message has {len(buffers)} frames; expected [header] or [header, payload]", request_id)

    if op == "infer":
        return _parse_infer(header, request_id, buffers)
    if op in ("info", "status", "cancel"):
        if len(buffers) != 1:
            raise bad_request(f"an {op!r} request is the header frame alone; drop the payload frame", request_id)
        return CancelRequest(request_id) if op == "cancel" else InfoRequest(request_id, op)
    raise bad_request(f"unknown 'op' {short_repr(op)}; expected 'infer', 'info', 'status' or 'cancel'", request_id)


def _check_version(header: dict[str, Any], request_id: RequestId) -> None:
    if "v" not in header:
        raise bad_request("header has no 'v'; set it to the protocol version, 1 (or 2 for named tensors)", request_id)
    version = header["v"]
    if _version_known(version):
        return
    if not is_int(version):
        raise bad_request(f"'v' must be an integer protocol version, got {json_type(version)}", request_id)
    raise ProtocolError(
        ErrorCode.UNSUPPORTED_VERSION,
        f"protocol version {short_repr(version)} is not supported; this server speaks {list(SUPPORTED_VERSIONS)}",
        request_id,
    )


def _parse_infer(header: dict[str, Any], request_id: RequestId, buffers: list[Buffer]) -> InferRequest:
    if len(buffers) != 2:
        raise bad_request("an 'infer' request needs a payload frame after the header", request_id)
    dtype = header.get("dtype")
    if not _dtype_known(dtype):
        raise bad_request(f"unknown 'dtype' {short_repr(dtype)}; expected one of {', '.join(DTYPES)}", request_id)
    shape = _parse_shape(header.get("shape"), request_id)
    timeout_ms = _parse_timeout(header.get("timeout_ms"), request_id)

    payload = buffers[1]
    expected = math.prod(shape) * ITEMSIZE[dtype]
    if len(payload) != expected:
        raise bad_request(
            f"payload is {len(payload)} bytes, but {dtype} of shape {list(shape)} needs {expected}",
            request_id,
        )
    return InferRequest(request_id, dtype, shape, payload, timeout_ms, None, _parse_client(header, request_id))


def _parse_tensors(header: dict[str, Any], request_id: RequestId, buffers: list[Buffer]) -> InferRequest:
    """A version-2 infer request: `inputs` lists each tensor's name, dtype and shape, one payload frame each."""
    inputs = header.get("inputs")
    if type(inputs) is not list or not 0 < len(inputs) <= MAX_TENSORS:
        what = f"{len(inputs)} tensors" if type(inputs) is list else json_type(inputs)
        raise bad_request(
            f"a version-2 'infer' needs 'inputs': an array of 1 to {MAX_TENSORS} objects "
            "{'name', 'dtype', 'shape'}, one per payload frame; got " + what,
            request_id,
        )
    if len(buffers) - 1 != len(inputs):
        raise bad_request(
            f"'inputs' lists {len(inputs)} tensors, but the message has {len(buffers) - 1} payload frames: send one "
            "frame per tensor, in the order 'inputs' lists them",
            request_id,
        )
    timeout_ms = _parse_timeout(header.get("timeout_ms"), request_id)
    tensors: list[Tensor] = []
    seen: set[str] = set()
    for k, (entry, payload) in enumerate(zip(inputs, buffers[1:], strict=True)):
        if type(entry) is not dict:
            raise bad_request(
                f"'inputs'[{k}] must be an object {{'name', 'dtype', 'shape'}}, got {json_type(entry)}", request_id
            )
        name: str = entry.get("name")  # type: ignore[assignment]  # checked on the next line
        problem = check_tensor_name(name)
        if problem is not None:
            raise bad_request(f"'inputs'[{k}]: {problem}", request_id)
        if name in seen:
            raise bad_request(f"input {name!r} is listed twice; give each input once", request_id)
        seen.add(name)
        dtype = entry.get("dtype")
        if not _dtype_known(dtype):
            raise bad_request(
                f"input {name!r}: unknown 'dtype' {short_repr(dtype)}; expected one of {', '.join(DTYPES)}", request_id
            )
        shape = _parse_shape(entry.get("shape"), request_id, f"input {name!r}: ")
        expected = math.prod(shape) * ITEMSIZE[dtype]
        if len(payload) != expected:
            raise bad_request(
                f"input {name!r}: its frame is {len(payload)} bytes; {dtype} of shape {list(shape)} needs {expected}",
                request_id,
            )
        tensors.append(Tensor(name, dtype, shape, payload))
    samples = {tensor.shape[0] for tensor in tensors}
    if len(samples) > 1:
        counts = ", ".join(f"{tensor.name} {tensor.shape[0]}" for tensor in tensors)
        raise bad_request(
            f"the inputs have different numbers of samples ({counts}); every input's first axis counts the same "
            "samples",
            request_id,
        )
    first = tensors[0]
    client = _parse_client(header, request_id)
    return InferRequest(request_id, first.dtype, first.shape, first.payload, timeout_ms, tuple(tensors), client)


def _parse_shape(shape: Any, request_id: RequestId, what: str = "") -> tuple[int, ...]:
    if _plain_shape(shape):
        return tuple(shape)
    if not isinstance(shape, list) or not shape:
        raise bad_request(f"{what}'shape' must be a non-empty array of integers, got {json_type(shape)}", request_id)
    if len(shape) > MAX_NDIM:
        raise bad_request(f"{what}'shape' has {len(shape)} dimensions; at most {MAX_NDIM} are allowed", request_id)
    for axis, size in enumerate(shape):
        if not is_int(size) or size < 1:
            raise bad_request(
                f"{what}'shape'[{axis}] is {short_repr(size)}; every dimension must be a positive integer "
                "(the first one, the number of samples, too)",
                request_id,
            )
    return tuple(shape)


def _parse_client(header: dict[str, Any], request_id: RequestId) -> str | None:
    client = header.get("client")
    if not _client_ok(client):
        raise bad_request(
            f"'client' must be a string of 1 to {MAX_ID_CHARS} characters naming the end client (or absent), "
            f"got {json_type(client)}",
            request_id,
        )
    return client


def _parse_timeout(timeout_ms: Any, request_id: RequestId) -> float | None:
    if not _timeout_ok(timeout_ms):
        raise bad_request(
            "'timeout_ms' must be a positive number of milliseconds no larger than "
            f"{MAX_TIMEOUT_MS!r} (or null for none), got {json_type(timeout_ms)}",
            request_id,
        )
    return None if timeout_ms is None else float(timeout_ms)


def oversized_message(size: int, limit: int, header: Mapping[str, Any] | None, max_samples: int | None) -> str:
    """What TOO_LARGE says for a message over the byte limit, in samples where they are known: the byte limit is
    the server's max_batch samples of the model's input plus the header's allowance, so for a model of large
    inputs it is what a request of too many samples meets first."""
    if max_samples is None:
        return f"message is {size} bytes; this server accepts at most {limit}: send fewer samples"
    shape = header.get("shape") if header is not None else None
    samples = shape[0] if isinstance(shape, list) and shape and is_int(shape[0]) else None
    what = "the message" if samples is None else f"the request of {samples} sample{'' if samples == 1 else 's'}"
    return (
        f"{what} is {size} bytes; this server takes at most {max_samples} samples, at most {limit} bytes in all: "
        "send fewer samples per request"
    )
