"""The tuner's decisions: switch only for a real predicted gain, after enough batches, not too often."""

from __future__ import annotations

import pytest

from packrat_daemon.adapt.tuner import Tuner, TunerSettings, covers_switch
from packrat_daemon.wire.errors import PolicyError
from policies.base import Plan
from policies.packrat import PackratPolicy
from policies.planning.distribution import BatchDistribution
from policies.planning.profile import Profile
from policies.planning.topology import Topology

# One 2-thread instance wins for a single input; two 1-thread instances win for four.
PROFILE = Profile.from_latencies({(1, 1): 1.0, (1, 2): 1.2, (1, 4): 2.5, (2, 1): 0.6, (2, 4): 2.6})
TOPOLOGY = Topology.synthetic(2)
ONES, FOURS = BatchDistribution.single(1), BatchDistribution.single(4)


def tuner(**settings: float) -> Tuner:
    values = {"min_batches": 10, "min_gain": 0.05, "cooldown_s": 30.0, **settings}
    return Tuner(PackratPolicy(), PROFILE, TOPOLOGY, TunerSettings(**values))


def plan_for(distribution: BatchDistribution) -> Plan:
    return PackratPolicy().plan(PROFILE, TOPOLOGY, distribution)


def test_switches_when_the_live_sizes_make_another_pool_faster() -> None:
    decision = tuner().consider(plan_for(ONES), FOURS, observed=50, now=100.0)
    assert decision is not None
    assert sorted(decision.plan.thread_counts) == [1, 1]
    assert decision.current_ms == 2.6 and decision.proposed_ms == 1.2


def test_keeps_the_plan_when_it_is_already_right() -> None:
    assert tuner().consider(plan_for(FOURS), FOURS, observed=50, now=100.0) is None


def test_waits_for_enough_batches_and_for_the_cool_down() -> None:
    patient = tuner()
    assert patient.consider(plan_for(ONES), FOURS, observed=5, now=100.0) is None
    assert patient.consider(plan_for(ONES), FOURS, observed=50, now=100.0) is not None
    assert patient.consider(plan_for(FOURS), ONES, observed=50, now=110.0) is None  # within 30 s
    assert patient.consider(plan_for(FOURS), ONES, observed=50, now=131.0) is not None


def test_small_gains_do_not_cause_a_switch() -> None:
    # Switching from two 1-thread instances to one 2-thread instance for batch 1 gains 40%; ask for 50%.
    assert tuner(min_gain=0.5).consider(plan_for(FOURS), ONES, observed=50, now=100.0) is None
    assert tuner(min_gain=0.3).consider(plan_for(FOURS), ONES, observed=50, now=100.0) is not None


class NoPrediction(PackratPolicy):
    """Adapts, but cannot say how fast a plan is (the base class's answer)."""

    def expected_latency(self, profile: Profile, plan: Plan, distribution: BatchDistribution) -> None:
        return None


def test_any_policy_that_predicts_expected_latency_can_be_tuned() -> None:
    class Doubled(PackratPolicy):
        def expected_latency(self, profile: Profile, plan: Plan, distribution: BatchDistribution) -> float:
            return 2 * super().expected_latency(profile, plan, distribution)

    settings = TunerSettings(min_batches=10, min_gain=0.05, cooldown_s=30.0)
    decision = Tuner(Doubled(), PROFILE, TOPOLOGY, settings).consider(plan_for(ONES), FOURS, observed=50, now=100.0)
    assert decision is not None and (decision.current_ms, decision.proposed_ms) == (5.2, 2.4)


def test_a_policy_that_adapts_without_a_prediction_is_told_what_to_implement() -> None:
    settings = TunerSettings(min_batches=10, min_gain=0.05, cooldown_s=30.0)
    with pytest.raises(PolicyError, match="expected_latency"):
        Tuner(NoPrediction(), PROFILE, TOPOLOGY, settings).consider(plan_for(ONES), FOURS, observed=50, now=100.0)


def test_a_declined_look_says_why() -> None:
    patient = tuner(min_gain=0.5)
    assert patient.consider(plan_for(ONES), FOURS, observed=5, now=100.0) is None
    assert patient.declined == "5 batches since the last plan, 10 needed"
    assert patient.consider(plan_for(FOURS), ONES, observed=50, now=100.0) is None
    assert patient.declined == (
        "the plan served is predicted at 1.0 ms, the best one for it at 0.6 ms: less than the 50% gain needed to switch"
    )


def test_after_the_batch_sizes_moved_the_wait_and_cool_down_are_skipped_once_but_not_the_gain() -> None:
    patient = tuner()
    assert patient.consider(plan_for(ONES), FOURS, observed=50, now=100.0) is not None
    assert patient.consider(plan_for(FOURS), ONES, observed=5, now=101.0) is None  # within the cool-down
    assert patient.consider(plan_for(FOURS), ONES, observed=5, now=101.0, moved=True) is not None
    assert patient.consider(plan_for(ONES), ONES, observed=5, now=102.0, moved=True) is None  # no gain, no switch


class Forks:
    """A reconciler as the tuner asks it: the threads of each worker a switch would fork, a fork's measured time."""

    def __init__(self, threads: list[int], fork_s: float | None) -> None:
        self.threads, self.fork_s = threads, fork_s

    def forks_needed(self, plan: Plan) -> list[int]:
        return self.threads


def test_a_switch_that_forks_waits_until_its_gain_over_the_remaining_traffic_pays_for_the_fork() -> None:
    # One 2-thread instance to two 1-thread ones for batch 4: 2.6 -> 1.2 ms, a 54% gain; the 1-thread fork took 4 s
    # on one of the two cores: worth 2 s of serving, which a 54% gain pays for once the traffic has lasted 3.7 s.
    costly = tuner()
    costly.switch_cost = Forks([1], fork_s=4.0)
    assert costly.consider(plan_for(ONES), FOURS, observed=50, now=100.0, moved=True, lasted_s=2.0) is None
    assert "does not pay" in costly.declined and "4.0 s" in costly.declined
    assert costly.consider(plan_for(ONES), FOURS, observed=50, now=105.0, lasted_s=7.0) is not None


def test_a_switch_the_live_workers_cover_or_no_fork_timed_is_not_held_back() -> None:
    free = tuner()
    free.switch_cost = Forks([], fork_s=4.0)  # parked or re-threaded workers take every slot
    assert free.consider(plan_for(ONES), FOURS, observed=50, now=100.0, moved=True, lasted_s=0.5) is not None
    untimed = tuner()
    untimed.switch_cost = Forks([1], fork_s=None)
    assert untimed.consider(plan_for(ONES), FOURS, observed=50, now=100.0, moved=True, lasted_s=0.5) is not None


def test_covers_switch_weighs_the_gain_over_the_time_left_against_the_cores_the_forks_take() -> None:
    assert covers_switch(0.10, lasted_s=20.0, fork_s=4.0, forked_cores=1, cores=2)  # 2 s of 2 s
    assert not covers_switch(0.10, lasted_s=19.0, fork_s=4.0, forked_cores=1, cores=2)
    assert not covers_switch(0.10, lasted_s=30.0, fork_s=4.0, forked_cores=2, cores=2)  # every core: 4 s
