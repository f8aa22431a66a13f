"""The torchserve policy: one worker per logical CPU, each with a thread per usable core, sharing the batch."""

from __future__ import annotations

from policies.planning.distribution import BatchDistribution
from policies.planning.profile import Profile
from policies.planning.topology import Topology
from policies.torchserve import TorchServePolicy


def test_a_worker_per_logical_cpu_each_on_every_core_with_the_batch_dealt_out() -> None:
    topology = Topology.synthetic(2, smt=2)  # 4 logical CPUs, 2 usable cores
    plan = TorchServePolicy().plan(None, topology, BatchDistribution.from_counts({1: 3, 10: 1}))
    assert plan.thread_counts == [2, 2, 2, 2]
    assert [i.batch for i in plan.instances] == [3, 3, 2, 2]  # the remainder to the first workers
    assert plan.oversubscribed and plan.split == "even"
    assert plan.reason == "4 workers (one per logical CPU) × 2 threads each, oversubscribed"


def test_a_worker_without_a_share_of_the_batch_is_still_started() -> None:
    plan = TorchServePolicy().plan(None, Topology.synthetic(4), BatchDistribution.single(2))
    assert [i.batch for i in plan.instances] == [1, 1, 0, 0]


def test_workers_sharing_cores_get_no_prediction_even_with_a_profile() -> None:
    profile = Profile.from_latencies({(2, 1): 5.0, (2, 2): 8.0})
    plan = TorchServePolicy().plan(profile, Topology.synthetic(2), BatchDistribution.single(2))
    assert plan.predicted_latency_ms is None
    assert "latency not predicted (its instances share cores)" in plan.describe()
