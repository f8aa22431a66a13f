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


def die_with_parent(parent: int | None = None, sig: int = signal.SIGKILL) -> None:
    """Ask the kernel to send `sig` to this process when its parent dies (Linux only), so that no process
    outlives the one that forked it: a worker its template, the template its daemon.

    SIGKILL by default: it is the one signal a SIGSTOPped process still receives (a SIGTERM would wait,
    pending, for a SIGCONT that never comes, and the stopped process would be left an orphan), and a process
    whose parent is gone has nothing left to finish. `parent`: the pid expected as parent; when it is no
    longer the parent, it died before the request took effect, and this process ends now (0 or None: not
    checked).
    """
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError):
        return  # not Linux: the heartbeat's parent check still ends orphans
    if prctl(_PR_SET_PDEATHSIG, ctypes.c_ulong(int(sig)), ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0)):
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed: a process could outlive its parent")
    if parent and os.getppid() != parent:  # 0 or None: no parent to check against
        os.kill(os.getpid(), sig)  # the parent died between fork and prctl: the kernel will not send it
