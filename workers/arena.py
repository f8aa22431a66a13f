"""Shared memory between the daemon and a worker, so that big tensors do not travel through the socket.

Each side writes only into arenas it owns and reads the other side's. An arena is a memfd: anonymous
shared memory with no name in /dev/shm, so nothing is left behind whoever dies, SIGKILL included; the
kernel frees it when the last process holding it is gone. The peer maps it by reopening
``/proc/OWNER_PID/fd/FD`` (the same user may, without ptrace rights beyond reading), and a small
header over ZeroMQ says where the tensor is: the owner's pid, the fd, a serial number that changes
whenever the owner replaces the arena with a bigger one, and its size.

Who may write when is the daemon's rule (``packrat_daemon.fleet.pool``): it writes a worker's input only
while that worker has no job outstanding, and a worker writes its output into its own arena only for
a job that came through shared memory, which the daemon copies out before it sends that worker more.

A big request's payload is copied once, on arrival, into the daemon's ``Inbox``: shared memory that
any worker may read. A slice that lies within one such payload then goes to its worker as a header
only (``locate``), with no copy at dispatch, whichever worker takes it and whether or not it is busy.
A payload's memory is reused only once its request object is gone, so no worker reads it after that
except for an abandoned job, whose answer the daemon drops. The daemon reserves one place per payload
size it can be sent before it opens (``Inbox.reserve``), paged in: the first payload of a size would
otherwise pay a page fault per 4 KiB page while the daemon's one loop waits, several milliseconds for a
batch of images. A burst's extra places are closed once idle (``Inbox.trim``) and a worker's input arena
is made at its largest size at once (``Arena.reserve``), so the daemon's resident size does not climb in
steps, one per record burst or record slice, over a long run.

A slab that cannot be made (no file descriptor left, no memory for a memfd) is not a failed request: the
payload stays in its ZeroMQ frame and travels as frames, and a warning says why, once a minute at most.
This module must not import torch: the daemon uses it too.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import mmap
import os
import time
import weakref
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

import numpy as np

# Below this a tensor goes as ZeroMQ frames: one send of a small frame costs less than the copy into the
# arena plus the header, and tiny models must not get slower.
SHARED_MIN_BYTES = 64 * 1024
MIN_ARENA_BYTES = 1 << 20  # an arena grows by doubling from here; untouched pages cost no memory
# madvise's "fault every page in for writing" (Linux 5.14 and later); Python 3.11's mmap lacks the name.
MADV_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23)

_serials = itertools.count(1)  # unique within a process, so a reused fd number is never mistaken

log = logging.getLogger("packrat.arena")
WARN_EVERY_S = 60.0  # a shortage of descriptors lasts: one warning a minute, not one per request
_warned_at = -WARN_EVERY_S


def warn_no_shared_memory(what: str, exc: OSError) -> None:
    """Say, once a minute at most, that shared memory could not be had and tensors travel as frames."""
    global _warned_at
    now = time.monotonic()
    if now - _warned_at >= WARN_EVERY_S:
        _warned_at = now
        log.warning(
            "%s: no shared memory (%s); tensors travel as ZeroMQ frames meanwhile. If it is the open-file limit, "
            "raise it (`ulimit -Hn`, LimitNOFILE= under systemd)", what, exc.strerror or exc
        )  # fmt: skip


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

    def reserve(self, size: int) -> None:
        """Make the arena `size` bytes now, every page faulted in: writes up to that size then pay only the copy,
        and its resident size is what it will be."""
        if size > self.location.size or self._map is None:
            self._replace(size)
        assert self._map is not None
        _populate(self._map)

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
        try:
            if self._map is not None:
                # An inbox slab's is exported: a view still alive (a frame still being sent) raises BufferError,
                # and the mapping then goes with the last view. The memfd is closed all the same, or it would
                # stay open, and its pages held, for good.
                self._map.close()
                self._map = None
        finally:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1


class PeerArena:
    """The peer's arenas as mapped here: the last `keep` of them, so that a worker reading from its own
    input arena and from several inbox payloads maps each once (a fresh mapping page-faults on every
    page it reads)."""

    def __init__(self, keep: int = 1) -> None:
        self.keep = keep
        self._maps: OrderedDict[tuple[int, int, int], mmap.mmap] = OrderedDict()

    def array(self, location: Location, dtype: np.dtype, shape: Sequence[int], offset: int = 0) -> np.ndarray:
        """A view of the tensor at `offset` in the peer's arena (valid until the peer writes there again)."""
        key = (location.pid, location.fd, location.serial)
        mapped = self._maps.get(key)
        if mapped is None:
            mapped = self._map(location)
        elif self.keep > 1:
            self._maps.move_to_end(key)
        count = 1
        for extent in shape:
            count *= extent
        return np.frombuffer(mapped, dtype=dtype, count=count, offset=offset).reshape(shape)

    def _map(self, location: Location) -> mmap.mmap:
        pid, fd, serial, size = location
        handle = os.open(f"/proc/{pid}/fd/{fd}", os.O_RDWR | os.O_CLOEXEC)
        try:
            mapped = mmap.mmap(handle, size)
        finally:
            os.close(handle)
        while len(self._maps) >= self.keep:
            _unmap(self._maps.popitem(last=False)[1])
        self._maps[(pid, fd, serial)] = mapped
        return mapped

    def close(self) -> None:
        while self._maps:
            _unmap(self._maps.popitem()[1])


def _unmap(mapped: mmap.mmap) -> None:
    # A view still alive (a tensor the runtime holds on to) keeps the mapping; dropping our reference
    # lets it go with the last view.
    with contextlib.suppress(BufferError):
        mapped.close()


class _Slab:
    """One payload's place in the inbox: a memfd of a power-of-two size, reused from payload to payload."""

    def __init__(self, size: int, label: str) -> None:
        self.arena = Arena(label)
        self.arena.write((), size)  # creates it at `size`: a payload that fits never replaces it
        assert self.arena._map is not None
        self.view = memoryview(self.arena._map)  # exported from now on; see Inbox.close
        self.base = _address(self.view)
        self.size = self.arena.location.size
        self.freed_at = time.monotonic()  # when its last payload's request went (Inbox.trim)
        self.paged = False  # every page faulted in (page_in), not only those a payload was written to

    def page_in(self) -> None:
        """Fault every page in now, so that the first payload copied here pays only the copy."""
        assert self.arena._map is not None
        _populate(self.arena._map)
        self.paged = True

    def close(self) -> None:
        try:
            self.view.release()
        finally:
            self.arena.close()  # its memfd is closed even when a view of it still lives


def _populate(mapped: mmap.mmap) -> None:
    """Fault every page of `mapped` in for writing."""
    try:
        mapped.madvise(MADV_POPULATE_WRITE)
    except OSError:  # an older kernel: one write per page faults each in
        mapped_bytes = np.frombuffer(mapped, dtype=np.uint8)
        mapped_bytes[:: mmap.PAGESIZE] = 0
        del mapped_bytes  # the map must not stay exported, or it could not be closed


def _slab_size(nbytes: int) -> int:
    """The power-of-two size of the place a payload of `nbytes` goes to."""
    return max(MIN_ARENA_BYTES, 1 << (nbytes - 1).bit_length())


def _address(view: memoryview) -> int:
    return int(np.frombuffer(view, dtype=np.uint8, count=1).ctypes.data)


_SLABS: list[_Slab] = []  # every inbox slab of this process, for `locate`
# Free slabs an inbox keeps per size for the next payloads; more are closed, so that a burst of queued
# requests does not hold its memory for good.
KEEP_FREE_SLABS = 4
# A free slab beyond the first of its size is closed once it has waited this long for a payload: a burst's
# slabs serve the burst, then the memory goes back, so the daemon's resident size does not climb from one
# record burst to the next over a long run.
SPARE_SLAB_IDLE_S = 30.0


class Inbox:
    """The daemon's shared memory for big request payloads (see the module's docstring)."""

    def __init__(self, label: str = "inbox") -> None:
        self.label = label
        self._free: dict[int, list[_Slab]] = {}  # by size: slabs whose payload's request is gone

    def place(self, payload: Any, owner: object) -> memoryview | None:
        """Copy `payload` into a free slab and return it there (bytes), for as long as `owner` lives; None
        (leave it where it is) below SHARED_MIN_BYTES or when it is not one contiguous buffer."""
        if payload is None:
            return None
        data = memoryview(payload)
        nbytes = data.nbytes
        if nbytes < SHARED_MIN_BYTES or not data.c_contiguous:
            return None
        size = _slab_size(nbytes)
        free = self._free.setdefault(size, [])
        if free:
            slab = free.pop()
        else:
            try:
                slab = self._new_slab(size)
            except OSError as exc:  # EMFILE, ENFILE, ENOMEM: the payload is served from its frame instead
                warn_no_shared_memory("inbox", exc)
                return None
        slab.view[:nbytes] = data.cast("B") if data.format != "B" or data.ndim != 1 else data
        weakref.finalize(owner, _release, free, slab)
        return slab.view[:nbytes]

    def _new_slab(self, size: int) -> _Slab:
        slab = _Slab(size, f"{self.label}-{size >> 10}k")
        _SLABS.append(slab)
        return slab

    def reserve(self, payload_bytes: Iterable[int]) -> int:
        """Make sure a paged-in free place waits for a payload of each of these sizes; returns the bytes
        newly reserved. A place stays reserved until a burst needs more than KEEP_FREE_SLABS of its size."""
        reserved = 0
        for size in sorted({_slab_size(nbytes) for nbytes in payload_bytes if nbytes >= SHARED_MIN_BYTES}):
            free = self._free.setdefault(size, [])
            if free:
                continue
            try:
                slab = self._new_slab(size)
            except OSError as exc:  # payloads of this size and larger are then served from their frames
                warn_no_shared_memory("inbox", exc)
                break
            slab.page_in()
            free.append(slab)
            reserved += slab.size
        return reserved

    def trim(self, now: float | None = None) -> int:
        """Close the free slabs that have waited SPARE_SLAB_IDLE_S for a payload, all but one of each size
        (a paged-in one where there is one, so the next payload pays no page faults); returns how many.
        The daemon's loop calls it on every wake (a periodic hook)."""
        now = time.monotonic() if now is None else now
        closed = 0
        for free in self._free.values():
            if len(free) < 2:
                continue
            paged = [slab for slab in free if slab.paged]
            keep = paged[-1] if paged else free[-1]
            for slab in [slab for slab in free if slab is not keep and now - slab.freed_at >= SPARE_SLAB_IDLE_S]:
                free.remove(slab)
                _close_slab(slab)
                closed += 1
        return closed

    def close(self) -> None:
        """Free every slab of this inbox (at exit: a payload still referenced keeps its mapping alive)."""
        for free in self._free.values():
            while free:
                _close_slab(free.pop())


def _release(free: list[_Slab], slab: _Slab) -> None:
    """A payload's request is gone: its slab is free for the next payload of its size, or closed."""
    if len(free) < KEEP_FREE_SLABS:
        slab.freed_at = time.monotonic()
        free.append(slab)
        return
    _close_slab(slab)


def _close_slab(slab: _Slab) -> None:
    with contextlib.suppress(ValueError):
        _SLABS.remove(slab)
    with contextlib.suppress(BufferError):  # a view still alive keeps the mapping until it goes
        slab.close()


def locate(frames: Sequence[Any]) -> tuple[Location, int] | None:
    """Where a slice lies in this process's inbox: (the slab's location, the slice's offset in it), or
    None when it is not one frame inside one slab."""
    if len(frames) != 1 or not _SLABS:
        return None
    frame = frames[0]
    start = _address(frame)
    end = start + frame.nbytes
    for slab in _SLABS:
        if slab.base <= start and end <= slab.base + slab.size:
            return slab.arena.location, start - slab.base
    return None
