"""Pin every thread of this process, and die with the parent."""

from __future__ import annotations

import ctypes
import os
import signal
from collections.abc import Iterable

_PR_SET_PDEATHSIG = 1


def pin_process(cores: Iterable[int]) -> None:
    """Restrict every thread of this process to `cores`.

    sched_setaffinity(0) changes only the calling thread; the OpenMP pool's threads, once they
    exist, must be pinned one by one through /proc/self/task. Threads created later inherit it.
    """
    cpus = set(cores)
    for task in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(task), cpus)
        except ProcessLookupError:
            continue  # the thread ended between listing and pinning


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """Ask the kernel to send `sig` to this process when its parent dies (Linux only)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    except (OSError, AttributeError):
        pass  # not Linux: the heartbeat check still ends orphans
