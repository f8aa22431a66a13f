"""TorchServe's default: one worker per logical CPU, each with PyTorch's default thread count.

Every worker uses as many threads as there are usable cores, so together they oversubscribe the
machine; that is the baseline the Packrat paper compares against.
"""

from __future__ import annotations

from policies.base import InstancePlan, Plan, Policy
from policies.planning.distribution import BatchDistribution
from policies.planning.profile import Profile
from policies.planning.topology import Topology


class TorchServePolicy(Policy):
    name = "torchserve"

    def plan(self, profile: Profile | None, topology: Topology, distribution: BatchDistribution) -> Plan:
        workers = topology.logical_cpus
        threads = topology.usable_cores  # PyTorch's default intra-op threads: one per physical core
        batch = distribution.max_batch
        per_worker = [batch // workers + (1 if k < batch % workers else 0) for k in range(workers)]
        return Plan(
            # A worker with no share of the reference batch is still started, as TorchServe does.
            instances=tuple(InstancePlan(threads, b) for b in per_worker),
            policy=self.name,
            reason=f"{workers} workers (one per logical CPU) × {threads} threads each, oversubscribed",
            oversubscribed=True,
            split="even",
        )
