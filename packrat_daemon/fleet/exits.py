"""How a worker or the template ended, in words for the log: a signal by its name, and a SIGKILL told apart
as the OOM killer's where the memory cgroup counts its kills (an unexplained SIGKILL is most often it)."""

from __future__ import annotations

import signal
from collections.abc import Callable

from policies.planning.kernel_files import read_oom_kills


def exit_description(returncode: int) -> str:
    """How a child process ended, from its exit code (Popen's, or waitstatus_to_exitcode's): "was killed by SIGKILL"
    or "exited with status 1"."""
    if returncode < 0:
        try:
            return f"was killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"was killed by signal {-returncode}"
    return f"exited with status {returncode}"


class ExitCauses:
    """Words a worker's exit, looking at the cgroup's OOM-kill count when it was a SIGKILL the daemon did not send."""

    def __init__(self, oom_kills: Callable[[], int | None] = read_oom_kills) -> None:
        self._oom_kills = oom_kills
        self._seen = oom_kills()  # the count when this daemon started, or at the last SIGKILL worded

    def describe(self, status: object) -> str:
        """`status`: the exit code the template reported (None or junk: unknown)."""
        if not isinstance(status, int):
            return "exited unexpectedly"
        if status != -signal.SIGKILL:
            return exit_description(status)
        count, seen = self._oom_kills(), self._seen
        self._seen = count
        if count is not None and seen is not None and count > seen:
            return f"was killed by the kernel's OOM killer (SIGKILL; the memory cgroup's oom_kill count is {count})"
        return "was killed (SIGKILL; possibly out of memory)"
