"""A worker's exit in words: a SIGKILL the OOM killer sent told apart by the cgroup's count, and logged so."""

from __future__ import annotations

import logging
import signal

import pytest

from packrat_daemon.fleet.exits import ExitCauses
from packrat_daemon.fleet.pool import Pool
from tests.packrat_daemon.fleet.test_pool import RecordingBackend, exited, ready


class Counter:
    def __init__(self, count: int | None) -> None:
        self.count = count

    def __call__(self) -> int | None:
        return self.count


def test_a_sigkill_is_the_oom_killers_when_the_cgroup_count_rose() -> None:
    counter = Counter(3)
    causes = ExitCauses(counter)
    assert causes.describe(-signal.SIGKILL) == "was killed (SIGKILL; possibly out of memory)"
    counter.count = 4
    said = causes.describe(-signal.SIGKILL)
    assert said == "was killed by the kernel's OOM killer (SIGKILL; the memory cgroup's oom_kill count is 4)"
    assert causes.describe(-signal.SIGKILL) == "was killed (SIGKILL; possibly out of memory)"  # each kill once


@pytest.mark.parametrize(
    ("status", "said"),
    [(-signal.SIGSEGV, "was killed by SIGSEGV"), (3, "exited with status 3"), (None, "exited unexpectedly")],
)
def test_other_exits_are_said_as_they_are(status: int | None, said: str) -> None:
    assert ExitCauses(Counter(None)).describe(status) == said


def test_a_serving_worker_killed_is_logged_with_its_cause(caplog: pytest.LogCaptureFixture) -> None:
    # Before: only "exited unexpectedly", whatever killed it.
    pool = Pool(RecordingBackend())  # type: ignore[arg-type]
    pool.exits = ExitCauses(Counter(None))
    worker = pool.spawn(1, (0,), generation=1)
    ready(pool, worker)
    with caplog.at_level(logging.WARNING, logger="packrat.pool"):
        event = exited(pool, worker, -signal.SIGKILL)
    assert event is not None and event.kind == "lost"
    assert event.header["cause"] == "was killed (SIGKILL; possibly out of memory)"
    assert (
        f"worker {worker.id} (pid {1000 + worker.id}, 1 thread(s)) was killed (SIGKILL; possibly out of memory)"
        in caplog.text
    )
