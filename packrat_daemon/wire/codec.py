"""Packrat wire protocol, versions 1 and 2: what both sides share. Limits, dtypes, error codes, the header's
JSON codec, the rule for request ids and tensor names, and the record layout of several tensors.

A client message is ``[header, payload]`` (infer, version 1: one unnamed tensor), ``[header, payload, ...]``
(infer, version 2: one frame per named tensor the header lists) or ``[header]`` (info); a reply is
``[header]``, ``[header, payload]`` (version 1) or ``[header, payload, ...]`` (version 2). The header is a
UTF-8 JSON object, each payload raw little-endian C-order tensor bytes. docs/protocol.md is the normative
description; this module, the server's side (:mod:`~packrat_daemon.wire.server_side` parses requests,
:mod:`~packrat_daemon.wire.model_checks` checks them, :mod:`~packrat_daemon.wire.server_replies` encodes replies)
and :mod:`~packrat_daemon.wire.client_side` (encode requests, decode replies) are its reference implementation.
None of them may import torch: the client imports them and has to start fast.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

import numpy as np
import zmq

# The error codes and the request id's type are the errors' (a ServerError carries both); imported here too, so
# the protocol's vocabulary is all in the codec for its users.
from packrat_daemon.wire.errors import ErrorCode, PackratError, RequestId

PROTOCOL_VERSION = 1
# Version 2 names its tensors: several inputs in, several outputs out. Version 1 (one unnamed tensor each way)
# is still spoken, unchanged, so that every client written for it keeps working.
TENSORS_VERSION = 2
SUPPORTED_VERSIONS: tuple[int, ...] = (1, TENSORS_VERSION)
# Version 2's bounds, checked before anything is allocated for the tensors a header lists.
MAX_TENSORS = 32
MAX_NAME_CHARS = 128
MAX_HEADER_BYTES = 65536
MAX_ID_CHARS = 128
# Ids cross language boundaries: keep integer ids inside a signed 64-bit range every client can hold.
MIN_INT_ID = -(2**63)
MAX_INT_ID = 2**63 - 1
# numpy itself refuses more than 64 dimensions; no model input comes near 32.
MAX_NDIM = 32
# The longest timeout_ms a request may carry: the largest signed 32-bit integer (about 24.8 days), so a
# client in any language can hold it, and a deadline computed from it is always a finite float.
MAX_TIMEOUT_MS = 2**31 - 1

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
ITEMSIZE: dict[str, int] = {name: dt.itemsize for name, dt in DTYPES.items()}

Frame = bytes | bytearray | memoryview | zmq.Frame
Buffer = bytes | memoryview


class ProtocolError(PackratError):
    """A message broke the protocol; ``code`` is what the server answers (or the client reports).

    ``delimiter`` is set by the server's ``parse_request`` to the empty frame the request started with
    (REQ clients), or None, so the frontend can echo it in the error reply as it does for results.
    """

    def __init__(self, code: ErrorCode, message: str, request_id: RequestId | None = None) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.request_id = request_id
        self.delimiter: bytes | None = None


# ------------------------------------------------------------------------------------------ frames


def as_buffer(frame: Frame) -> Buffer:
    """A byte-addressed view of one frame, without copying the (possibly large) payload."""
    if isinstance(frame, bytes):
        return frame
    if isinstance(frame, zmq.Frame):
        return frame.buffer
    view = memoryview(frame)
    if view.ndim != 1 or view.itemsize != 1:
        view = view.cast("B")
    return view


# ------------------------------------------------------------------------------------- header JSON


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


def dump_header(header: Mapping[str, Any]) -> bytes:
    """A header as compact UTF-8 JSON; ValueError for NaN or infinity, which JSON cannot carry."""
    return _ENCODER.encode(header).encode("utf-8")


def _reject_constant(name: str) -> Any:
    # NaN and Infinity are not JSON; clients in other languages could not read them back.
    raise ValueError(f"{name} is not valid JSON")


_DECODER = json.JSONDecoder(parse_constant=_reject_constant)
# The scanner itself, not decode(): that wraps it in two whitespace regex matches. The request fast path
# calls it directly; anything it does not take in one piece goes through load_header, which words the error.
SCAN_ONCE: Callable[[str, int], tuple[Any, int]] = _DECODER.scan_once  # type: ignore[attr-defined]


def _scan(text: str) -> tuple[Any, int]:
    """(value, end) of the JSON value at the start of ``text``; the full decoder words any failure."""
    try:
        return SCAN_ONCE(text, 0)
    except StopIteration:
        return _DECODER.decode(text), len(text)  # raises ValueError with the position, or succeeds


def load_header(buf: Buffer | zmq.Frame) -> dict[str, Any]:
    """Decode a header frame into a dict, or raise ``ValueError`` saying why it is not one."""
    try:
        text = (buf.bytes if type(buf) is zmq.Frame else bytes(cast(Buffer, buf))).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"header is not valid UTF-8 ({exc.reason} at byte {exc.start})") from None
    try:
        header, end = _scan(text)
        if end != len(text):  # leading or trailing whitespace, extra data: the long way, which words errors
            header = _DECODER.decode(text)
    except RecursionError:
        raise ValueError("header JSON is nested too deeply") from None
    except ValueError as exc:
        raise ValueError(f"header is not valid JSON ({exc})") from None
    if not isinstance(header, dict):
        raise ValueError(f"header must be a JSON object, got a JSON {type(header).__name__}")
    return header


# -------------------------------------------------------------------------------- JSON value rules


def is_int(value: Any) -> bool:
    # bool is an int subclass in Python, but true/false are never valid where the protocol wants a number.
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def short_repr(value: Any, limit: int = 40) -> str:
    """``repr(value)`` cut to ``limit`` characters: error messages quote what they were sent, which may be huge."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[: limit - 3]}..."


def json_type(value: Any) -> str:
    """How to name a JSON value in an error message."""
    names = {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null"}
    if is_number(value):
        return f"the number {short_repr(value)}"
    return names.get(type(value), type(value).__name__)


def check_request_id(request_id: Any) -> str | None:
    """Return why ``request_id`` is not a valid id, or None if it is one.

    The one rule for ids, on both sides: the server's fast path and full parser, and the client's encoders.
    """
    if type(request_id) is int and MIN_INT_ID <= request_id <= MAX_INT_ID:
        return None  # the common case, first: it is asked once per request
    if isinstance(request_id, str):
        if len(request_id) > MAX_ID_CHARS:
            return f"'id' is {len(request_id)} characters long; at most {MAX_ID_CHARS} are allowed"
        if not request_id.isascii():
            try:
                request_id.encode("utf-8")
            except UnicodeEncodeError:
                # JSON's \ud800 escapes decode to lone surrogates, which no UTF-8 reply could echo.
                return "'id' holds a lone surrogate escape (\\ud800-\\udfff), which is not Unicode text"
        return None
    if is_int(request_id):  # int subclasses (an IntEnum) too, from the client's callers
        if not MIN_INT_ID <= request_id <= MAX_INT_ID:
            return "'id' integer does not fit in a signed 64-bit integer"
        return None
    return f"'id' must be a string or an integer, got {json_type(request_id)}"


def check_tensor_name(name: Any) -> str | None:
    """Why ``name`` is not a valid tensor name (version 2), or None: 1 to MAX_NAME_CHARS printable ASCII
    characters, so that every client can write it and every error can quote it."""
    if type(name) is not str:
        return f"a tensor's 'name' must be a string, got {json_type(name)}"
    if not 0 < len(name) <= MAX_NAME_CHARS:
        return f"a tensor's 'name' has {len(name)} characters; give 1 to {MAX_NAME_CHARS}"
    if not (name.isascii() and name.isprintable()):
        return f"tensor name {short_repr(name)} must be printable ASCII"
    return None


# ------------------------------------------------------------------------------------- records
#
# Inside the daemon a request of several tensors travels as one: each sample's bytes of every tensor, one after
# another, make one row of bytes (a record), so that batching, splitting, shared memory and gathering move rows
# as they do for one tensor. A record's layout is the tensors' (dtype, per-sample shape), in order.

Layout = Sequence[tuple[str, Sequence[int]]]


def record_bytes(layout: Layout) -> int:
    """Bytes of one sample's record."""
    return sum(ITEMSIZE[dtype] * _count(shape) for dtype, shape in layout)


def _count(shape: Sequence[int]) -> int:
    count = 1
    for size in shape:
        count *= size
    return count


def pack_records(arrays: Sequence[np.ndarray]) -> np.ndarray:
    """``(samples, record bytes)`` uint8: row k holds sample k of every array in turn (each C-ordered)."""
    samples = arrays[0].shape[0]
    pieces = [np.ascontiguousarray(a).reshape(samples, -1).view(np.uint8) for a in arrays]
    return pieces[0] if len(pieces) == 1 else np.concatenate(pieces, axis=1)


def unpack_records(rows: np.ndarray, layout: Layout) -> list[np.ndarray]:
    """The arrays ``pack_records`` packed into ``rows`` (uint8, one record per row), by ``layout``; copies."""
    samples = rows.shape[0]
    rows = rows.reshape(samples, -1)
    if rows.shape[1] != record_bytes(layout):
        raise ValueError(f"records of {rows.shape[1]} bytes, but the layout needs {record_bytes(layout)}")
    arrays, start = [], 0
    for dtype, shape in layout:
        end = start + ITEMSIZE[dtype] * _count(shape)
        piece = np.ascontiguousarray(rows[:, start:end])
        arrays.append(piece.view(DTYPES[dtype]).reshape(samples, *shape))
        start = end
    return arrays
