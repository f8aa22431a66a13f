"""The paper's estimator as a baseline policy: the contract, and EWMA → power of two → mode of 10 windows."""

from __future__ import annotations

import pytest

from policies.base import Policy
from policies.paper_estimator import PaperEstimatorPolicy
from policies.planning.distribution import BatchDistribution
from policies.planning.topology import Topology
from policies.registry import get_policy
from policies.solver import solve
from policies.testing import PolicyContract, amdahl_profile

PROFILE = amdahl_profile(max_threads=8, batches=(1, 2, 4, 8, 16, 32))
TOPOLOGY = Topology.synthetic(8)


class TestPaperEstimatorPolicy(PolicyContract):
    splits_batch = False  # it plans for its rounded estimate, not for the batch it is shown

    @pytest.fixture
    def policy(self) -> Policy:
        return get_policy("paper-estimator")


def window(policy: PaperEstimatorPolicy, counts: dict[int, float]) -> int:
    """One window with these dispatched batch sizes; the batch the plan was made for."""
    plan = policy.plan(PROFILE, TOPOLOGY, BatchDistribution.from_counts(counts))
    return sum(instance.batch for instance in plan.instances)


def test_plans_the_solvers_optimum_for_the_rounded_queue_depth():
    policy = PaperEstimatorPolicy()
    # A mean dispatched batch of 5.5 rounds to 4 on a log scale (log2 5.5 = 2.46).
    plan = policy.plan(PROFILE, TOPOLOGY, BatchDistribution.from_counts({1: 0.5, 10: 0.5}))
    best = solve(PROFILE, 8, 4)
    assert plan.predicted_latency_ms == best.latency_ms
    assert tuple((i.threads, i.batch) for i in plan.instances) == best.instances
    assert "batch 4" in plan.reason


def test_the_mode_of_the_windows_holds_the_plan_through_a_short_change():
    policy = PaperEstimatorPolicy()
    for _ in range(6):
        assert window(policy, {16: 1.0}) == 16
    # Four windows of single inputs: the EWMA falls at once, but 16 stays the most frequent estimate.
    shifted = [window(policy, {1: 1.0}) for _ in range(4)]
    assert shifted == [16, 16, 16, 16]
    # Once the new size has been seen in more of the last 10 windows than the old, the plan follows.
    later = [window(policy, {1: 1.0}) for _ in range(4)]
    assert later[-1] == 1


def test_the_estimate_never_exceeds_the_largest_batch_dispatched():
    policy = PaperEstimatorPolicy()
    # A mean of 24 rounds up to 32 on a log scale, past the 24 actually dispatched: 16 is planned.
    assert window(policy, {24: 1.0}) == 16
