"""What a message over the frontend's limits costs and how it is refused: the error for a message over the byte
limit or of too many frames (with its id where its header is readable), the state of one being discarded, and the
process memory those discards grow and give back (docs/protocol.md, "Limits and memory").
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import resource
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import zmq

from packrat_daemon.wire.codec import MAX_HEADER_BYTES, ErrorCode, ProtocolError, check_request_id, load_header
from packrat_daemon.wire.server_side import oversized_message

# A message of more frames than this was buffered whole by libzmq (about 64 bytes a frame, empty or not) before the
# daemon could refuse it; glibc keeps what libzmq freed, so the daemon hands it back (malloc_trim), at most once a
# TRIM_EVERY_S: one message of 10 million empty frames left the daemon 610 MiB larger for good.
TRIM_AFTER_FRAMES = 100_000
TRIM_EVERY_S = 1.0


@dataclass(slots=True)
class Oversized:
    """A message of more than MAX_KEPT_FRAMES frames while its rest is discarded: the frames its answer needs (the
    identity, then the header, after a REQ client's delimiter where it sent one), its size and frames so far."""

    frames: list[zmq.Frame]
    size: int
    count: int
    started: float  # when its first frame was read (time.monotonic)
    unbounded_below: int | None = None  # the receive queues are unbounded until the peak memory reaches this


def peak_memory() -> int:
    """The most memory this process has held at once, in bytes (Linux counts ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


_trimmed_at = -math.inf


def give_back_memory() -> bool:
    """Return the heap's free memory to the system (glibc's malloc_trim), at most once a TRIM_EVERY_S; True when
    it ran. Elsewhere than glibc there is nothing to call, and nothing is done."""
    global _trimmed_at
    now = time.monotonic()
    if now - _trimmed_at < TRIM_EVERY_S or _MALLOC_TRIM is None:
        return False
    _trimmed_at = now
    _MALLOC_TRIM(0)
    return True


def _malloc_trim() -> Callable[[int], int] | None:
    try:
        return ctypes.CDLL(None).malloc_trim
    except (AttributeError, OSError):
        return None


_MALLOC_TRIM = _malloc_trim()


def refuse_oversized(frames: list[zmq.Frame], size: int, count: int, limit: int, max_samples: int) -> None:
    """Raise the error for a message over the byte limit (in samples, where its header says them) or with dropped
    frames, with its id when readable."""
    request_id, loaded = None, None
    header = frames[1] if frames and len(frames[0]) == 0 and len(frames) > 1 else frames[0] if frames else None
    if header is not None and len(header) <= MAX_HEADER_BYTES:
        with contextlib.suppress(ValueError):
            loaded = load_header(header)
            request_id = _readable_id(loaded)
    if size > limit:
        message = oversized_message(size, limit, loaded, max_samples)
        error = ProtocolError(ErrorCode.TOO_LARGE, message, request_id)
    else:
        delimited = bool(frames) and len(frames[0]) == 0
        message = f"message has {count - delimited} frames; expected [header] or [header, payload]"
        error = ProtocolError(ErrorCode.BAD_REQUEST, message, request_id)
    error.delimiter = b"" if frames and len(frames[0]) == 0 else None
    raise error


def _readable_id(header: dict[str, Any]) -> Any:
    request_id = header.get("id")
    return request_id if check_request_id(request_id) is None else None
