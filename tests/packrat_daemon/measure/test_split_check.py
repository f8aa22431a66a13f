"""Checking splits by measurement: which batch sizes get checked, how measurements replace cells, and
one check run on real workers."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from packrat_daemon.measure.bench import Bench, Instances, PlanTiming, model_session
from packrat_daemon.measure.split_check import SplitDecision, measured_profile, split_decisions
from policies.base import InstancePlan, Plan
from policies.packrat import PackratPolicy
from policies.planning.distribution import BatchDistribution
from policies.planning.profile import Profile
from policies.planning.topology import Topology

# Two cores at batch 16: the profile says two 1-thread instances of 8 (800 ms) beat one 2-thread
# instance (1000 ms) by 20%.
SPLIT_WINS = Profile.from_latencies({(1, 8): 800.0, (1, 16): 1600.0, (2, 8): 500.0, (2, 16): 1000.0})
ONLY_16 = BatchDistribution.single(16)
ONLY_4 = BatchDistribution.single(4)


def timing(instances: Instances, per_instance: list[float], rounds: int = 5) -> PlanTiming:
    pairs = tuple((int(t), int(b)) for t, b in instances)
    return PlanTiming(pairs, max(per_instance), max(per_instance) + 1.0, tuple(per_instance), rounds)


class FakeBench:
    """Answers compare() with fixed per-instance timings (the policy logic is what is tested here)."""

    def __init__(self, split_ms: list[float], alone_ms: float) -> None:
        self.split_ms, self.alone_ms = split_ms, alone_ms
        self.calls: list[tuple[dict, int]] = []

    def compare(self, plans: Mapping[str, Instances], rounds: int) -> dict[str, PlanTiming]:
        self.calls.append((dict(plans), rounds))
        split = timing(plans["split"], self.split_ms, rounds)
        return {"split": split, "alone": timing(plans["alone"], [self.alone_ms], rounds)}


def test_a_planned_split_is_checked_against_the_best_single_instance() -> None:
    plan = PackratPolicy().plan(SPLIT_WINS, Topology.synthetic(2), ONLY_16)
    assert plan.thread_counts == [1, 1]
    decisions = split_decisions(SPLIT_WINS, plan, ONLY_16, cores=2, min_split_gain=0.05)
    assert decisions == [SplitDecision(16, ((1, 8), (1, 8)), (2, 16))]
    assert decisions[0].describe() == "batch 16: 1t×8 + 1t×8 against 2t×16"


def test_nothing_to_check_when_the_plan_does_not_split() -> None:
    profile = Profile.from_latencies({(1, 8): 990.0, (1, 16): 1980.0, (2, 8): 500.0, (2, 16): 1000.0})
    plan = PackratPolicy().plan(profile, Topology.synthetic(2), ONLY_16)
    assert plan.thread_counts == [2]
    assert split_decisions(profile, plan, ONLY_16, cores=2, min_split_gain=0.05) == []


def test_a_split_measured_slower_than_one_instance_is_dropped() -> None:
    plan = PackratPolicy().plan(SPLIT_WINS, Topology.synthetic(2), ONLY_16)
    decisions = split_decisions(SPLIT_WINS, plan, ONLY_16, cores=2, min_split_gain=0.05)
    bench = FakeBench(split_ms=[1020.0, 1040.0], alone_ms=1000.0)  # side by side, the split loses
    seen = []
    profile = measured_profile(SPLIT_WINS, decisions, bench.compare, 7, lambda *args: seen.append(args))
    assert bench.calls == [({"split": ((1, 8), (1, 8)), "alone": ((2, 16),)}, 7)]
    assert profile.lhat(1, 8) == 1040.0  # the cell both instances share keeps the slower one
    assert profile.lhat(2, 16) == 1000.0
    assert dict(profile.items())[(1, 8)].samples == 7
    assert profile.lhat(1, 16) == 1600.0  # cells the check did not run stay as profiled
    assert len(seen) == 1 and seen[0][0] == decisions[0]
    assert PackratPolicy().plan(profile, Topology.synthetic(2), ONLY_16).thread_counts == [2]


def test_a_split_confirmed_by_measurement_stays() -> None:
    plan = PackratPolicy().plan(SPLIT_WINS, Topology.synthetic(2), ONLY_16)
    decisions = split_decisions(SPLIT_WINS, plan, ONLY_16, cores=2, min_split_gain=0.05)
    profile = measured_profile(SPLIT_WINS, decisions, FakeBench([850.0, 860.0], 1000.0).compare, 5)
    assert PackratPolicy().plan(profile, Topology.synthetic(2), ONLY_16).thread_counts == [1, 1]


def test_every_split_batch_size_of_a_distribution_is_checked() -> None:
    profile = Profile.from_latencies(
        {(1, 1): 100.0, (1, 8): 600.0, (2, 1): 60.0, (2, 16): 1300.0, (2, 8): 700.0, (1, 16): 1250.0}
    )
    distribution = BatchDistribution.from_counts({1: 1.0, 16: 1.0})
    plan = PackratPolicy().plan(profile, Topology.synthetic(2), distribution)
    decisions = split_decisions(profile, plan, distribution, cores=2, min_split_gain=0.05)
    # Batch 1 runs on the 2-thread spare layout alone; batch 16 is split in two, and its rival is the
    # fastest single instance this profile knows at 16: one thread (1250 ms against 1300 ms).
    assert [(d.batch, d.split, d.alone) for d in decisions] == [(16, ((1, 8), (1, 8)), (1, 16))]


@pytest.mark.slow
def test_a_check_on_real_workers_replaces_the_cells_with_measurements() -> None:
    # A made-up profile on which a split "wins" 20×: 1-thread instances of 2 against a 2-thread one of 4.
    profile = Profile.from_latencies({(1, 2): 1.0, (1, 4): 30.0, (2, 2): 10.0, (2, 4): 20.0})
    distribution = BatchDistribution.single(4)
    topology = Topology.synthetic(2)
    plan = PackratPolicy().plan(profile, topology, distribution)
    decisions = split_decisions(profile, plan, distribution, cores=2, min_split_gain=0.05)
    assert [(d.split, d.alone) for d in decisions] == [(((1, 2), (1, 2)), (2, 4))]
    with model_session("builtin:tiny-mlp") as (backend, info):
        bench = Bench(backend, topology, info)
        try:
            measured = measured_profile(profile, decisions, bench.compare, 2)
        finally:
            bench.close()
    cells = dict(measured.items())
    for key in [(1, 2), (2, 4)]:
        assert cells[key].samples == 2 and cells[key].latency_ms != profile.lhat(*key)
        assert 0 < cells[key].latency_ms < 1000
    assert cells[(1, 4)].latency_ms == 30.0  # not part of the check


def test_a_new_split_the_replanned_plan_makes_is_checked_too_and_the_loop_ends() -> None:
    from packrat_daemon.measure.split_check import checked_plan

    # Three cores at batch 16: two 1-thread instances, or one 2-thread beside one 1-thread instance.
    profile = Profile.from_latencies(
        {(1, 8): 800.0, (1, 16): 1600.0, (2, 8): 500.0, (2, 16): 1000.0, (3, 16): 900.0,
         (1, 4): 420.0, (2, 12): 760.0}
    )  # fmt: skip
    first = Plan((InstancePlan(1, 8), InstancePlan(1, 8)), "test", "two 1-thread instances")
    second = Plan((InstancePlan(2, 12), InstancePlan(1, 4)), "test", "2 + 1 threads")
    bench = FakeBench(split_ms=[1200.0, 1200.0], alone_ms=900.0)
    plans = iter([second, second, second])
    profile_after, plan_after = checked_plan(profile, first, lambda _: next(plans), ONLY_16, 3, 0.05, bench.compare, 3)
    checked = [dict(call[0])["split"] for call in bench.calls]
    assert checked[0] == ((1, 8), (1, 8)) and len(checked) == 2 and checked[1] != checked[0]
    assert plan_after is second
