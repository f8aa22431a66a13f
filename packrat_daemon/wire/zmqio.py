"""Lean multipart send and receive for the request path (daemon, workers and the client).

pyzmq's ``send_multipart`` checks every part's type and combines flags as enums, its
``recv_multipart`` asks for RCVMORE through ``getsockopt`` per part, and ``Socket.get(EVENTS)``
wraps the answer in an enum. Each costs about a microsecond, and a round trip to a tiny model
passes through a dozen of them in processes whose caches the other processes have just evicted.
These helpers do the same work with plain ints and the frame's own ``more`` flag, through the
compiled socket methods. Measured with ``bench/e2e.py``'s tiny-model comparison.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, cast

import zmq
from zmq.backend import Socket as _CompiledSocket

# Zero-copy sends cost more than a memcpy for small messages (pyzmq builds a tracked Frame per part):
# only tensors at least this big go out uncopied.
ZERO_COPY_MIN_BYTES = 64 * 1024

SNDMORE = int(zmq.SNDMORE)
NOBLOCK = int(zmq.NOBLOCK)
POLLIN = int(zmq.POLLIN)
_EVENTS = int(zmq.EVENTS)

_send = _CompiledSocket.send
_recv = _CompiledSocket.recv
# An integer option's value is an int (the stubs allow bytes for every option).
_get = cast(Callable[[zmq.Socket, int], int], _CompiledSocket.get)


def send_frames(socket: zmq.Socket, frames: Sequence[Any], flags: int = 0, copy: bool = True) -> None:
    """Send ``frames`` as one multipart message (``flags`` may add NOBLOCK)."""
    last = len(frames) - 1
    more = flags | SNDMORE
    for index, frame in enumerate(frames):
        _send(socket, frame, flags if index == last else more, copy, False)


def recv_frames(socket: zmq.Socket, flags: int = 0) -> list[zmq.Frame]:
    """Receive one multipart message as frames (no copy of the payload)."""
    frames = [_recv(socket, flags, False, False)]
    while frames[-1].more:
        frames.append(_recv(socket, flags, False, False))
    return frames


def readable(socket: zmq.Socket) -> bool:
    """A message is waiting (much cheaper than a NOBLOCK receive that raises zmq.Again)."""
    return bool(_get(socket, _EVENTS) & POLLIN)
