"""Shared memory arenas: what the owner writes the peer reads, a bigger arena is remapped, nothing is left."""

from __future__ import annotations

import errno
import logging
import os
import re
import time
from pathlib import Path

import numpy as np
import pytest

from workers import arena as arena_module
from workers.arena import (
    KEEP_FREE_SLABS,
    MIN_ARENA_BYTES,
    SHARED_MIN_BYTES,
    SPARE_SLAB_IDLE_S,
    Arena,
    Inbox,
    PeerArena,
    locate,
)


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


class Owner:
    """Stands for a request: the inbox keeps a payload's place while its owner lives."""


def test_an_inbox_payload_is_read_in_place_by_a_peer_at_any_rows_offset() -> None:
    inbox, peer = Inbox("test-inbox"), PeerArena(keep=4)
    try:
        x = np.random.default_rng(1).standard_normal((8, 4096), dtype=np.float32)  # 128 KiB
        owner = Owner()
        placed = inbox.place(x, owner)
        assert placed is not None and placed.tobytes() == x.tobytes()
        rows = memoryview(placed)[3 * 16384 : 7 * 16384]  # rows 3..6, as the dispatcher slices a split
        where = locate([rows])
        assert where is not None
        location, offset = where
        assert offset == 3 * 16384 and location.pid == os.getpid()
        np.testing.assert_array_equal(peer.array(location, x.dtype, (4, 4096), offset), x[3:7])
        # Not in the inbox: a private array, or a slice made of several requests' frames.
        assert locate([memoryview(x).cast("B")]) is None
        assert locate([rows, rows]) is None
    finally:
        peer.close()
        inbox.close()


def test_an_inbox_place_is_reused_only_once_its_owner_is_gone() -> None:
    inbox = Inbox("test-reuse")
    try:
        x = np.ones((2, SHARED_MIN_BYTES), dtype=np.uint8)
        first, second = Owner(), Owner()
        where_first = locate([inbox.place(x, first)])
        where_second = locate([inbox.place(x, second)])
        assert where_first is not None and where_second is not None
        assert where_first[0] != where_second[0]  # both owners alive: two places
        del first
        where_third = locate([inbox.place(x * 2, Owner())])
        assert where_third is not None and where_third[0] == where_first[0]  # the first's place, reused
        assert inbox.place(np.ones(SHARED_MIN_BYTES - 1, dtype=np.uint8), Owner()) is None  # small: stays put
        del second
        assert memfds("test-reuse-1024k")
    finally:
        inbox.close()
    assert not memfds("test-reuse-1024k")  # every owner gone: closing the inbox frees every place


def test_a_peer_keeps_its_last_mappings_and_drops_older_ones() -> None:
    owners = [Arena(f"test-keep{k}") for k in range(3)]
    peer = PeerArena(keep=2)
    try:
        locations = [arena.write([b"x" * 10], 10) for arena in owners]

        def address(k: int) -> int:
            return int(peer.array(locations[k], np.dtype(np.uint8), (10,)).ctypes.data)

        first = address(0)
        address(1)
        assert address(0) == first  # still mapped: the same mapping
        address(2)  # a third evicts the least recently used: the second
        assert address(0) == first
        assert mappings("test-keep1") == 1  # the owner's own; the peer's is gone
        assert mappings("test-keep0") == mappings("test-keep2") == 2
        assert address(1) and mappings("test-keep1") == 2  # mapped again on demand

    finally:
        peer.close()
        for arena in owners:
            arena.close()


def mappings(label: str) -> int:
    lines = Path("/proc/self/maps").read_text().splitlines()
    return sum(1 for line in lines if f"/memfd:packrat-{label} " in line)


def test_an_inbox_keeps_a_few_free_places_and_closes_the_rest() -> None:
    inbox = Inbox("test-burst")
    try:
        x = np.ones(SHARED_MIN_BYTES, dtype=np.uint8)
        owners = [Owner() for _ in range(KEEP_FREE_SLABS + 3)]
        for owner in owners:  # a burst: every request queued at once, each in its own place
            inbox.place(x, owner)
        del owner
        assert len(memfds("test-burst-1024k")) == 2 * len(owners)  # a memfd and the mapping's own fd each
        owners.clear()
        assert len(memfds("test-burst-1024k")) == 2 * KEEP_FREE_SLABS
    finally:
        inbox.close()
    assert not memfds("test-burst-1024k")


def test_a_bursts_spare_places_go_back_once_idle_and_a_paged_in_one_stays() -> None:
    # Issue 27's hour-long soak: each record burst of queued big requests left its extra places open for
    # good, so the daemon's resident size rose in steps (+9.6 MB at 30 minutes, +2.4 MB at 48).
    inbox = Inbox("test-trim")
    try:
        assert inbox.reserve([SHARED_MIN_BYTES]) == 1 << 20  # the paged-in place start-up makes
        x = np.ones(SHARED_MIN_BYTES, dtype=np.uint8)
        owners = [Owner() for _ in range(3)]
        for owner in owners:
            inbox.place(x, owner)
        del owner
        owners.clear()
        assert len(memfds("test-trim-1024k")) == 2 * 3
        now = time.monotonic()
        assert inbox.trim(now) == 0  # just freed: the next burst may come at once
        assert inbox.trim(now + SPARE_SLAB_IDLE_S) == 2
        assert len(memfds("test-trim-1024k")) == 2
        assert resident_bytes("test-trim-1024k") == 1 << 20  # the one kept is the paged-in one
        assert inbox.trim(now + 10 * SPARE_SLAB_IDLE_S) == 0  # one place per size always stays
    finally:
        inbox.close()


def resident_bytes(label: str) -> int:
    """How much of this process's mappings of arenas labelled `label` is in memory (smaps' Rss)."""
    total, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        if re.match(r"[0-9a-f]+-[0-9a-f]+ ", line):  # a mapping's first line; its fields follow
            inside = f"/memfd:packrat-{label} " in line
        elif inside and line.startswith("Rss:"):
            total += int(line.split()[1]) * 1024
    return total


def test_a_reserved_arena_is_paged_in_at_its_size_and_a_write_within_it_keeps_it() -> None:
    # Issue 27's soak: a worker's input arena grew, and paged in, with each record slice, so the daemon's
    # resident size climbed for the whole hour; a worker's arena is now made at the largest slice at once.
    arena = Arena("test-reserved-in")
    try:
        arena.reserve(3 << 20)
        assert resident_bytes("test-reserved-in") == 3 << 20
        before = arena.location
        x = np.ones(2 << 20, dtype=np.uint8)
        assert arena.write([memoryview(x)], x.nbytes) == before  # the same memfd: no growing, no new pages
        assert resident_bytes("test-reserved-in") == 3 << 20
    finally:
        arena.close()


def test_a_reserved_inbox_place_is_paged_in_and_taken_by_the_first_payload_of_its_size() -> None:
    inbox = Inbox("test-reserve")
    try:
        sample = 500 * 1024  # one input's bytes: 1 and 2 inputs go to 1 MiB places, 3 and 4 to 2 MiB
        reserved = inbox.reserve(samples * sample for samples in (1, 2, 3, 4))
        assert reserved == (1 << 20) + (2 << 20)
        assert resident_bytes("test-reserve-1024k") == 1 << 20
        assert resident_bytes("test-reserve-2048k") == 2 << 20
        assert inbox.reserve([sample, 4 * sample]) == 0  # both sizes already wait in a free place
        fds = len(memfds("test-reserve"))
        owner = Owner()
        placed = inbox.place(np.ones(3 * sample, dtype=np.uint8), owner)
        assert placed is not None and len(memfds("test-reserve")) == fds  # no new place was made
        assert inbox.reserve([3 * sample]) == 2 << 20  # the 2 MiB place is taken: another one waits
        assert inbox.reserve([SHARED_MIN_BYTES - 1]) == 0  # a small payload never goes to the inbox
    finally:
        inbox.close()


def _no_descriptors(name: str, flags: int = 0) -> int:
    raise OSError(errno.EMFILE, "Too many open files")


def test_an_inbox_without_descriptors_leaves_payloads_in_their_frames_and_warns_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # Before: OSError from memfd_create, a traceback and INTERNAL for every big request.
    inbox = Inbox("test-no-fds")
    monkeypatch.setattr(arena_module, "_warned_at", -arena_module.WARN_EVERY_S)
    monkeypatch.setattr(os, "memfd_create", _no_descriptors)
    payload = np.ones(SHARED_MIN_BYTES, dtype=np.uint8)
    with caplog.at_level(logging.WARNING, logger="packrat.arena"):
        assert inbox.place(payload, object()) is None  # the request is served from its frame
        assert inbox.place(payload, object()) is None
        assert inbox.reserve([SHARED_MIN_BYTES]) == 0  # start-up reserves what it can, and goes on
    assert caplog.text.count("no shared memory (Too many open files)") == 1
    assert "raise it" in caplog.text
    inbox.close()


def test_a_place_closed_while_a_view_of_its_payload_lives_on_still_gives_its_memfd_back() -> None:
    # Issue 27's soak: a slice of a payload outlived its request (a zero-copy frame still being sent), so closing
    # the slab's mapping raised BufferError and its memfd was never closed: 187 open inbox memfds after 25 minutes,
    # each holding its pages although nothing mapped them any more.
    inbox = Inbox("test-lingering")
    try:
        x = np.ones(SHARED_MIN_BYTES, dtype=np.uint8)
        owners = [Owner() for _ in range(KEEP_FREE_SLABS + 3)]
        views = [inbox.place(x, owner) for owner in owners]
        slices = [view[:16] for view in views if view is not None]  # what the sends to the workers hold
        del views
        owners.clear()
        assert len(memfds("test-lingering-1024k")) <= 2 * KEEP_FREE_SLABS + 3  # the mappings' own, until they go
        slices.clear()
        assert len(memfds("test-lingering-1024k")) == 2 * KEEP_FREE_SLABS
    finally:
        inbox.close()
    assert not memfds("test-lingering-1024k")
