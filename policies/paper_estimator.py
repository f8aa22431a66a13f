"""The Packrat paper's online estimator, as a baseline policy: EWMA of the queue depth, rounded to a power
of two, then the mode of the last 10 windows; the pool is the solver's optimum for that one batch size.

In the daemon every `plan` call after start-up is one adaptation window (the tuner asks at most once per
`adapt_interval_s`). The queue depth of a window is the mean batch the batcher dispatched in it: a batch
takes what is queued, up to max_batch, so the two differ only when the queue holds more than a batch.
Unlike the packrat policy, which plans one pool with spare layouts for the whole distribution, this
estimator commits to one batch size, which is what it is here to be compared with.

This is the one built-in policy with state (its windows): each daemon builds its own instance, and the
same windows give the same plan.
"""

from __future__ import annotations

import math
from collections import Counter, deque

from packrat_daemon.wire.errors import PolicyError
from policies.base import InstancePlan, Plan, Policy
from policies.planning.distribution import BatchDistribution
from policies.planning.layouts import LayoutTable
from policies.planning.profile import Profile
from policies.planning.topology import Topology
from policies.solver import Solver

WINDOWS = 10  # the paper's: the mode of the last 10 windows' estimates
SMOOTHING = 0.5  # weight of the newest window in the EWMA (the description gives none; an even mix)


class PaperEstimatorPolicy(Policy):
    name = "paper-estimator"
    needs_profile = True
    adapts = True

    def __init__(self) -> None:
        self._ewma: float | None = None
        self._estimates: deque[int] = deque(maxlen=WINDOWS)

    def plan(self, profile: Profile | None, topology: Topology, distribution: BatchDistribution) -> Plan:
        if profile is None:
            raise PolicyError("the paper-estimator policy needs a latency profile; pass --profile or let serve profile")
        depth = sum(batch * weight for batch, weight in distribution.weights)
        self._ewma = depth if self._ewma is None else SMOOTHING * depth + (1.0 - SMOOTHING) * self._ewma
        self._estimates.append(min(_power_of_two(self._ewma), _power_of_two_at_most(distribution.max_batch)))
        batch = _mode(self._estimates)
        solution = Solver(profile, topology.usable_cores).solve(batch)
        return Plan(
            instances=tuple(InstancePlan(t, b) for t, b in solution.instances),
            policy=self.name,
            reason=(
                f"optimum for batch {batch}: the mode over the last {WINDOWS} windows of the queue depth's "
                f"EWMA ({self._ewma:.1f} now) rounded to a power of two"
            ),
            predicted_latency_ms=solution.latency_ms,
        )

    def expected_latency(self, profile: Profile, plan: Plan, distribution: BatchDistribution) -> float:
        """Each batch size split exactly over the plan's instances; inf when they cannot carry one."""
        return LayoutTable(profile, plan.layout_threads, distribution).expected()


def _power_of_two(value: float) -> int:
    """The power of two nearest `value` on a log scale (at least 1)."""
    return 2 ** max(0, round(math.log2(max(value, 1.0))))


def _power_of_two_at_most(value: int) -> int:
    return 2 ** (max(value, 1).bit_length() - 1)


def _mode(values: deque[int]) -> int:
    """The most frequent value; on a tie, the one seen most recently."""
    counts = Counter(values)
    best = max(counts.values())
    return next(value for value in reversed(values) if counts[value] == best)
