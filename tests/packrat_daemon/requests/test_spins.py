"""The spin's rule (issue 27, 9: a hang must be told within the innocent clients' 1 s stall target): from the spin
floor, before its deadline, a slice's worker that computes without a pause and has used the slice's spin budget of
CPU spins; one that sleeps between bursts (a stand-in for a slow worker) keeps its slice. Real processes, a real
dispatcher, the supervisor's looks."""

from __future__ import annotations

import numpy as np
import pytest

from packrat_daemon.fleet.pool import WorkerHandle, WorkerState
from packrat_daemon.fleet.verdicts import SPIN_SHARE, never_paused, sibling_waits
from packrat_daemon.requests.batcher import Request
from packrat_daemon.requests.dispatcher import Dispatcher
from packrat_daemon.requests.jobs import Job
from packrat_daemon.requests.splitter import Splitter
from packrat_daemon.requests.timing import Deadlines
from policies.planning.profile import Profile
from tests.packrat_daemon.requests.test_supervisor import SLOW, SPIN, Fleet, child, fleet, look_until

FLOOR_S, SPIN_FLOOR_S = 1.0, 0.2  # serve's defaults: --slice-deadline-floor-ms, --slice-spin-floor-ms


def in_flight(pid: int) -> tuple[Fleet, WorkerHandle, Job, Request]:
    """A one-request batch in flight on a 1-thread worker of process `pid`, predicted 10 ms (the floors decide)."""
    worker = WorkerHandle(1, 1, (0,), 1, WorkerState.READY, pid=pid)
    splitter = Splitter(Profile.from_latencies({(1, 1): 10.0}), "exact")
    dispatcher = Dispatcher(lambda *_: True, splitter, Deadlines(60.0, 3.0, FLOOR_S, spin_floor_s=SPIN_FLOOR_S))
    dispatcher.serving = [worker]
    one = Request(b"c", None, 1, "float32", (1, 2), memoryview(np.ones((1, 2), np.float32).tobytes()))
    dispatcher.dispatch([one], [worker])
    (job,) = dispatcher.jobs.values()
    assert (job.spin_budget, job.cpu_budget) == (SPIN_FLOOR_S, FLOOR_S)
    return fleet(dispatcher=dispatcher, worker=worker), worker, job, one


@pytest.mark.slow
def test_a_spinning_worker_is_hung_at_its_spin_budget_not_the_deadline_floors() -> None:
    # Before: hung only once it had used the deadline floor's CPU budget (1 s of CPU, so at least 1 s after it was
    # sent): bench/faults.py's hanging_model, with its profile's 20 ms, stalled its innocent client 1.03-1.08 s.
    with child(SPIN) as spinning:
        f, worker, job, one = in_flight(spinning.pid)
        look_until(f, lambda: not f.dispatcher.busy, 30.0)
        after = worker.cpu_seconds()
        assert not f.dispatcher.busy, "the spinning slice was not given up"
        assert f.replaced == [worker] and f.requeued == [[one]] and one.alone and f.replies == []
        assert after is not None and job.spin_limit <= after < job.cpu_limit, (job.spin_limit, after, job.cpu_limit)


@pytest.mark.slow
def test_a_worker_that_sleeps_between_bursts_keeps_its_slice_past_its_spin_budget() -> None:
    # SLOW computes 5 ms and sleeps 15 ms, over and over: a quarter of a CPU, so past its 0.2 s spin budget within a
    # second. It pauses, so only the deadline floor's rules judge it: its CPU time advances, and stays under 1 s.
    with child(SLOW) as slow:
        f, worker, job, one = in_flight(slow.pid)
        sent = worker.cpu_seconds()
        look_until(f, lambda: not f.dispatcher.busy, 1.6)
        after = worker.cpu_seconds()
        assert f.dispatcher.busy and f.dispatcher.jobs == {job.id: job}, "the slow slice was given up"
        assert f.replaced == [] and f.requeued == [] and f.replies == []
        assert sent is not None and after is not None
        if after < job.spin_limit:
            pytest.skip(f"the loaded machine gave the stand-in {after - sent:.2f} s of CPU: not past its spin budget")


def test_never_paused_reads_a_threads_time_on_a_cpu_or_waiting_for_one() -> None:
    before = (10.0, {"1": (1.0, 0.5), "2": (0.1, 0.0)})
    # Thread 1 ran 0.1 s and waited 0.1 s for a CPU of 0.2 s: never paused, however little it ran.
    assert never_paused(before, 10.2, {"1": (1.1, 0.6), "2": (0.1, 0.0)})
    # Thread 1 slept half the time: paused; a thread new since the look is not judged.
    assert not never_paused(before, 10.2, {"1": (1.05, 0.55), "2": (0.1, 0.0), "3": (0.2, 0.0)})
    short = SPIN_SHARE * 0.2 - 0.01
    assert not never_paused(before, 10.2, {"1": (1.0 + short, 0.5)})


def test_sibling_waits_is_a_threads_cpu_time_up_to_what_the_others_waited_for_a_cpu() -> None:
    before = {"1": (1.0, 0.5), "2": (1.0, 0.5), "3": (0.1, 0.0)}
    # Threads 1 and 2 shared a CPU (0.5 s on it, 0.5 s waiting, each): all of their CPU time may be a barrier's spin.
    shared = {"1": (1.5, 1.0), "2": (1.5, 1.0), "3": (0.1, 0.0)}
    assert sibling_waits(before, shared) == pytest.approx(1.0)
    # Thread 1 alone computes, waiting for a CPU half the time, its siblings asleep: none of it (a spin of its own).
    alone = {"1": (1.5, 1.0), "2": (1.0, 0.5), "3": (0.1, 0.0)}
    assert sibling_waits(before, alone) == pytest.approx(0.0)
    # A sibling that waited a little bounds it; a thread new since the look counts for neither side.
    little = {"1": (1.5, 0.5), "2": (1.1, 0.6), "4": (0.3, 0.3)}
    assert sibling_waits(before, little) == pytest.approx(0.1 + 0.0)
