"""Shared memory arenas: what the owner writes the peer reads, a bigger arena is remapped, nothing is left."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from workers.arena import MIN_ARENA_BYTES, Arena, PeerArena


def memfds(label: str) -> list[str]:
    """This process's open memfds of arenas labelled `label` (other tests' arenas may be alive too)."""
    folder = Path("/proc/self/fd")
    found = []
    for entry in folder.iterdir():
        try:
            target = os.readlink(entry)
        except OSError:
            continue  # closed meanwhile (the listing's own fd)
        if target.startswith(f"/memfd:packrat-{label} "):
            found.append(target)
    return found


def test_the_peer_reads_what_the_owner_wrote_from_several_frames() -> None:
    owner, peer = Arena("test-a"), PeerArena()
    try:
        x = np.arange(3 * 5, dtype=np.float32).reshape(3, 5)
        bytes_ = memoryview(x).cast("B")
        location = owner.write([bytes_[:20], bytes_[20:]], x.nbytes)
        assert location.pid == os.getpid() and location.size >= MIN_ARENA_BYTES
        np.testing.assert_array_equal(peer.array(location, x.dtype, x.shape), x)
    finally:
        peer.close()
        owner.close()


def test_a_bigger_tensor_replaces_the_arena_and_the_peer_follows() -> None:
    owner, peer = Arena("test-b"), PeerArena()
    try:
        small = np.full(4, 7, dtype=np.int64)
        first = owner.write([memoryview(small).cast("B")], small.nbytes)
        assert peer.array(first, small.dtype, small.shape).tolist() == [7] * 4
        held = len(memfds("test-b"))  # the owner's fd, and the fd each mmap object keeps
        big = np.arange(MIN_ARENA_BYTES // 8 + 10, dtype=np.int64)
        second = owner.write([memoryview(big).cast("B")], big.nbytes)
        assert second.serial != first.serial and second.size >= big.nbytes
        np.testing.assert_array_equal(peer.array(second, big.dtype, big.shape), big)
        assert len(memfds("test-b")) == held  # the old arena's fds were closed when it was replaced
    finally:
        peer.close()
        owner.close()


def test_closed_arenas_leave_no_fd_and_nothing_in_dev_shm() -> None:
    before = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
    owner, peer = Arena("test-c"), PeerArena()
    location = owner.write([b"x" * 100], 100)
    view = peer.array(location, np.dtype(np.uint8), (100,))
    assert bytes(view[:3]) == b"xxx" and memfds("test-c")
    peer.close()  # a view is still alive: the mapping goes with it, and close must not raise
    owner.close()
    del view
    assert memfds("test-c") == []
    after = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
    assert after == before  # memfds have no name to leak
