"""The single policy: one instance on every usable core, taking the largest batch, as PyTorch does by default."""

from __future__ import annotations

import dataclasses

from policies.base import InstancePlan
from policies.planning.distribution import BatchDistribution
from policies.planning.profile import Profile
from policies.planning.topology import Topology
from policies.single import SinglePolicy


def test_one_instance_takes_every_usable_core_and_the_largest_batch() -> None:
    plan = SinglePolicy().plan(None, Topology.synthetic(4), BatchDistribution.from_counts({1: 8, 16: 1}))
    assert plan.instances == (InstancePlan(4, 16),)
    assert plan.reason == "one instance with all 4 usable cores (PyTorch's default)"
    assert plan.predicted_latency_ms is None and not plan.oversubscribed and not plan.alternatives


def test_smt_siblings_and_the_cgroup_quota_are_not_cores() -> None:
    smt = Topology.synthetic(4, smt=2)
    assert SinglePolicy().plan(None, smt, BatchDistribution.single(2)).thread_counts == [4]
    quota = dataclasses.replace(smt, quota_cores=2)
    assert SinglePolicy().plan(None, quota, BatchDistribution.single(2)).thread_counts == [2]


def test_the_prediction_is_the_profiles_row_for_all_cores() -> None:
    profile = Profile.from_latencies({(2, 4): 9.0, (2, 16): 30.0, (1, 16): 50.0})
    plan = SinglePolicy().plan(profile, Topology.synthetic(2), BatchDistribution.single(10))
    assert plan.predicted_latency_ms == 30.0  # the smallest profiled batch that holds 10 inputs
    # No row for 4 threads: no prediction.
    assert SinglePolicy().plan(profile, Topology.synthetic(4), BatchDistribution.single(4)).predicted_latency_ms is None
