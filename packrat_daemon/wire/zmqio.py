"""Lean multipart send and receive for the request path (daemon, workers and the client).

pyzmq's ``send_multipart`` checks every part's type and combines flags as enums, its
``recv_multipart`` asks for RCVMORE through ``getsockopt`` per part, and ``Socket.get(EVENTS)``
wraps the answer in an enum. Each costs about a microsecond, and a round trip to a tiny model
passes through a dozen of them in processes whose caches the other processes have just evicted.
These helpers do the same work with plain ints and the frame's own ``more`` flag, through the
compiled socket methods. Measured with ``bench/e2e.py``'s tiny-model comparison. A message of far too many
frames is discarded by :func:`discarder`'s choice, without a Python object per frame.
"""

from __future__ import annotations

import ctypes
import functools
import os
import threading
from collections.abc import Callable, Sequence
from typing import Any, cast

import numpy as np
import zmq
from zmq.backend import Socket as _CompiledSocket

# Zero-copy sends cost more than a memcpy for small messages (pyzmq builds a tracked Frame per part):
# only tensors at least this big go out uncopied.
ZERO_COPY_MIN_BYTES = 64 * 1024

SNDMORE = int(zmq.SNDMORE)
NOBLOCK = int(zmq.NOBLOCK)
POLLIN = int(zmq.POLLIN)
_EVENTS = int(zmq.EVENTS)
_RCVMORE = int(zmq.RCVMORE)

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


# ---------------------------------------------------------------------------- discarding a message's frames

# Frames one zmq_recviov call takes: its table of (buffer, size) pairs is 16 bytes a frame (512 KiB in all).
DISCARD_BATCH = 1 << 15


def discard_python(socket: zmq.Socket, most: int) -> tuple[int, int, bool]:
    """Receive and drop up to `most` more frames of the message being received: (frames, bytes, whether its
    last frame was among them). Frame by frame through pyzmq, the portable way (a Frame's own `more` flag is
    cheaper than asking the socket for RCVMORE)."""
    frames = size = 0
    while frames < most:
        frame = _recv(socket, NOBLOCK, False, False)
        size += len(frame)
        frames += 1
        if not frame.more:
            return frames, size, True
    return frames, size, False


class _WordExp(ctypes.Structure):
    _fields_ = [("we_wordc", ctypes.c_size_t), ("we_wordv", ctypes.c_void_p), ("we_offs", ctypes.c_size_t)]


class VectorDiscard:
    """:func:`discard_python` in C, several times as fast: libzmq's ``zmq_recviov`` receives up to DISCARD_BATCH
    frames per call (without the GIL), stopping after the message's last one, and copies each into a buffer
    ``malloc`` gave it, which the caller frees.

    Freeing them one ``free`` call at a time from Python would cost about as much again as receiving them, so
    they are handed back in one call: ``wordfree`` frees each entry of a NULL-terminated vector of ``malloc``'d
    strings, then the vector (a ``malloc``'d one too), which is exactly what ``wordexp`` builds and what is built
    here from the buffers' addresses."""

    def __init__(self, libzmq: ctypes.CDLL, libc: ctypes.CDLL) -> None:
        self._recviov = libzmq.zmq_recviov
        self._recviov.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t), ctypes.c_int]
        self._recviov.restype = ctypes.c_int
        self._malloc = libc.malloc
        self._malloc.argtypes = [ctypes.c_size_t]
        self._malloc.restype = ctypes.c_void_p
        self._wordfree = libc.wordfree
        self._wordfree.argtypes = [ctypes.POINTER(_WordExp)]
        self._wordfree.restype = None
        self._free_one = libc.free
        self._free_one.argtypes = [ctypes.c_void_p]
        self._free_one.restype = None
        # struct iovec {void *iov_base; size_t iov_len;}: two words (size_t is a pointer's size on Linux)
        self._iov = (ctypes.c_size_t * (2 * DISCARD_BATCH))()
        self._table = np.frombuffer(memoryview(self._iov), dtype=np.uintp).reshape(DISCARD_BATCH, 2)
        self._count = ctypes.c_size_t()
        self._lock = threading.Lock()  # one table: a second thread's call would free this one's buffers

    def __call__(self, socket: zmq.Socket, most: int) -> tuple[int, int, bool]:
        if most <= 0:
            return 0, 0, False
        with self._lock:
            return self._discard(socket, most)

    def _discard(self, socket: zmq.Socket, most: int) -> tuple[int, int, bool]:
        self._count.value = min(most, DISCARD_BATCH)
        rc = self._recviov(socket.underlying, self._iov, ctypes.byref(self._count), NOBLOCK)
        frames = self._count.value  # those received, also when a later one failed
        if frames:
            taken = self._table[:frames]
            size = int(taken[:, 1].sum())
            self._free(taken[:, 0])
        elif rc < 0:  # nothing received (an allocator's malloc(0) may fail): pyzmq says why, or goes on
            return discard_python(socket, most)
        else:
            size = 0
        return frames, size, not _get(socket, _RCVMORE)

    def _free(self, buffers: np.ndarray) -> None:
        count = len(buffers)
        vector = self._malloc((count + 1) * ctypes.sizeof(ctypes.c_void_p))
        if not vector:  # no memory even for the vector: one at a time, then
            for address in buffers.tolist():
                self._free_one(address)
            return
        words = np.frombuffer(memoryview((ctypes.c_size_t * (count + 1)).from_address(vector)), dtype=np.uintp)
        words[:count] = buffers
        words[count] = 0
        self._wordfree(ctypes.byref(_WordExp(count, vector, 0)))


class CompiledDiscard:
    """:func:`discard_python` as a compiled loop (``_discard.c``), faster again than :class:`VectorDiscard`: every
    frame is received into one message, with no ``malloc``, copy or ``free`` a frame, through the addresses of
    libzmq's own ``zmq_msg_*`` functions in pyzmq's copy, without the GIL."""

    def __init__(self, libzmq: ctypes.CDLL, loop: Callable[..., tuple[int, int, bool]]) -> None:
        names = ("zmq_msg_init", "zmq_msg_recv", "zmq_msg_more", "zmq_msg_close")
        self._functions = tuple(cast(int, ctypes.cast(getattr(libzmq, name), ctypes.c_void_p).value) for name in names)
        self._loop = loop

    def __call__(self, socket: zmq.Socket, most: int) -> tuple[int, int, bool]:
        if most <= 0:
            return 0, 0, False
        frames, size, ended = self._loop(socket.underlying, most, *self._functions)
        if not frames and not ended:  # the first receive failed: pyzmq says why (zmq.Again when nothing waits)
            return discard_python(socket, most)
        return frames, size, ended


def _compiled_loop() -> Callable[..., tuple[int, int, bool]] | None:
    """The compiled loop, where the install could build it (it needs a C compiler)."""
    try:
        from packrat_daemon.wire import _discard
    except ImportError:
        return None
    return _discard.discard


def _pyzmq_libzmq() -> str | None:
    """The file of the libzmq this process runs pyzmq on (pyzmq's wheels bring their own), when exactly one is
    mapped: another copy's functions must never be called on pyzmq's sockets."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "/" in line}
    except OSError:
        return None
    found = [path for path in paths if os.path.basename(path).startswith("libzmq")]
    return found[0] if len(found) == 1 else None


# A discarder: (socket, most frames) -> (frames, bytes, whether the message's last frame was among them).
Discarder = Callable[[zmq.Socket, int], tuple[int, int, bool]]


def discarders() -> dict[str, Discarder]:
    """Every way this process has of discarding frames, slowest first: ``python`` (:func:`discard_python`); on
    pyzmq's own libzmq, where it is found and is the version pyzmq reports, ``zmq_recviov``
    (:class:`VectorDiscard`) and, where the install compiled the loop, ``compiled`` (:class:`CompiledDiscard`)."""
    found: dict[str, Discarder] = {"python": discard_python}
    path = _pyzmq_libzmq()
    if path is None:
        return found
    try:
        libzmq = ctypes.CDLL(path)  # already loaded: dlopen hands back that same library
        major, minor, patch = ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
        libzmq.zmq_version(ctypes.byref(major), ctypes.byref(minor), ctypes.byref(patch))
        if (major.value, minor.value, patch.value) != zmq.zmq_version_info():
            return found
        found["zmq_recviov"] = VectorDiscard(libzmq, ctypes.CDLL(None))
        loop = _compiled_loop()
        if loop is not None:
            found["compiled"] = CompiledDiscard(libzmq, loop)
    except (OSError, AttributeError):  # no such library or function here
        pass
    return found


@functools.cache
def discarder() -> Discarder:
    """The fastest of :func:`discarders`, chosen once, at the first message that needs it."""
    return list(discarders().values())[-1]
