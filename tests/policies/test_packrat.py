"""The packrat policy: the pool for a distribution of batch sizes, its spare layouts, and the split margin."""

from __future__ import annotations

import pytest

from packrat_daemon.wire.errors import InfeasibleError, PolicyError
from policies.packrat import PackratPolicy
from policies.planning.distribution import BatchDistribution
from policies.planning.profile import Profile
from policies.planning.topology import Topology
from policies.registry import get_policy
from policies.solver import solve
from policies.split import split_batch
from policies.testing import amdahl_profile


# -- the packrat policy on a distribution of batch sizes ------------------------------------------
def expected_latency(profile: Profile, pool: list[int], distribution: BatchDistribution) -> float | None:
    total = 0.0
    for batch, weight in distribution.weights:
        try:
            latency, _ = split_batch(profile, pool, batch)
        except InfeasibleError:
            return None
        total += weight * latency
    return total


MIXED = BatchDistribution.from_counts({1: 5, 3: 1, 8: 3, 16: 2})


def test_packrat_pool_carries_every_batch_of_the_distribution() -> None:
    profile, topology = amdahl_profile(), Topology.synthetic(4)
    plan = PackratPolicy().plan(profile, topology, MIXED)
    for batch in MIXED.batches:
        _, sizes = split_batch(profile, plan.thread_counts, batch)
        assert sum(sizes) == batch


def test_packrat_pool_is_no_worse_than_any_single_batch_proposal() -> None:
    profile, topology = amdahl_profile(), Topology.synthetic(4)
    plan = PackratPolicy().plan(profile, topology, MIXED)
    # The prediction is the expected latency when every batch runs on the fastest of the plan's layouts.
    per_batch_best = sum(
        weight * min(split_batch(profile, [i.threads for i in layout], batch)[0] for layout in plan.layouts)
        for batch, weight in MIXED.weights
    )
    assert plan.predicted_latency_ms == pytest.approx(per_batch_best)
    main_only = expected_latency(profile, plan.thread_counts, MIXED)
    assert main_only is not None and plan.predicted_latency_ms <= main_only + 1e-9
    pools = {tuple(t for t, _ in solve(profile, topology.usable_cores, b).instances) for b in MIXED.batches}
    assert len(pools) > 1, "the test needs proposals that differ"
    for pool in pools:
        score = expected_latency(profile, list(pool), MIXED)
        if score is not None:
            assert plan.predicted_latency_ms <= score + 1e-9, f"pool {pool} scores {score}"


def test_packrat_never_picks_a_pool_that_cannot_carry_the_largest_batch() -> None:
    # Rows stop at batch 8: the one 4-thread instance that is best for the likely batch 1 cannot take 16.
    profile = amdahl_profile(batches=(1, 2, 4, 8))
    topology = Topology.synthetic(4)
    distribution = BatchDistribution.from_counts({1: 9, 16: 1})
    assert solve(profile, 4, 1).instances == ((4, 1),)
    plan = PackratPolicy().plan(profile, topology, distribution)
    _, sizes = split_batch(profile, plan.thread_counts, 16)
    assert sum(sizes) == 16


def test_packrat_keeps_a_spare_layout_when_batch_sizes_disagree() -> None:
    # One 2-thread instance wins for one input; two 1-thread instances win for sixteen.
    profile = Profile.from_latencies(
        {(1, 1): 100.0, (1, 8): 600.0, (2, 1): 60.0, (2, 16): 1300.0, (2, 8): 700.0, (1, 16): 1250.0}
    )
    distribution = BatchDistribution.from_counts({1: 1.0, 16: 1.0})
    plan = get_policy("packrat").plan(profile, Topology.synthetic(2), distribution)
    layouts = sorted(sorted(i.threads for i in layout) for layout in plan.layouts)
    assert layouts == [[1, 1], [2]]
    # Expected latency: each batch size on its best layout: (60 + 600) / 2.
    assert plan.predicted_latency_ms == pytest.approx(330.0)
    assert plan.to_json()["alternatives"]
    assert "1 spare layout(s) cutting 5.7%" in plan.reason  # against (100 + 600) / 2 on two 1-thread instances


def test_packrat_says_how_much_a_refused_spare_layout_would_cut() -> None:
    # The 2-thread instance is now barely faster for one input: (99 + 600) / 2 against (100 + 600) / 2.
    profile = Profile.from_latencies(
        {(1, 1): 100.0, (1, 8): 600.0, (2, 1): 99.0, (2, 16): 1300.0, (2, 8): 700.0, (1, 16): 1250.0}
    )
    plan = get_policy("packrat").plan(profile, Topology.synthetic(2), BatchDistribution.from_counts({1: 1, 16: 1}))
    assert plan.alternatives == () and plan.predicted_latency_ms == pytest.approx(350.0)
    assert "another layout would cut 0.1%, under 1%" in plan.reason


def test_packrat_keeps_one_layout_when_it_serves_every_batch_best() -> None:
    profile = Profile.from_latencies({(1, 1): 50.0, (1, 8): 300.0, (2, 1): 60.0, (2, 16): 1300.0})
    plan = get_policy("packrat").plan(profile, Topology.synthetic(2), BatchDistribution.from_counts({1: 1, 16: 1}))
    assert plan.alternatives == ()


# -- the split margin ----------------------------------------------------------------------------
def near_tie(split_ms: float, single_ms: float = 1000.0) -> Profile:
    """Two cores, batch 16: two 1-thread instances of 8 (split_ms) against one 2-thread instance."""
    return Profile.from_latencies({(1, 8): split_ms, (1, 16): 2 * split_ms, (2, 8): single_ms / 2, (2, 16): single_ms})


def test_packrat_keeps_one_instance_when_a_split_gains_less_than_the_margin() -> None:
    plan = PackratPolicy().plan(near_tie(970.0), Topology.synthetic(2), BatchDistribution.single(16))
    assert [(i.threads, i.batch) for i in plan.layouts[0]] == [(2, 16)] and not plan.alternatives
    assert plan.predicted_latency_ms == pytest.approx(1000.0)
    assert "3.0% faster" in plan.reason and "5%" in plan.reason


def test_packrat_splits_when_the_gain_clears_the_margin() -> None:
    plan = PackratPolicy().plan(near_tie(900.0), Topology.synthetic(2), BatchDistribution.single(16))
    assert sorted((i.threads, i.batch) for i in plan.instances) == [(1, 8), (1, 8)]
    assert plan.predicted_latency_ms == pytest.approx(900.0)


def test_a_zero_margin_gives_the_exact_optimum() -> None:
    plan = PackratPolicy(min_split_gain=0.0).plan(near_tie(970.0), Topology.synthetic(2), BatchDistribution.single(16))
    assert plan.thread_counts == [1, 1]


def test_the_margin_applies_to_a_distribution_and_its_spare_layouts() -> None:
    profile = Profile.from_latencies(
        {(1, 1): 100.0, (1, 8): 600.0, (2, 1): 60.0, (2, 16): 1300.0, (2, 8): 700.0, (1, 16): 1250.0}
    )
    distribution = BatchDistribution.from_counts({1: 1.0, 16: 1.0})
    # With spares the expected latency is 330 ms. The best single instance is, on this profile, a 1-thread
    # one: (100 + 1250) / 2 = 675 ms (a 2-thread one: 680 ms). A split gains 1 - 330/675 = 51%.
    assert len(PackratPolicy(min_split_gain=0.5).plan(profile, Topology.synthetic(2), distribution).layouts) == 2
    plan = PackratPolicy(min_split_gain=0.6).plan(profile, Topology.synthetic(2), distribution)
    assert plan.thread_counts == [1] and not plan.alternatives
    assert plan.predicted_latency_ms == pytest.approx(675.0)


@pytest.mark.parametrize("gain", [-0.1, 1.0, 2.0])
def test_an_impossible_margin_is_refused(gain: float) -> None:
    with pytest.raises(PolicyError, match="min_split_gain"):
        get_policy("packrat", min_split_gain=gain)
