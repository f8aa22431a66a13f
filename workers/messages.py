"""Messages between the daemon and its template and workers (internal, over ipc://).

Every message is multipart: [kind + b" " + header JSON, *payload frames]. Kinds are short ASCII verbs.
Kind and header share one frame because every extra frame is one more send call on the hot path.
This module must not import torch: the daemon uses it too.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np

# daemon → template
SPAWN = b"spawn"  # {"worker", "threads", "cores", "warmup"}
# daemon → worker
RUN = b"run"  # {"job", "dtype", "shape"} + input payload frames (joined in order)
CONFIGURE = b"configure"  # {"threads", "cores"}: re-thread and re-pin in place
STOP = b"stop"  # {}
# template/worker → daemon
READY = b"ready"  # template: {"pid", "input", "model", "runtime"}; worker: {"worker", "pid", "threads", "cores"}
SPAWNED = b"spawned"  # {"worker", "pid"}
EXITED = b"exited"  # {"worker", "pid", "status"}
RESULT = b"result"  # {"job", "dtype", "shape", "compute_ms"} + output payload
FAILED = b"failed"  # {"job", "message"}
CONFIGURED = b"configured"  # {"worker", "threads", "cores"}
HEARTBEAT = b"heartbeat"  # {"worker"}

TEMPLATE_IDENTITY = b"template"


def worker_identity(worker_id: int) -> bytes:
    return f"w{worker_id}".encode()


# json.dumps with arguments builds a new encoder on every call; this one is built once.
_encode_json = json.JSONEncoder(separators=(",", ":")).encode


def encode(kind: bytes, header: dict[str, Any], payload: Sequence[Any] = ()) -> list[Any]:
    return [kind + b" " + _encode_json(header).encode(), *payload]


_decode_json = json.JSONDecoder().decode  # from str: json.loads sniffs the encoding of bytes first


def decode(frames: Sequence[Any]) -> tuple[bytes, dict[str, Any], list[Any]]:
    kind, _, header = bytes(frames[0]).partition(b" ")
    return kind, (_decode_json(header.decode()) if header else {}), list(frames[1:])


_NUMPY_NAMES: dict[np.dtype, str] = {}


def numpy_name(dtype: np.dtype) -> str:
    """``dtype.name`` as headers carry it, remembered: numpy computes it in Python on every access."""
    name = _NUMPY_NAMES.get(dtype)
    if name is None:
        name = _NUMPY_NAMES[dtype] = dtype.name
    return name
