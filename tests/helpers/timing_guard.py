"""The fast suite's time guard (issue 39): a test not marked slow that uses over `LIMIT_S` seconds fails.

What is measured is CPU time, not wall time: this process's (every thread's) and its reaped children's, during the
test's call (a module's shared fixture is built in the setup of whichever test comes first: not counted). A
loaded machine (two cores shared with others, as CI's are) stretches a test's wall time several-fold but not the
CPU it uses, so the guard does not flake there; a quiet machine's wall time and the CPU time agree for the tests
that compute. What CPU time cannot see (a test that sleeps, or waits on a timer or a port) is reported at the end
of the run instead, by wall time, without failing.

`PACKRAT_FAST_TEST_CPU_S` sets another limit (the planted-violation test uses it).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Collection, Generator

import pytest

LIMIT_S = float(os.environ.get("PACKRAT_FAST_TEST_CPU_S", "2.0"))
WALL_REPORT_S = 2.0  # unmarked tests slower than this by the wall clock are listed at the end, not failed
# Unmarked tests over the limit when the guard came (issue 39), with the CPU seconds each used then on a loaded
# two-core machine: each is to be made cheaper or marked slow, and struck from here. Listed, they are not failed.
OVER_THE_LIMIT_FOR_NOW: dict[str, float] = {
    "tests/packrat_daemon/ops/test_state_properties.py::"
    "test_any_value_in_any_field_is_served_or_set_aside_saying_why": 2.8,
}


def cpu_seconds() -> float:
    """User and system CPU seconds of this process and of its children that have exited and been waited for."""
    times = os.times()
    return times.user + times.system + times.children_user + times.children_system


class TimingGuard:
    """Registered by tests/conftest.py. `cpu` and `wall` are clocks, replaceable for the guard's own test."""

    def __init__(
        self,
        limit_s: float = LIMIT_S,
        cpu: Callable[[], float] = cpu_seconds,
        wall: Callable[[], float] = time.perf_counter,
        allowed: Collection[str] = tuple(OVER_THE_LIMIT_FOR_NOW),
    ) -> None:
        self.limit_s = limit_s
        self.allowed = allowed
        self.cpu = cpu
        self.wall = wall
        self.slow_by_the_wall: list[tuple[str, float, float]] = []  # (test, wall s, CPU s)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Generator[None, None, None]:
        # The call alone: a module's shared fixture is built in the setup of whichever of its tests runs first, so
        # counting setups would blame that test (and move the blame when another is deselected or marked slow).
        started = None if item.get_closest_marker("slow") else (self.cpu(), self.wall())
        result = yield
        if started is None:
            return result
        cpu_s, wall_s = self.cpu() - started[0], self.wall() - started[1]
        if wall_s > WALL_REPORT_S:
            self.slow_by_the_wall.append((item.nodeid, wall_s, cpu_s))
        if cpu_s > self.limit_s and item.nodeid not in self.allowed:
            pytest.fail(
                f"this test is not marked slow and used {cpu_s:.2f} s of CPU (its call; the fast suite's "
                f"limit is {self.limit_s:g} s): make it cheaper, or mark it @pytest.mark.slow",
                pytrace=False,
            )
        return result

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if not self.slow_by_the_wall:
            return
        title = f"unmarked tests over {WALL_REPORT_S:g} s by the wall clock (not failed: tests/helpers/timing_guard.py)"
        terminalreporter.section(title)
        for nodeid, wall_s, cpu_s in sorted(self.slow_by_the_wall, key=lambda row: -row[1]):
            terminalreporter.write_line(f"{wall_s:7.2f} s wall, {cpu_s:6.2f} s CPU  {nodeid}")
