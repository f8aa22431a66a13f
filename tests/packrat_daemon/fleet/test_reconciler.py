"""The reconciler's fork schedule: at once after a worker lost while serving, backing off after boot
failures, and giving up with the worker's reason after MAX_BOOT_FAILURES in a row."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from packrat_daemon.fleet import pool as pool_module
from packrat_daemon.fleet import reconciler as reconciler_module
from packrat_daemon.fleet.pool import Pool, WorkerHandle, WorkerState
from packrat_daemon.fleet.reconciler import (
    BOOT_BACKOFF_FIRST_S,
    BOOT_BACKOFF_MAX_S,
    MAX_BOOT_FAILURES,
    Reconciler,
    Reconfiguration,
    boot_backoff_s,
)
from packrat_daemon.wire.errors import WorkerBootError
from policies.base import InstancePlan, Plan
from policies.planning.topology import Topology
from tests.packrat_daemon.fleet.test_pool import RecordingBackend, exited, ready
from workers import messages


class Clock:
    """time.monotonic for the pool and the reconciler, moved by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    clock = Clock()
    fake_time = SimpleNamespace(monotonic=clock.monotonic, time=clock.monotonic)
    monkeypatch.setattr(pool_module, "time", fake_time)
    monkeypatch.setattr(reconciler_module, "time", fake_time)
    return clock


def two_slot_reconciler() -> tuple[Reconciler, RecordingBackend]:
    backend = RecordingBackend()
    reconciler = Reconciler(Pool(backend), Topology.synthetic(2))
    reconciler.set_plan(Plan((InstancePlan(1, 1), InstancePlan(1, 1)), "fixed", "two one-thread instances"))
    return reconciler, backend


def all_ready(reconciler: Reconciler) -> None:
    """Every starting worker reports ready."""
    for worker in starting(reconciler):
        ready(reconciler.pool, worker)


def serving_two_slots() -> tuple[Reconciler, RecordingBackend]:
    """`two_slot_reconciler`'s plan started and served: both workers forked and ready, the plan converged."""
    reconciler, backend = two_slot_reconciler()
    reconciler.step()
    all_ready(reconciler)
    reconciler.step()
    return reconciler, backend


def spawned(backend: RecordingBackend) -> int:
    return sum(kind == messages.SPAWN for _, kind, _ in backend.sent)


def starting(reconciler: Reconciler) -> list[WorkerHandle]:
    return [w for w in reconciler.pool.live() if w.state is WorkerState.STARTING]


def fail_at_boot(reconciler: Reconciler, worker: WorkerHandle) -> None:
    exited(reconciler.pool, worker, messages.WORKER_BOOT_ERROR, "ValueError: this model refuses a batch of one")


def test_back_off_doubles_from_the_first_pause_up_to_the_cap() -> None:
    pauses = [boot_backoff_s(failures) for failures in range(10)]
    assert pauses[:3] == [0.0, BOOT_BACKOFF_FIRST_S, 2 * BOOT_BACKOFF_FIRST_S]
    assert all(b == min(2 * a, BOOT_BACKOFF_MAX_S) for a, b in zip(pauses[1:], pauses[2:], strict=False))
    assert pauses[-1] == BOOT_BACKOFF_MAX_S


def test_after_boot_failures_one_worker_is_forked_at_a_time_after_a_growing_pause(clock: Clock) -> None:
    reconciler, backend = two_slot_reconciler()
    reconciler.step()
    assert spawned(backend) == 2  # at start, every slot at once
    for worker in starting(reconciler):
        fail_at_boot(reconciler, worker)

    clock.now += boot_backoff_s(2) - 0.01
    reconciler.step()
    assert spawned(backend) == 2  # still pausing
    clock.now += 0.01
    reconciler.step()
    reconciler.step()
    assert spawned(backend) == 3  # one probe, and no other fork while it starts

    fail_at_boot(reconciler, starting(reconciler)[0])
    clock.now += boot_backoff_s(3) - 0.01
    reconciler.step()
    assert spawned(backend) == 3
    clock.now += 0.01
    reconciler.step()
    assert spawned(backend) == 4

    ready(reconciler.pool, starting(reconciler)[0])  # the model starts after all: back to forking at once
    reconciler.step()
    assert spawned(backend) == 5
    ready(reconciler.pool, starting(reconciler)[0])
    assert reconciler.converged()


def test_gives_up_after_max_boot_failures_in_a_row_with_the_workers_reason(clock: Clock) -> None:
    reconciler, backend = two_slot_reconciler()
    with pytest.raises(WorkerBootError, match="the last one said: ValueError: this model refuses a batch of one"):
        for _ in range(100):
            reconciler.step()
            for worker in starting(reconciler):
                fail_at_boot(reconciler, worker)
            clock.now += BOOT_BACKOFF_MAX_S
    assert spawned(backend) == MAX_BOOT_FAILURES


def test_worker_lost_after_ready_is_replaced_in_the_same_step(clock: Clock) -> None:
    reconciler, backend = two_slot_reconciler()
    reconciler.step()
    workers = starting(reconciler)
    for worker in workers:
        ready(reconciler.pool, worker)
    assert reconciler.converged()
    event = exited(reconciler.pool, workers[0], -9)
    assert event is not None and event.kind == "lost"
    reconciler.step()  # the clock has not moved: no pause
    assert spawned(backend) == 3


def configured(reconciler: Reconciler, worker: WorkerHandle) -> None:
    reconciler.pool.handle(worker.identity, messages.CONFIGURED, {}, [])


def test_a_plan_change_is_measured_from_decision_to_new_pool_serving_and_old_worker_retired(clock: Clock) -> None:
    measured: list[Reconfiguration] = []
    backend = RecordingBackend()
    reconciler = Reconciler(Pool(backend), Topology.synthetic(2), measured.append)
    reconciler.set_plan(Plan((InstancePlan(1, 1), InstancePlan(1, 1)), "fixed", "two one-thread instances"))
    reconciler.step()
    all_ready(reconciler)
    clock.now += 0.05
    reconciler.step()
    assert measured == []  # the start is a boot, not a change
    assert reconciler.history[-1].retired == clock.now

    one = Plan((InstancePlan(2, 2),), "fixed", "one two-thread instance")
    clock.now += 1.0
    decided = clock.now
    reconciler.set_plan(one, "control: --plan 2x2", (10.0, 8.0))
    rethreaded = next(w for w in reconciler.pool.live() if w.pending is not None)
    clock.now += 0.03
    reconciler.step()
    assert reconciler.history[-1].first_serving is None  # the re-threaded worker has not answered yet
    clock.now += 0.02
    configured(reconciler, rethreaded)
    reconciler.step()
    record = reconciler.history[-1]
    assert measured == [record]
    assert record.first_serving == record.serving == record.retired == decided + 0.05
    summary = record.to_json()
    assert summary["reason"] == "control: --plan 2x2" and summary["to"] == one.describe()
    assert summary["serving_s"] == pytest.approx(0.05) and summary["predicted_gain"] == pytest.approx(0.2)
    assert [w.threads for w in reconciler.serving()] == [2]  # the other one-thread worker no longer serves


def test_a_plan_replaced_before_it_served_is_marked_superseded(clock: Clock) -> None:
    reconciler, _ = two_slot_reconciler()
    reconciler.set_plan(Plan((InstancePlan(2, 2),), "fixed", "one two-thread instance"), "adapt")
    assert reconciler.history[0].superseded and reconciler.history[0].to_json()["serving_s"] is None
    assert not reconciler.history[1].done


def test_a_worker_the_plan_no_longer_needs_is_parked_and_taken_back_without_a_fork(clock: Clock) -> None:
    reconciler, backend = serving_two_slots()
    forks = spawned(backend)

    reconciler.set_plan(Plan((InstancePlan(2, 2),), "fixed", "one two-thread instance"))
    rethreaded = next(w for w in reconciler.pool.live() if w.pending is not None)
    configured(reconciler, rethreaded)
    reconciler.step()
    (parked,) = [w for w in reconciler.pool.live() if w.id in reconciler.parked]
    assert parked.state is WorkerState.READY and reconciler.serving() == [rethreaded]
    assert not any(kind == messages.STOP for _, kind, _ in backend.sent)

    reconciler.set_plan(Plan((InstancePlan(1, 1), InstancePlan(1, 1)), "fixed", "two one-thread instances"))
    assert reconciler.parked == {}  # taken back as it is: it still has its slot's thread and core
    configured(reconciler, rethreaded)
    reconciler.step()
    assert spawned(backend) == forks and reconciler.converged()
    assert sorted(w.id for w in reconciler.serving()) == sorted([rethreaded.id, parked.id])


def test_a_parked_worker_is_stopped_after_the_parking_time(clock: Clock) -> None:
    reconciler, backend = two_slot_reconciler()
    reconciler.step()
    all_ready(reconciler)
    reconciler.set_plan(Plan((InstancePlan(2, 2),), "fixed", "one two-thread instance"))
    configured(reconciler, next(w for w in reconciler.pool.live() if w.pending is not None))
    reconciler.step()
    assert len(reconciler.parked) == 1
    clock.now += reconciler_module.PARK_S + 1
    reconciler.step()
    assert reconciler.parked == {} and [kind for _, kind, _ in backend.sent].count(messages.STOP) == 1
    assert reconciler.converged()


def test_layouts_that_share_a_worker_count_it_once_in_the_planned_workers() -> None:
    # On 4 cores, [2, 2] and [2, 1, 1] both hold a 2-thread instance on the first two cores: 4 processes, not 5,
    # so /readyz (which compares the serving workers with this count) can turn ready.
    reconciler = Reconciler(Pool(RecordingBackend()), Topology.synthetic(4))
    two_twos = (InstancePlan(2, 8), InstancePlan(2, 8))
    two_one_one = (InstancePlan(2, 8), InstancePlan(1, 4), InstancePlan(1, 4))
    reconciler.set_plan(Plan(two_twos, "fixed", "shared slot", alternatives=(two_one_one,)))
    assert reconciler.planned_workers == 4


def test_a_worker_on_a_cpu_the_share_gave_away_is_stopped_not_parked(clock: Clock) -> None:
    """`packrat coordinate` moved CPU 1 to another model: the worker left there must not idle on it."""
    from policies.planning.cores import CoreAllocator

    reconciler, backend = serving_two_slots()
    on_one = next(w for w in reconciler.pool.live() if w.cores == (1,))
    reconciler.allocator = CoreAllocator(Topology.synthetic(2).restricted([0]))
    reconciler.set_plan(Plan((InstancePlan(1, 1),), "fixed", "one one-thread instance on CPU 0"))
    reconciler.step()
    assert reconciler.parked == {} and on_one.state is WorkerState.STOPPING
    assert [w.cores for w in reconciler.serving()] == [(0,)] and reconciler.history[-1].done


def test_a_parked_worker_is_stopped_once_its_cpu_is_given_away(clock: Clock) -> None:
    from policies.planning.cores import CoreAllocator

    reconciler, _ = two_slot_reconciler()
    reconciler.step()
    all_ready(reconciler)
    reconciler.set_plan(Plan((InstancePlan(1, 1),), "fixed", "one one-thread instance"))
    reconciler.step()
    (parked,) = [w for w in reconciler.pool.live() if w.id in reconciler.parked]
    kept = next(w for w in reconciler.pool.live() if w.id not in reconciler.parked)
    reconciler.allocator = CoreAllocator(Topology.synthetic(2).restricted(list(kept.cores)))
    reconciler.set_plan(Plan((InstancePlan(1, 1),), "fixed", "the same instance, on its share"))
    reconciler.step()
    assert parked.state is WorkerState.STOPPING and reconciler.parked == {}


def test_a_plan_on_another_template_forks_every_slot_there_and_stops_the_old_workers_once_it_serves(
    clock: Clock,
) -> None:
    reconciler, old = serving_two_slots()
    first = reconciler.serving()

    new = RecordingBackend()  # another runtime's template
    reconciler.set_plan(Plan((InstancePlan(1, 1), InstancePlan(1, 1)), "fixed", "the same slots"), "runtime",
                        backend=new)  # fmt: skip
    reconciler.step()
    assert spawned(new) == 2 and not any(w.pending for w in first)  # same slots, yet forked afresh: no re-thread
    assert reconciler.serving() == first  # the old runtime serves until the new one does
    assert not any(kind == messages.STOP for _, kind, _ in old.sent)
    assert reconciler.pool.backends == (new, old)

    all_ready(reconciler)
    reconciler.step()
    assert {w.id for w in reconciler.serving()} == {w.id for w in reconciler.pool.live() if w.backend is new}
    assert reconciler.parked == {}  # an older runtime's worker is never parked: no later plan can take it
    assert sorted(identity for identity, kind, _ in old.sent if kind == messages.STOP) == sorted(
        w.identity for w in first
    )
    # Every message to a worker goes through its own template's socket, and the old one closes once they exited.
    assert not old.closed
    for worker in first:
        exited(reconciler.pool, worker, 0)
    reconciler.step()
    assert old.closed and reconciler.pool.backends == (new,) and not new.closed


def configures(backend: RecordingBackend) -> int:
    return sum(kind == messages.CONFIGURE for _, kind, _ in backend.sent)


def test_a_plan_that_needs_a_fork_re_threads_the_serving_worker_only_once_the_fork_serves(clock: Clock) -> None:
    """Make before break: one 2-thread worker to two 1-thread ones keeps the 2-thread worker serving both cores while
    the second core's fork warms up (re-threaded at once, it served on one core for the whole warm-up)."""
    backend = RecordingBackend()
    reconciler = Reconciler(Pool(backend), Topology.synthetic(2))
    reconciler.set_plan(Plan((InstancePlan(2, 2),), "fixed", "one two-thread instance"))
    reconciler.step()
    (old,) = starting(reconciler)
    clock.now += 1.5
    ready(reconciler.pool, old)
    reconciler.step()
    assert reconciler.fork_s == pytest.approx(1.5)  # spawn to ready, timed
    two = Plan((InstancePlan(1, 1), InstancePlan(1, 1)), "adapt", "two one-thread instances")
    assert reconciler.forks_needed(two) == [1]

    reconciler.set_plan(two, "adapt")
    reconciler.step()
    (fork,) = starting(reconciler)
    assert configures(backend) == 0 and old.pending is None  # not re-threaded while the fork warms up
    assert reconciler.serving() == [old]  # the old worker serves both cores meanwhile
    reconciler.step()
    assert len(starting(reconciler)) == 1 and configures(backend) == 0  # its slot is not forked a second time

    clock.now += 2.0
    ready(reconciler.pool, fork)
    reconciler.step()
    assert configures(backend) == 1 and old.target == (1, (0,))  # the fork serves: now re-threaded
    assert reconciler.fork_s == pytest.approx(2.0)
    configured(reconciler, old)
    reconciler.step()
    assert reconciler.converged() and reconciler.forks_needed(two) == []


def test_a_plan_without_a_fork_re_threads_at_once(clock: Clock) -> None:
    reconciler, backend = serving_two_slots()
    one = Plan((InstancePlan(2, 2),), "adapt", "one two-thread instance")
    assert reconciler.forks_needed(one) == []
    reconciler.set_plan(one, "adapt")
    assert configures(backend) == 1  # the live workers cover every slot: nothing to wait for
