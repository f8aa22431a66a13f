"""One instance with every usable core: what PyTorch does by default."""

from __future__ import annotations

from policies.base import InstancePlan, Plan, Policy
from policies.planning.distribution import BatchDistribution
from policies.planning.profile import Profile
from policies.planning.topology import Topology


class SinglePolicy(Policy):
    name = "single"

    def plan(self, profile: Profile | None, topology: Topology, distribution: BatchDistribution) -> Plan:
        threads = topology.usable_cores
        batch = distribution.max_batch
        predicted = profile.lhat(threads, batch) if profile is not None else None
        return Plan(
            instances=(InstancePlan(threads, batch),),
            policy=self.name,
            reason=f"one instance with all {threads} usable cores (PyTorch's default)",
            predicted_latency_ms=predicted,
        )
