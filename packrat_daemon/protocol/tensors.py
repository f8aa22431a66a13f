"""Open Inference Protocol tensors: its datatype names, and numpy arrays from and to its three encodings
(JSON `data`, the REST binary-data extension, gRPC `raw_*_contents` and typed `contents`).

Transport-free: the REST and gRPC frontends hand bytes or decoded JSON values here and get arrays back.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from packrat_daemon.protocol.errors import OipError, Status
from packrat_daemon.wire.codec import DTYPES, MAX_NDIM

# OIP datatype → Packrat's wire dtype (docs/protocol.md, section 3). BF16 is not in the protocol's base table;
# Triton's extension name is taken: its raw form is the upper 16 bits of the binary32 (as Packrat's bfloat16).
PACKRAT_DTYPE: dict[str, str] = {
    "BOOL": "bool",
    "UINT8": "uint8",
    "INT8": "int8",
    "INT16": "int16",
    "INT32": "int32",
    "INT64": "int64",
    "FP16": "float16",
    "FP32": "float32",
    "FP64": "float64",
    "BF16": "bfloat16",
}
OIP_DATATYPE: dict[str, str] = {packrat: oip for oip, packrat in PACKRAT_DTYPE.items()}
# Datatypes of the protocol that no Packrat model takes: named in the error, so a client knows it is not a typo.
UNSERVED = ("UINT16", "UINT32", "UINT64", "BYTES")

# How a JSON number list must look for each datatype: a bool list for BOOL, integers for the integer types
# (a 1.5 sent as INT32 is refused, not truncated), any number for the float types.
_JSON_KIND = {"BOOL": "b", "FP16": "f", "FP32": "f", "FP64": "f", "BF16": "f"}


def itemsize(datatype: str) -> int:
    return DTYPES[PACKRAT_DTYPE[datatype]].itemsize


def check_datatype(datatype: Any, name: str) -> str:
    """The datatype of tensor `name` if Packrat can carry it; else INVALID_ARGUMENT naming the choices."""
    if isinstance(datatype, str) and datatype in PACKRAT_DTYPE:
        return datatype
    if datatype in UNSERVED:
        raise OipError(Status.INVALID_ARGUMENT, f"tensor '{name}': datatype {datatype} is not served by Packrat")
    raise OipError(
        Status.INVALID_ARGUMENT,
        f"tensor '{name}': unknown datatype {datatype!r}; expected one of {', '.join(PACKRAT_DTYPE)}",
    )


def check_shape(shape: Any, name: str) -> tuple[int, ...]:
    """A request tensor's shape: 1 to 32 dimensions, each a positive integer (Packrat sends no empty tensor)."""
    if (
        not isinstance(shape, Sequence)
        or isinstance(shape, str | bytes)
        or not 1 <= len(shape) <= MAX_NDIM
        or not all(type(dim) is int and dim >= 1 for dim in shape)
    ):
        raise OipError(
            Status.INVALID_ARGUMENT,
            f"tensor '{name}': shape must be 1 to {MAX_NDIM} positive integers, the first counting samples; "
            f"got {str(shape)[:80]}",
        )
    return tuple(shape)


def from_bytes(buffer: bytes | bytearray | memoryview, datatype: str, shape: tuple[int, ...], name: str) -> np.ndarray:
    """The tensor in `buffer` (little-endian, row-major), without a copy; its size must be exactly right."""
    expected = math.prod(shape) * itemsize(datatype)
    if len(buffer) != expected:
        raise OipError(
            Status.INVALID_ARGUMENT,
            f"tensor '{name}': {len(buffer)} bytes of data, but {datatype} of shape {list(shape)} takes {expected}",
        )
    return np.frombuffer(buffer, dtype=DTYPES[PACKRAT_DTYPE[datatype]]).reshape(shape)


def from_values(values: Any, datatype: str, shape: tuple[int, ...], name: str) -> np.ndarray:
    """The tensor from JSON values (flat or nested, row-major) or a gRPC typed-contents list."""
    try:
        array = np.asarray(values)
    except ValueError:
        raise OipError(Status.INVALID_ARGUMENT, f"tensor '{name}': data is a ragged list") from None
    kind = array.dtype.kind
    wanted = _JSON_KIND.get(datatype, "i")
    # An integer list is fine for a float tensor, a bool list only for BOOL; strings and objects never.
    fits = kind == wanted or (wanted == "f" and kind in "iu") or (wanted == "i" and kind == "u") or array.size == 0
    if not fits:
        words = {"b": "booleans", "i": "integers", "u": "integers", "f": "non-integer numbers", "U": "strings"}
        got = words.get(kind, "mixed values")
        raise OipError(Status.INVALID_ARGUMENT, f"tensor '{name}': data holds {got}, but its datatype is {datatype}")
    if array.size != math.prod(shape):
        raise OipError(
            Status.INVALID_ARGUMENT,
            f"tensor '{name}': data has {array.size} elements, but shape {list(shape)} has {math.prod(shape)}",
        )
    if datatype == "BF16":
        return float_to_bf16_bits(array.astype(np.float32)).reshape(shape)
    target = DTYPES[PACKRAT_DTYPE[datatype]]
    if kind in "iu" and target.kind in "iu":
        info = np.iinfo(target)
        if array.size and (array.min() < info.min or array.max() > info.max):
            raise OipError(Status.INVALID_ARGUMENT, f"tensor '{name}': a value is out of the range of {datatype}")
    return array.astype(target, copy=False).reshape(shape)


def to_values(array: np.ndarray, datatype: str) -> list[Any]:
    """A result tensor as the flat JSON list of the REST `data` field (BF16 as the floats it stands for)."""
    if datatype == "BF16":
        return bf16_bits_to_float(array).reshape(-1).tolist()
    return array.reshape(-1).tolist()


def float_to_bf16_bits(values: np.ndarray) -> np.ndarray:
    """bfloat16 bits of float32 values, rounded to nearest even (NaN stays NaN)."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return np.where(np.isnan(values), np.uint32(0x7FC0), rounded).astype(np.uint16)


def bf16_bits_to_float(bits: np.ndarray) -> np.ndarray:
    return (np.ascontiguousarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)
