"""The supervisor's test for a worker past its slice's deadline: hung only once its CPU time stops advancing."""

from __future__ import annotations

import math
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

from packrat_daemon.fleet.supervisor import MIN_PROGRESS_CPU_S, PROGRESS_LOOK_S, Supervisor, cpu_seconds


def overdue_job(pid: int, sent_at: float) -> SimpleNamespace:
    return SimpleNamespace(id=7, rows=4, sent_at=sent_at, deadline=sent_at + 1.0, worker=SimpleNamespace(id=1, pid=pid))


def supervisor_for(job: SimpleNamespace) -> Supervisor:
    supervisor = Supervisor.__new__(Supervisor)  # only the parts the check reads
    supervisor.dispatcher = SimpleNamespace(jobs={job.id: job}, job_timeout_s=60.0, next_deadline=math.inf)
    supervisor._cpu_at_look = {}
    return supervisor


def looks(supervisor: Supervisor, job: SimpleNamespace) -> list[bool]:
    verdicts = []
    for _ in range(3):
        now = time.monotonic()
        verdicts.append(supervisor._still_computing(job, now))
        if verdicts[-1]:
            assert job.deadline == now + PROGRESS_LOOK_S and supervisor.dispatcher.next_deadline <= job.deadline
        time.sleep(PROGRESS_LOOK_S + 10 * MIN_PROGRESS_CPU_S)
    return verdicts


@pytest.mark.slow
def test_a_worker_that_still_computes_keeps_its_slice_and_a_stopped_one_is_hung() -> None:
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)
        job = overdue_job(busy.pid, time.monotonic() - 2.0)
        assert looks(supervisor_for(job), job) == [True, True, True]  # its CPU time advances: slow, not hung
        busy.send_signal(signal.SIGSTOP)
        job = overdue_job(busy.pid, time.monotonic() - 2.0)
        supervisor = supervisor_for(job)
        # The first look has nothing to compare with; the next finds no CPU used since: hung.
        assert looks(supervisor, job)[:2] == [True, False]
    finally:
        busy.kill()
        busy.wait()
    assert cpu_seconds(busy.pid) is None and cpu_seconds(None) is None


def test_past_the_job_timeout_even_a_computing_worker_is_replaced() -> None:
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        job = overdue_job(busy.pid, time.monotonic() - 61.0)
        assert supervisor_for(job)._still_computing(job, time.monotonic()) is False
    finally:
        busy.kill()
        busy.wait()
