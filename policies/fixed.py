"""The user's own ⟨instances, threads, batch⟩.

Syntax: comma-separated items ``[COUNT*]THREADSxBATCH``; ``2*1x8`` is two instances of one thread
taking 8 inputs each.

The text comes from the command line, the TOML file or a control request, so it is bounded before
anything is built from it: its length, then (as counts, before one instance exists) the cores its
instances need against the usable cores, and each batch against `max_batch` where that is known.
`1000000000*1x1` is refused in microseconds instead of building a billion instances.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from packrat_daemon.wire.errors import PolicyError
from policies.base import InstancePlan, Plan, Policy, PolicySettings
from policies.planning.distribution import BatchDistribution
from policies.planning.profile import Profile
from policies.planning.topology import Topology

MAX_PLAN_CHARS = 1000  # far more than any machine's plan needs (COUNT* folds equal instances)
_ITEM = re.compile(r"^\s*(?:(\d+)\s*\*\s*)?(\d+)\s*x\s*(\d+)\s*$")


@dataclass(frozen=True)
class PlanItem:
    """One ``COUNT*THREADSxBATCH`` item, kept as counts: nothing is expanded until the cores are checked."""

    count: int
    threads: int
    batch: int


def parse_items(text: str, max_batch: int | None = None) -> tuple[PlanItem, ...]:
    """The items of a plan text; PolicyError for a text too long, an unreadable item, or a batch over `max_batch`."""
    if len(text) > MAX_PLAN_CHARS:
        raise PolicyError(
            f"the plan is {len(text)} characters long, more than {MAX_PLAN_CHARS}; write equal instances once "
            "with a count, e.g. 4*1x8"
        )
    items = []
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
        if max_batch is not None and batch > max_batch:
            raise PolicyError(
                f"plan item {item.strip()!r}: an instance taking {batch} inputs would never be given that many, "
                f"since a batch holds at most max_batch {max_batch}; use a batch of at most {max_batch}"
            )
        items.append(PlanItem(count, threads, batch))
    return tuple(items)


def parse_plan(text: str, usable_cores: int, max_batch: int | None = None) -> tuple[InstancePlan, ...]:
    """The instances of a plan text that fits `usable_cores` (and `max_batch`); PolicyError otherwise, raised
    from the counts before any instance is built."""
    items = parse_items(text, max_batch)
    total = sum(item.count * item.threads for item in items)
    if total > usable_cores:
        raise PolicyError(
            f"the fixed plan {text!r} needs {total} cores but only {usable_cores} are usable; use fewer threads "
            "or instances"
        )
    return tuple(InstancePlan(item.threads, item.batch) for item in items for _ in range(item.count))


class FixedPolicy(Policy):
    name = "fixed"

    def __init__(self, plan: str | None = None, max_batch: int | None = None) -> None:
        if not plan:
            raise PolicyError("the fixed policy needs a plan, e.g. --plan 2*1x8 (two 1-thread instances)")
        self.items = parse_items(plan, max_batch)  # a plan that cannot be read fails when it is given
        self.text = plan
        self.max_batch = max_batch

    @classmethod
    def from_settings(cls, settings: PolicySettings) -> FixedPolicy:
        return cls(plan=settings.plan, max_batch=settings.max_batch)

    def plan(self, profile: Profile | None, topology: Topology, distribution: BatchDistribution) -> Plan:
        instances = parse_plan(self.text, topology.usable_cores, self.max_batch)
        predicted = None
        if profile is not None:
            lhats = [profile.lhat(i.threads, i.batch) for i in instances]
            predicted = None if None in lhats else max(lat for lat in lhats if lat is not None)
        return Plan(
            instances=instances,
            policy=self.name,
            reason=f"the user's plan {self.text}",
            predicted_latency_ms=predicted,
        )
