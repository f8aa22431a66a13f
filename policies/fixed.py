"""The user's own ⟨instances, threads, batch⟩.

Syntax: comma-separated items ``[COUNT*]THREADSxBATCH``; ``2*1x8`` is two instances of one thread
taking 8 inputs each.
"""

from __future__ import annotations

import re

from packrat_daemon.wire.errors import PolicyError
from policies.base import InstancePlan, Plan, Policy, PolicySettings
from policies.planning.distribution import BatchDistribution
from policies.planning.profile import Profile
from policies.planning.topology import Topology

_ITEM = re.compile(r"^\s*(?:(\d+)\s*\*\s*)?(\d+)\s*x\s*(\d+)\s*$")


def parse_plan(text: str) -> tuple[InstancePlan, ...]:
    instances: list[InstancePlan] = []
    for item in text.split(","):
        match = _ITEM.match(item)
        if not match:
            raise PolicyError(
                f"cannot read plan item {item.strip()!r}; write [COUNT*]THREADSxBATCH items separated by "
                "commas, e.g. 2*1x8 for two 1-thread instances taking 8 inputs each"
            )
        count, threads, batch = int(match.group(1) or 1), int(match.group(2)), int(match.group(3))
        if count < 1 or threads < 1 or batch < 1:
            raise PolicyError(f"plan item {item.strip()!r}: count, threads and batch must all be >= 1")
        instances.extend(InstancePlan(threads, batch) for _ in range(count))
    return tuple(instances)


class FixedPolicy(Policy):
    name = "fixed"

    def __init__(self, plan: str | None = None) -> None:
        if not plan:
            raise PolicyError("the fixed policy needs a plan, e.g. --plan 2*1x8 (two 1-thread instances)")
        self.instances = parse_plan(plan)
        self.text = plan

    @classmethod
    def from_settings(cls, settings: PolicySettings) -> FixedPolicy:
        return cls(plan=settings.plan)

    def plan(self, profile: Profile | None, topology: Topology, distribution: BatchDistribution) -> Plan:
        total = sum(i.threads for i in self.instances)
        if total > topology.usable_cores:
            raise PolicyError(
                f"the fixed plan {self.text!r} needs {total} cores but only {topology.usable_cores} are "
                "usable; use fewer threads or instances"
            )
        predicted = None
        if profile is not None:
            lhats = [profile.lhat(i.threads, i.batch) for i in self.instances]
            predicted = None if None in lhats else max(lat for lat in lhats if lat is not None)
        return Plan(
            instances=self.instances,
            policy=self.name,
            reason=f"the user's plan {self.text}",
            predicted_latency_ms=predicted,
        )
