"""Messages between the daemon and its template and workers (internal, over ipc://).

Every message is multipart: [kind + separator + header, *payload frames]. Kinds are short ASCII verbs.
Kind and header share one frame because every extra frame is one more send call on the hot path.
The header is JSON after a space; the two messages of every request, RUN and RESULT, carry theirs
packed in binary after a NUL instead (fixed fields, no JSON encoding or parsing per request). Their
_SHARED forms carry no payload: the tensor is in shared memory (workers.arena); the header says where.
This module must not import torch: the daemon uses it too.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Sequence
from typing import Any

import numpy as np

# daemon → template
SPAWN = b"spawn"  # {"worker", "threads", "cores", "warmup"}
# daemon → worker
RUN = b"run"  # {"job", "dtype", "shape"} + input payload frames (joined in order)
RUN_SHARED = b"run-shared"  # RUN's header, ARENA_FIELDS and "offset", no payload: the input is in a daemon's arena
CONFIGURE = b"configure"  # {"threads", "cores"}: re-thread and re-pin in place
STOP = b"stop"  # {}
# template/worker → daemon
READY = b"ready"  # template: {"pid", "input", "model", "runtime"}; worker: {"worker", "pid", "threads", "cores"}
SPAWNED = b"spawned"  # {"worker", "pid"}
EXITED = b"exited"  # {"worker", "pid", "status"} and, after a boot failure, "error": the worker's own account
RESULT = b"result"  # {"job", "dtype", "shape", "compute_ms", "threads", "batch"} + output payload
RESULT_SHARED = b"result-shared"  # RESULT's header and ARENA_FIELDS: the output is in the worker's arena
FAILED = b"failed"  # {"job", "message"}
CONFIGURED = b"configured"  # {"worker", "threads", "cores"}
HEARTBEAT = b"heartbeat"  # {"worker"}

TEMPLATE_IDENTITY = b"template"

# A worker that fails before it is ready (pinning, threads, warm-up) exits with this status, after
# gunicorn's WORKER_BOOT_ERROR: the daemon then backs off before forking again, where a crash after
# ready is replaced at once, since a model that cannot start would otherwise be re-forked in a loop.
WORKER_BOOT_ERROR = 3


def worker_identity(worker_id: int) -> bytes:
    return f"w{worker_id}".encode()


# json.dumps with arguments builds a new encoder on every call; this one is built once.
_encode_json = json.JSONEncoder(separators=(",", ":")).encode


def encode(kind: bytes, header: dict[str, Any], payload: Sequence[Any] = ()) -> list[Any]:
    packer = _PACKERS.get(kind)
    if packer is not None and header.keys() == packer.keys:
        return [kind + b"\0" + packer.pack(header), *payload]
    return [kind + b" " + _encode_json(header).encode(), *payload]


_decode_json = json.JSONDecoder().decode  # from str: json.loads sniffs the encoding of bytes first


def decode(frames: Sequence[Any]) -> tuple[bytes, dict[str, Any], list[Any]]:
    first = bytes(frames[0])
    cut = first.find(b"\0")  # JSON never holds a raw NUL: one marks a binary header
    if cut > 0:
        kind = first[:cut]
        return kind, _PACKERS[kind].unpack(first, cut + 1), list(frames[1:])
    kind, _, header = first.partition(b" ")
    return kind, (_decode_json(header.decode()) if header else {}), list(frames[1:])


class _Packer:
    """One message's header in binary: fixed numeric fields, then the dtype name and the shape."""

    def __init__(self, numbers: tuple[str, ...], layout: str) -> None:
        self.numbers = numbers
        self.head = struct.Struct("<" + layout + "BB")  # ..., len(dtype name), len(shape)
        self.keys = {*numbers, "dtype", "shape"}

    def pack(self, header: dict[str, Any]) -> bytes:
        dtype, shape = header["dtype"].encode(), header["shape"]
        head = self.head.pack(*[header[name] for name in self.numbers], len(dtype), len(shape))
        return head + dtype + _SHAPES[len(shape)].pack(*shape)

    def unpack(self, data: bytes, offset: int) -> dict[str, Any]:
        *numbers, name_len, ndim = self.head.unpack_from(data, offset)
        offset += self.head.size
        header = dict(zip(self.numbers, numbers, strict=True))
        header["dtype"] = data[offset : offset + name_len].decode()
        header["shape"] = list(_SHAPES[ndim].unpack_from(data, offset + name_len))
        return header


# One compiled Struct per rank: a format string built per message costs a lookup in struct's cache.
_SHAPES = [struct.Struct(f"<{ndim}q") for ndim in range(256)]


_PACKERS = {
    RUN: _Packer(("job",), "Q"),
    RESULT: _Packer(("job", "compute_ms", "threads", "batch"), "QdII"),
    RUN_SHARED: _Packer(("job", "pid", "fd", "serial", "size", "offset"), "QiiQQQ"),
    RESULT_SHARED: _Packer(("job", "compute_ms", "threads", "batch", "pid", "fd", "serial", "size"), "QdIIiiQQ"),
}

ARENA_FIELDS = ("pid", "fd", "serial", "size")  # the _SHARED headers' workers.arena.Location


_NUMPY_NAMES: dict[np.dtype, str] = {}


def numpy_name(dtype: np.dtype) -> str:
    """``dtype.name`` as headers carry it, remembered: numpy computes it in Python on every access."""
    name = _NUMPY_NAMES.get(dtype)
    if name is None:
        name = _NUMPY_NAMES[dtype] = dtype.name
    return name


_NUMPY_DTYPES: dict[str, np.dtype] = {}


def numpy_dtype(name: str) -> np.dtype:
    """``np.dtype(name)``, remembered: numpy parses the name on every call, and a header names it per job."""
    dtype = _NUMPY_DTYPES.get(name)
    if dtype is None:
        dtype = _NUMPY_DTYPES[name] = np.dtype(name)
    return dtype
