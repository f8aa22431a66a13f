"""The loop core: one wake's phases in order, each only when it is due, on whatever clock it is given."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import pytest

from packrat_daemon.fleet.pool import WorkerHandle, WorkerState
from packrat_daemon.loop import LoopCore
from packrat_daemon.requests.batcher import Batcher, Request
from packrat_daemon.wire.codec import ErrorCode
from policies.base import InstancePlan, Plan

PLAN = Plan((InstancePlan(2, 4),), "fixed", "the plan served")
NEXT = Plan((InstancePlan(1, 4), InstancePlan(1, 4)), "fixed", "adaptation's plan")


def request(samples: int, arrived: float, deadline: float | None = None) -> Request:
    return Request(b"id", None, 1, "float32", (samples, 4), b"\0" * (16 * samples), arrived, deadline)


@dataclass
class Workers:
    """loop.Workers, recording what the loop asks of it in the shared log."""

    log: list[Any]
    busy: bool = False
    serving: list[WorkerHandle] = field(default_factory=lambda: [WorkerHandle(1, 2, (0, 1), 1, WorkerState.READY)])
    next_deadline: float = math.inf

    def check(self, now: float) -> None:
        self.log.append("check")

    def start(self, batch: list[Request], now: float) -> None:
        self.log.append(("start", [r.samples for r in batch]))
        self.busy = True


@dataclass
class Estimator:
    observed: list[tuple[int, float]] = field(default_factory=list)

    def observe(self, rows: int, now: float) -> None:
        self.observed.append((rows, now))


@dataclass
class Adaptation:
    log: list[Any]
    proposal: Plan | None = NEXT
    due: float = 0.0
    interval_s: float = 5.0
    estimator: Estimator = field(default_factory=Estimator)

    def propose(self, plan: Plan, offline: object, now: float) -> Plan | None:
        self.log.append(("propose", plan.reason, now))
        self.due = now + self.interval_s
        return self.proposal


@dataclass
class Loop:
    core: LoopCore
    batcher: Batcher
    workers: Workers
    adaptation: Adaptation
    log: list[Any]
    dispatched: list[tuple[int, float]]


@pytest.fixture
def loop() -> Loop:
    log: list[Any] = []
    batcher = Batcher(max_batch=8, max_delay_s=0.0, max_queued_inputs=64)
    workers, adaptation = Workers(log), Adaptation(log)
    dispatched: list[tuple[int, float]] = []
    core = LoopCore(
        batcher,
        workers,
        adaptation,  # type: ignore[arg-type]  # the parts of OnlineAdaptation the loop uses
        reply_error=lambda request, code, message: log.append(("error", code, request.samples)),
        switch=lambda plan, reason: log.append(("switch", plan.reason, reason)),
        served=lambda: (PLAN, None),
        periodic=(lambda now: log.append(("hook", now)),),
        dispatched=lambda rows, seconds: dispatched.append((rows, seconds)),
    )
    return Loop(core, batcher, workers, adaptation, log, dispatched)


def test_a_wake_expires_checks_dispatches_runs_the_hooks_and_adapts_in_that_order(loop: Loop) -> None:
    loop.batcher.offer(request(2, arrived=0.5, deadline=0.9))  # its timeout passes while queued
    loop.batcher.offer(request(3, arrived=0.6))
    loop.core.tick(1.0)
    assert loop.log == [
        ("error", ErrorCode.TIMEOUT, 2),
        "check",
        ("start", [3]),
        ("hook", 1.0),
        ("propose", "the plan served", 1.0),
        ("switch", "adaptation's plan", "adapt"),
    ]
    rows, seconds = loop.dispatched[0]
    assert rows == 3 and seconds >= 0.0 and loop.adaptation.estimator.observed == [(3, 1.0)]


def test_no_batch_starts_while_one_is_in_flight_or_no_worker_serves(loop: Loop) -> None:
    loop.batcher.offer(request(1, arrived=0.0))
    loop.workers.busy = True
    loop.core.tick(0.0)
    loop.workers.busy, loop.workers.serving = False, []
    loop.core.tick(0.0)
    assert not any(isinstance(entry, tuple) and entry[0] == "start" for entry in loop.log)
    assert loop.batcher.queued_inputs == 1 and loop.dispatched == []
    loop.workers.serving = [WorkerHandle(2, 1, (0,), 1, WorkerState.READY)]
    loop.core.tick(0.0)
    assert ("start", [1]) in loop.log and loop.batcher.queued_inputs == 0


def test_adaptation_looks_once_its_interval_passed_and_a_plan_it_keeps_switches_nothing(loop: Loop) -> None:
    loop.adaptation.proposal = None
    loop.core.tick(0.0)
    loop.core.tick(4.9)
    loop.core.tick(5.0)
    assert [entry[2] for entry in loop.log if entry[0] == "propose"] == [0.0, 5.0]
    assert not any(entry[0] == "switch" for entry in loop.log)


def test_the_next_wake_is_the_batch_in_flights_deadline_else_the_queues_head(loop: Loop) -> None:
    assert loop.core.next_wake() is None  # nothing queued, nothing in flight
    loop.batcher.offer(request(1, arrived=2.5))
    assert loop.core.next_wake() == 2.5
    loop.workers.busy, loop.workers.next_deadline = True, 7.0
    assert loop.core.next_wake() == 7.0


def test_a_reload_shrinking_max_batch_answers_the_queued_requests_too_large_and_starts_the_rest(loop: Loop) -> None:
    # Issue 27, 3: take() returned an empty batch for a head of 6 inputs under max_batch 4; the dispatcher raised.
    loop.batcher.offer(request(6, arrived=0.0))
    loop.batcher.offer(request(3, arrived=0.1))
    loop.batcher.configure(max_batch=4, max_delay_s=0.0, max_queued_inputs=64)  # what reload.apply does
    assert loop.batcher.queued_inputs == 3
    loop.core.tick(1.0)
    assert loop.log[:3] == [("error", ErrorCode.TOO_LARGE, 6), "check", ("start", [3])]
    assert not loop.batcher.queue and loop.batcher.take_oversized() == []


def test_no_empty_batch_is_ever_started(loop: Loop) -> None:
    loop.batcher.offer(request(1, arrived=0.0))
    loop.batcher.queue[0].shape = (9, 4)  # over max_batch 8 without configure: the head is taken even so
    loop.batcher.queued_inputs = 9
    loop.core.tick(1.0)
    assert ("start", [9]) in loop.log and not loop.batcher.queue
