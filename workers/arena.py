"""Shared memory between the daemon and a worker, so that big tensors do not travel through the socket.

Each side writes only into arenas it owns and reads the other side's. An arena is a memfd: anonymous
shared memory with no name in /dev/shm, so nothing is left behind whoever dies, SIGKILL included; the
kernel frees it when the last process holding it is gone. The peer maps it by reopening
``/proc/OWNER_PID/fd/FD`` (the same user may, without ptrace rights beyond reading), and a small
header over ZeroMQ says where the tensor is: the owner's pid, the fd, a serial number that changes
whenever the owner replaces the arena with a bigger one, and its size.

Who may write when is the daemon's rule (``packrat_daemon.pool``): it writes a worker's input only
while that worker has no job outstanding, and a worker writes its output into its own arena only for
a job that came through shared memory, which the daemon copies out before it sends that worker more.
This module must not import torch: the daemon uses it too.
"""

from __future__ import annotations

import contextlib
import itertools
import mmap
import os
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

# Below this a tensor goes as ZeroMQ frames: one send of a small frame costs less than the copy into the
# arena plus the header, and tiny models must not get slower.
SHARED_MIN_BYTES = 64 * 1024
MIN_ARENA_BYTES = 1 << 20  # an arena grows by doubling from here; untouched pages cost no memory

_serials = itertools.count(1)  # unique within a process, so a reused fd number is never mistaken


class Location(NamedTuple):
    """Where an owner's arena is: enough for a peer to map it."""

    pid: int
    fd: int
    serial: int
    size: int


class Arena:
    """A growable shared region that this process writes and one peer reads, from offset 0."""

    def __init__(self, label: str) -> None:
        self.label = label
        self._fd = -1
        self._map: mmap.mmap | None = None
        self.location = Location(os.getpid(), -1, 0, 0)

    def write(self, frames: Sequence[Any], nbytes: int) -> Location:
        """Copy `frames` (C-contiguous byte views, `nbytes` together) to the start of the arena."""
        if nbytes > self.location.size or self._map is None:
            self._replace(max(nbytes, 2 * self.location.size, MIN_ARENA_BYTES))
        assert self._map is not None
        offset = 0
        for frame in frames:
            end = offset + memoryview(frame).nbytes
            self._map[offset:end] = frame  # slice assignment copies without exporting the map's buffer
            offset = end
        return self.location

    def _replace(self, size: int) -> None:
        size = -(-size // mmap.PAGESIZE) * mmap.PAGESIZE
        fd = os.memfd_create(f"packrat-{self.label}", os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, size)
            mapped = mmap.mmap(fd, size)
        except BaseException:
            os.close(fd)
            raise
        self.close()  # the peer keeps its own mapping of the old one until it sees the new serial
        self._fd, self._map = fd, mapped
        self.location = Location(os.getpid(), fd, next(_serials), size)

    def close(self) -> None:
        if self._map is not None:
            self._map.close()  # never exported (see write), so this cannot raise BufferError
            self._map = None
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class PeerArena:
    """The peer's arena as mapped here, remapped when the peer replaces it."""

    def __init__(self) -> None:
        self._key: tuple[int, int, int] | None = None
        self._map: mmap.mmap | None = None

    def array(self, location: Location, dtype: np.dtype, shape: Sequence[int]) -> np.ndarray:
        """A view of the tensor at the start of the peer's arena (valid until the peer writes again)."""
        key = location[:3]
        if key != self._key or self._map is None:
            self._remap(location)
        count = 1
        for extent in shape:
            count *= extent
        return np.frombuffer(self._map, dtype=dtype, count=count).reshape(shape)

    def _remap(self, location: Location) -> None:
        pid, fd, _, size = location
        handle = os.open(f"/proc/{pid}/fd/{fd}", os.O_RDWR | os.O_CLOEXEC)
        try:
            mapped = mmap.mmap(handle, size)
        finally:
            os.close(handle)
        self.close()
        self._key, self._map = (location.pid, location.fd, location.serial), mapped

    def close(self) -> None:
        if self._map is not None:
            # A view still alive (a tensor the runtime holds on to) keeps the mapping; dropping our
            # reference lets it go with the last view.
            with contextlib.suppress(BufferError):
                self._map.close()
            self._map = None
        self._key = None
