"""The hang verdicts as a pure function: each rule of `judge` on frozen readings, no process, no clock."""

from __future__ import annotations

import dataclasses
import math

import pytest

from packrat_daemon.fleet.verdicts import (
    HEDGE_CPU_SHARE,
    MIN_PROGRESS_CPU_S,
    PROGRESS_LOOK_S,
    SPIN_LOOK_S,
    Looked,
    Reading,
    Slice,
    computing,
    judge,
    scaled_waits,
)

TIMEOUT_S = 60.0
# Sent at 100 s with 10 s of CPU used; its deadline proper at 101 s; a 1 s CPU budget, a 0.2 s spin budget.
ONE = Slice(sent_at=100.0, watched_at=101.0, threads=1, cpu_at_send=10.0, cpu_limit=11.0, cpu_budget=1.0,
            spin_limit=10.2, spin_budget=0.2)  # fmt: skip


def reading(at: float, cpu: float | None, stats: dict | None = None, waiting: bool = False) -> Reading:
    return Reading(at, cpu, stats, waiting, stopped=False)


def test_the_job_timeout_and_an_unreadable_worker_are_hangs_whatever_else() -> None:
    assert judge(ONE, reading(160.0, 10.0), Looked(), TIMEOUT_S).why == "the job timeout (60 s) passed"
    assert judge(ONE, reading(100.5, None), Looked(), TIMEOUT_S).why == "its CPU time cannot be read"


def test_a_worker_past_its_cpu_budget_spins_and_one_under_it_is_looked_at_again() -> None:
    spun = judge(ONE, reading(100.5, 11.0), Looked(), TIMEOUT_S)
    assert spun.why is not None and "used the slice's CPU budget (1.00 s of CPU)" in spun.why
    slow = judge(ONE, reading(100.5, 10.5), Looked(), TIMEOUT_S)
    assert slow.why is None and slow.next_look == 100.5 + SPIN_LOOK_S and not slow.first_past_deadline


def test_before_its_deadline_only_a_worker_that_never_paused_is_judged_by_its_spin_budget() -> None:
    first = judge(ONE, reading(100.3, 10.25, {"1": (10.25, 0.0)}), Looked(), TIMEOUT_S)
    assert first.why is None and first.looked.stats == (100.3, {"1": (10.25, 0.0)}) and first.looked.cpu_at_first
    # A look 0.1 s later: on a CPU all along, past the 0.2 s spin budget.
    spun = judge(ONE, reading(100.4, 10.35, {"1": (10.35, 0.0)}), first.looked, TIMEOUT_S)
    assert spun.why is not None and "computed without a pause" in spun.why
    # Asleep half of it: only slow.
    paused = judge(ONE, reading(100.4, 10.3, {"1": (10.3, 0.0)}), first.looked, TIMEOUT_S)
    assert paused.why is None and paused.next_look == pytest.approx(100.4 + SPIN_LOOK_S)


def test_past_its_deadline_a_worker_whose_cpu_time_stopped_is_hung_unless_it_waits_for_a_cpu() -> None:
    first = judge(ONE, reading(101.2, 10.5), Looked(), TIMEOUT_S)
    assert first.why is None and first.first_past_deadline and first.looked.progress == 10.5
    assert first.next_look == pytest.approx(101.2 + PROGRESS_LOOK_S)
    still = reading(101.4, 10.5 + MIN_PROGRESS_CPU_S / 2)
    assert judge(ONE, still, first.looked, TIMEOUT_S).why == (
        "its CPU time stopped (0.005 s in 0.2 s, no thread waiting for a CPU)"
    )
    starved = dataclasses.replace(still, waiting=True)
    again = judge(ONE, starved, first.looked, TIMEOUT_S)
    assert again.why is None and not again.first_past_deadline
    moving = judge(ONE, reading(101.4, 10.6), first.looked, TIMEOUT_S)
    assert moving.why is None and moving.looked.progress == 10.6


def test_a_pool_is_judged_from_its_second_look_with_what_its_threads_siblings_waited_added() -> None:
    pool = dataclasses.replace(ONE, threads=2)
    # Over its 1 s budget at the first look: not judged yet (what its siblings waited is unknown).
    first = judge(pool, reading(100.5, 11.2, {"1": (5.6, 1.0), "2": (5.6, 1.0)}), Looked(), TIMEOUT_S)
    assert first.why is None and first.looked.cpu_at_first == 11.2
    # Both threads ran 0.5 s and waited 0.5 s for a CPU: all of it may be a barrier's spin, so the budget grows.
    shared = {"1": (6.1, 1.5), "2": (6.1, 1.5)}
    kept = judge(pool, reading(101.0, 12.2, shared), first.looked, TIMEOUT_S)
    assert kept.why is None and kept.looked.waited == pytest.approx(1.0)
    # Its siblings asleep, one thread computing alone: nothing added, and it spins.
    alone = {"1": (6.6, 1.0), "2": (5.6, 1.0)}
    assert "it spins" in (judge(pool, reading(101.0, 12.2, alone), first.looked, TIMEOUT_S).why or "")


def test_the_waits_before_the_first_look_count_in_the_share_of_the_cpu_time() -> None:
    looked = Looked(cpu_at_first=11.0, waited=0.5)
    assert scaled_waits(looked, 10.0, 12.0) == pytest.approx(0.5 * 2.0 / 1.0)
    assert scaled_waits(looked, None, 12.0) == 0.5 and scaled_waits(Looked(), 10.0, 12.0) == 0.0


def test_the_inputs_are_frozen_and_a_verdict_leaves_them_as_they_were() -> None:
    looked = Looked()
    verdict = judge(ONE, reading(101.2, 10.5, {"1": (10.5, 0.0)}), looked, TIMEOUT_S)
    assert looked == Looked() and verdict.looked is not looked
    for value in (looked, ONE, reading(1.0, 1.0), verdict):
        with pytest.raises(dataclasses.FrozenInstanceError):
            value.at = 0.0  # type: ignore[misc,union-attr]


def test_a_late_slices_worker_computes_it_while_it_uses_a_cpu_share_or_waits_for_a_cpu() -> None:
    assert computing(HEDGE_CPU_SHARE * 2.0, 2.0, waiting=False)
    assert not computing(HEDGE_CPU_SHARE * 1.0, 2.0, waiting=False)
    assert computing(None, 2.0, waiting=True) and not computing(None, 2.0, waiting=False)
    assert not computing(0.0, math.inf, waiting=False)
