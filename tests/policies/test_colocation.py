"""The joint co-location planner: the DP against brute force, queueing, targets, and its errors."""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Sequence

import pytest

from packrat_daemon.wire.errors import InfeasibleError, ProfileError
from policies.colocation import (
    JointPlan,
    ModelDemand,
    evaluate,
    plan_jointly,
    should_move,
    sojourn_ms,
    worth_moving,
)
from policies.packrat import PackratPolicy
from policies.planning.distribution import BatchDistribution
from policies.planning.topology import Topology
from policies.testing import amdahl_profile, assert_plain_json, assert_well_formed

MIXED = BatchDistribution.from_counts({1: 3, 2: 1, 4: 1})


def demand(name: str, rate: float, *, serial: float = 1.0, parallel: float = 3.0, target: float | None = None,
           distribution: BatchDistribution = MIXED, threads: int = 8) -> ModelDemand:  # fmt: skip
    profile = amdahl_profile(threads, (1, 2, 4, 8), serial_ms=serial, parallel_ms=parallel)
    return ModelDemand(name, profile, distribution, rate, target)


def score(plan: JointPlan, demands: Sequence[ModelDemand]) -> tuple[float, float, float, float]:
    """The planner's objective recomputed from the shares: overload, target excess, weighted mean, -(rate·cores)."""
    total = sum(d.rate_per_s for d in demands)
    weights = [d.rate_per_s / total if total else 1 / len(demands) for d in demands]
    overload = excess = mean = spread = 0.0
    for d, share, weight in zip(demands, plan.shares, weights, strict=True):
        spread -= d.rate_per_s * share.cores
        if share.busy_fraction >= 1:
            overload += share.busy_fraction
            continue
        if d.target_ms is not None:
            excess += max(0.0, share.predicted_ms / d.target_ms - 1)
        mean += weight * share.predicted_ms
    return overload, excess, mean, spread


def brute_force(demands: Sequence[ModelDemand], cores: int, min_cores: int = 1) -> tuple[float, ...]:
    best: tuple[float, ...] | None = None
    for split in itertools.product(range(min_cores, cores + 1), repeat=len(demands)):
        if sum(split) != cores:
            continue
        found = score(evaluate(demands, split), demands)
        if best is None or found[:3] < best[:3]:
            best = found
    assert best is not None
    return best


CASES = [
    pytest.param([demand("a", 300), demand("b", 100)], 6, id="two-unequal"),
    pytest.param([demand("a", 200), demand("b", 200, serial=0.5, parallel=6.0)], 8, id="two-profiles"),
    pytest.param([demand("a", 150), demand("b", 50), demand("c", 250, parallel=5.0)], 8, id="three"),
    pytest.param([demand("a", 0), demand("b", 0)], 5, id="no-traffic"),
    pytest.param([demand("a", 400, target=9.0), demand("b", 300, target=12.0)], 8, id="targets"),
    pytest.param([demand("a", 900), demand("b", 800)], 4, id="overloaded"),
]


@pytest.mark.parametrize(("demands", "cores"), CASES)
def test_the_dp_finds_the_best_split_that_brute_force_finds(demands: list[ModelDemand], cores: int) -> None:
    plan = plan_jointly(demands, cores)
    assert sum(plan.split) == cores
    expected = brute_force(demands, cores)
    for got, want in zip(score(plan, demands)[:3], expected[:3], strict=True):
        assert got == pytest.approx(want, rel=1e-9, abs=1e-12)


@pytest.mark.parametrize(("demands", "cores"), CASES)
def test_each_share_is_a_well_formed_plan_inside_its_cores(demands: list[ModelDemand], cores: int) -> None:
    plan = plan_jointly(demands, cores)
    assert sum(share.cores for share in plan.shares) <= cores
    assert sum(share.plan.total_threads for share in plan.shares) <= cores
    for d, share in zip(demands, plan.shares, strict=True):
        assert share.name == d.name and plan.share(d.name) is share
        assert_well_formed(share.plan, Topology.synthetic(share.cores))
        # The service time is the packrat policy's own expectation of that plan over the live batch sizes.
        expected = PackratPolicy().expected_latency(d.profile, share.plan, d.distribution)
        assert share.service_ms == pytest.approx(expected)
        assert share.busy_fraction == pytest.approx(d.rate_per_s * share.service_ms / 1000)


def test_the_sojourn_is_pollaczek_khinchine_and_infinite_at_saturation() -> None:
    # Deterministic 10 ms service at 50/s: rho 0.5, wait = 0.05/ms · 100 ms² / (2 · 0.5) = 5 ms.
    assert sojourn_ms(10.0, 100.0, 50.0) == pytest.approx(15.0)
    assert sojourn_ms(10.0, 100.0, 0.0) == 10.0
    assert sojourn_ms(10.0, 100.0, 100.0) == math.inf
    # More variance, longer queue at the same mean.
    assert sojourn_ms(10.0, 200.0, 50.0) > sojourn_ms(10.0, 100.0, 50.0)


def test_a_saturated_model_gets_more_cores_than_when_it_is_at_rest() -> None:
    at_rest = plan_jointly([demand("a", 20), demand("b", 20)], 8)
    busy = plan_jointly([demand("a", 180), demand("b", 20)], 8)
    assert busy.share("a").cores > at_rest.share("a").cores
    assert busy.share("a").cores > busy.share("b").cores
    # The queueing term moves cores a split proportional to service work would not: near saturation a
    # core is worth more than its share of the load.
    assert busy.share("a").busy_fraction < 1


def test_a_model_with_no_traffic_keeps_the_least_share() -> None:
    plan = plan_jointly([demand("idle", 0.0), demand("busy", 200)], 8, min_cores=2)
    assert plan.share("idle").cores == 2
    assert plan.share("busy").cores == 6


def test_targets_are_kept_before_the_mean_is_lowered() -> None:
    # Without targets the mean favours the heavily used model; b's target pulls cores to b first.
    a, b = demand("a", 150), demand("b", 10, serial=0.2, parallel=12.0)
    free = plan_jointly([a, b], 8)
    target = 11.0
    kept = plan_jointly([a, ModelDemand("b", b.profile, b.distribution, b.rate_per_s, target)], 8)
    assert kept.share("b").predicted_ms <= target < free.share("b").predicted_ms
    assert kept.share("b").cores > free.share("b").cores
    assert kept.missed_targets == ()
    assert kept.predicted_ms >= free.predicted_ms  # the mean paid for the target


def test_the_same_demands_give_the_same_plan() -> None:
    demands = [demand("a", 150), demand("b", 50), demand("c", 250, parallel=5.0)]
    first = plan_jointly(demands, 8)
    assert plan_jointly(list(demands), 8) == first
    assert json.dumps(first.to_json()) == json.dumps(plan_jointly(demands, 8).to_json())


def test_the_json_is_plain_and_a_saturated_plan_says_so() -> None:
    plan = plan_jointly([demand("a", 900), demand("b", 800)], 4)
    assert math.isinf(plan.predicted_ms) and plan.saturated
    data = plan.to_json()
    assert_plain_json(data, "joint.to_json()")
    assert data["predicted_ms"] is None and data["saturated"]
    assert [share["cores"] for share in data["shares"]] == list(plan.split)


def test_worth_moving_is_hysteresis_on_a_different_split() -> None:
    demands = [demand("a", 150), demand("b", 10, serial=0.2, parallel=12.0)]
    proposed = plan_jointly(demands, 8)
    even = evaluate(demands, [4, 4])
    gain = 1 - proposed.predicted_ms / even.predicted_ms
    assert gain > 0
    assert worth_moving(even, proposed, min_gain=gain * 0.9)
    assert not worth_moving(even, proposed, min_gain=gain * 1.1)
    assert not worth_moving(proposed, proposed, min_gain=0.0)  # the same split never moves
    # A split that carries load the current one cannot is worth it whatever the gain asked.
    heavy = [demand("a", 200), demand("b", 10)]
    assert math.isinf(evaluate(heavy, [1, 7]).predicted_ms)
    assert worth_moving(evaluate(heavy, [1, 7]), plan_jointly(heavy, 8), min_gain=0.99)
    with pytest.raises(ProfileError, match="fraction"):
        worth_moving(even, proposed, min_gain=1.0)
    with pytest.raises(ProfileError, match="different models"):
        worth_moving(evaluate([demand("x", 1), demand("y", 1)], [4, 4]), proposed, min_gain=0.1)


def test_errors_say_what_to_do() -> None:
    with pytest.raises(InfeasibleError, match="serve fewer models"):
        plan_jointly([demand("a", 1), demand("b", 1), demand("c", 1)], 2)
    with pytest.raises(InfeasibleError, match="serve fewer models"):
        plan_jointly([demand("a", 1), demand("b", 1)], 4, min_cores=3)
    with pytest.raises(ProfileError, match="own name"):
        plan_jointly([demand("a", 1), demand("a", 2)], 4)
    with pytest.raises(ProfileError, match="at least one"):
        plan_jointly([], 4)
    with pytest.raises(ProfileError, match="arrival rate"):
        demand("a", -1.0)
    with pytest.raises(ProfileError, match="target"):
        demand("a", 1.0, target=0.0)
    with pytest.raises(ProfileError, match="one core count per model"):
        evaluate([demand("a", 1)], [2, 2])
    with pytest.raises(InfeasibleError, match="at least one core"):
        evaluate([demand("a", 1), demand("b", 1)], [0, 4])
    # A batch no share can carry: the profile's largest batch is 8 inputs per instance, and 64 needs 8 instances.
    wide = demand("wide", 1, distribution=BatchDistribution.single(64))
    with pytest.raises(InfeasibleError, match="wide"):
        plan_jointly([wide, demand("b", 1)], 4)
    with pytest.raises(ProfileError, match="no model named"):
        plan_jointly([demand("a", 1)], 2).share("b")


def test_the_least_share_is_kept_and_brute_force_agrees_with_it() -> None:
    demands = [demand("a", 150), demand("b", 5), demand("c", 120, parallel=5.0)]
    plan = plan_jointly(demands, 8, min_cores=2)
    assert min(plan.split) >= 2 and sum(plan.split) == 8
    assert score(plan, demands)[:3] == pytest.approx(brute_force(demands, 8, min_cores=2)[:3])


def test_the_planner_does_not_mutate_its_inputs() -> None:
    demands = [demand("a", 150), demand("b", 40, distribution=BatchDistribution.from_counts({1: 1, 8: 1}))]
    before = [(d.profile.to_csv(), d.distribution, d.rate_per_s) for d in demands]
    plan_jointly(demands, 8)
    evaluate(demands, [3, 5])
    assert [(d.profile.to_csv(), d.distribution, d.rate_per_s) for d in demands] == before


def test_a_split_that_overloads_less_is_worth_moving_to_when_every_split_saturates() -> None:
    # "a" saturates on any share; the split that gives it the most cores carries the most of its load.
    demands = [demand("a", 2000), demand("b", 10)]
    best = plan_jointly(demands, 8)
    worse = evaluate(demands, [2, 6])
    assert best.saturated == worse.saturated == ("a",)
    assert best.split[0] > 2
    assert worth_moving(worse, best, min_gain=0.1)
    assert not worth_moving(best, worse, min_gain=0.0)  # never towards more overload


def test_should_move_waits_for_the_cool_down_unless_the_current_split_saturates() -> None:
    demands = [demand("a", 150), demand("b", 10, serial=0.2, parallel=12.0)]
    proposed, even = plan_jointly(demands, 8), evaluate(demands, [4, 4])
    assert should_move(even, proposed, 0.0) == worth_moving(even, proposed, 0.0) is True
    assert not should_move(even, proposed, 0.0, since_move_s=1.0, cooldown_s=4.0)
    assert should_move(even, proposed, 0.0, since_move_s=4.0, cooldown_s=4.0)
    heavy = [demand("a", 200), demand("b", 10)]
    assert should_move(evaluate(heavy, [1, 7]), plan_jointly(heavy, 8), 0.5, since_move_s=0.0, cooldown_s=4.0)
    with pytest.raises(ProfileError, match="cool-down"):
        should_move(even, proposed, 0.0, cooldown_s=-1.0)
