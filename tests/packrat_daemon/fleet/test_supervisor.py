"""The supervisor: a worker past its slice's deadline is hung only once its CPU time stops advancing; when the
loop's check looks at the workers; where the answers, and a batch that lost its workers, go."""

from __future__ import annotations

import math
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from types import SimpleNamespace

import pytest

from packrat_daemon.adapt.production import ProductionProfile
from packrat_daemon.fleet.pool import PoolEvent, WorkerHandle, WorkerState
from packrat_daemon.fleet.supervisor import (
    MIN_PROGRESS_CPU_S,
    PROGRESS_LOOK_S,
    RECONCILE_INTERVAL_S,
    Supervisor,
    cpu_seconds,
)
from packrat_daemon.ops.metrics import Metrics
from packrat_daemon.requests.batcher import Request
from packrat_daemon.wire.codec import ErrorCode


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


@dataclass
class Fleet:
    """A supervisor on stand-ins for its parts, recording what it asks of them."""

    supervisor: Supervisor
    reconciler: SimpleNamespace
    dispatcher: SimpleNamespace
    metrics: Metrics
    requeued: list[list[Request]]
    replies: list[tuple[str, object]]


def fleet(
    abandoned: list[Request] | None = None,
    completed: list[object] | None = None,
    failed: tuple[list[Request], list[Request]] | None = None,
) -> Fleet:
    worker = WorkerHandle(1, 2, (0, 1), 1, WorkerState.READY, pid=101)
    looks: list[float] = []
    reconciler = SimpleNamespace(
        pool=SimpleNamespace(backend=None, ready=lambda: [worker]),
        generation=1,
        looks=looks,
        step=lambda: looks.append(time.monotonic()),
        serving=lambda: [worker],
        replace=lambda _worker: None,
    )
    dispatcher = SimpleNamespace(
        busy=False,
        next_deadline=math.inf,
        serving=[],
        jobs={},
        late=[],
        overdue=lambda _now: [],
        reassign=lambda _lost, _workers: False,
        abandon=lambda: list(abandoned or []),
        fail=lambda _job: failed,
        on_result=lambda _worker, _header, _payload: list(completed or []),
    )
    replies: list[tuple[str, object]] = []
    requeued: list[list[Request]] = []

    class Replies:
        def reply_result(self, done: object) -> None:
            replies.append(("result", done))

        def reply_error(self, request: Request, code: ErrorCode, message: str) -> None:
            replies.append((code.value, request))

    metrics = Metrics("builtin:tiny-mlp")
    supervisor = Supervisor(
        reconciler,  # type: ignore[arg-type]
        dispatcher,  # type: ignore[arg-type]
        metrics,
        ProductionProfile(),
        Replies(),
        requeue=requeued.append,
        queued=lambda: 5,
    )
    return Fleet(supervisor, reconciler, dispatcher, metrics, requeued, replies)


def request(samples: int, retried: bool = False) -> Request:
    return Request(b"id", None, 1, "float32", (samples, 4), b"\0" * (16 * samples), 0.0, None, retried=retried)


def test_the_check_looks_at_once_after_the_pool_or_the_plan_changed_else_every_interval() -> None:
    f = fleet()
    f.supervisor.check(100.0)  # the first wake: nothing looked at yet
    f.supervisor.check(100.05)
    assert len(f.reconciler.looks) == 1
    assert f.dispatcher.serving == f.reconciler.serving()  # what batches are split across from now on
    assert f.metrics.registry.get_sample_value("packrat_queued_inputs") == 5
    f.reconciler.generation = 2  # a switch: the new plan's workers are looked after at once
    f.supervisor.check(100.06)
    f.supervisor.check(100.07)
    assert len(f.reconciler.looks) == 2
    f.supervisor.check(100.06 + RECONCILE_INTERVAL_S)
    assert len(f.reconciler.looks) == 3


def test_a_batch_that_lost_every_worker_is_requeued_once_then_answered_internal() -> None:
    first, again = request(2), request(3, retried=True)
    f = fleet(abandoned=[first, again])
    f.supervisor._on_lost(WorkerHandle(1, 2, (0, 1), 1, WorkerState.DEAD))
    assert f.requeued == [[first]] and first.retried
    assert f.replies == [("INTERNAL", again)]


def test_results_and_failures_are_answered_through_the_replies_given() -> None:
    worker = WorkerHandle(1, 2, (0, 1), 1, WorkerState.READY)
    done = object()
    only = request(1)
    f = fleet(completed=[done], failed=([only], []))
    f.supervisor._on_event(PoolEvent("result", worker, {"compute_ms": 3.0, "batch": 4, "job": 1}, []))
    f.supervisor._on_event(PoolEvent("failed", worker, {"job": 2, "message": "boom"}, []))
    assert f.replies == [("result", done), ("INTERNAL", only)]  # its batch's only request: it failed alone


def test_a_failed_slices_requests_are_run_again_alone_and_the_others_batched_again() -> None:
    # Issue 27, 7: 97 poisoned requests caused 183 INTERNAL replies to another client, batched with them.
    worker = WorkerHandle(1, 2, (0, 1), 1, WorkerState.READY)
    suspect, already_alone, innocent = request(1), request(2), request(3)
    already_alone.alone = True
    f = fleet(failed=([suspect, already_alone], [innocent]))
    f.supervisor._on_event(PoolEvent("failed", worker, {"job": 5, "message": "IndexError"}, []))
    assert f.replies == [("INTERNAL", already_alone)]  # it failed in a batch of its own: it is the bad one
    assert f.requeued == [[innocent, suspect]] and suspect.alone and not innocent.alone


def test_a_failure_of_no_batch_in_flight_is_ignored() -> None:
    f = fleet(abandoned=[request(1)], failed=None)
    f.supervisor._on_event(PoolEvent("failed", WorkerHandle(1, 2, (0, 1), 1, WorkerState.READY), {"job": 3}, []))
    assert f.replies == [] and f.requeued == []
