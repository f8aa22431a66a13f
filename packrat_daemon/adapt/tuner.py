"""The tuner: when the live distribution moves, ask the policy for a plan and decide whether to switch.

Hysteresis (switch only for a predicted gain of at least `min_gain`), a cool-down between switches and
a minimum number of observed batches keep the pool from flapping; the policy itself stays a pure
function. The tuner only proposes: the daemon hands an accepted plan to the reconciler.

A switch that forks workers also costs: each fork warms the model up on cores the serving workers use, for the
measured `fork_s` (seconds under load for ResNet-50; the old plan serves meanwhile, slowed). So such a switch is
made only when its predicted gain over the remaining traffic covers it (`covers_switch`): the traffic is expected to
last about as long again as it has lasted since it last moved (`lasted_s`), and over that time the gain, a fraction
of the serving time, must be worth at least the share of the cores the forks take for `fork_s`. A switch the live
and parked workers cover (re-threaded in place) costs nothing and is not held back.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from packrat_daemon.config import ServeConfig
from packrat_daemon.wire.errors import PolicyError
from policies.base import Plan, Policy
from policies.planning.distribution import BatchDistribution
from policies.planning.profile import Profile
from policies.planning.topology import Topology


@dataclass(frozen=True)
class TunerSettings:
    """The tuner's view of the adapt_* settings; their defaults and help live in packrat_daemon.config."""

    min_batches: int  # batches observed since the last plan before a switch is considered
    min_gain: float  # predicted expected-latency gain needed to switch
    cooldown_s: float  # least time between two switches

    @classmethod
    def of(cls, config: ServeConfig) -> TunerSettings:
        return cls(config.adapt_min_batches, config.adapt_min_gain, config.adapt_cooldown_s)


class SwitchCost(Protocol):
    """What a switch would fork, and what a fork measured (the reconciler)."""

    @property
    def fork_s(self) -> float | None: ...  # the last fork's time from spawn to ready; None: none timed

    def forks_needed(self, plan: Plan) -> list[int]: ...  # the threads of each worker a switch to `plan` forks


def covers_switch(gain: float, lasted_s: float, fork_s: float, forked_cores: int, cores: int) -> bool:
    """Whether a predicted `gain` (a fraction of the serving time) over the remaining traffic, expected to last as
    long again as it has (`lasted_s`), is worth the `forked_cores` of `cores` that forks warming up for `fork_s`
    take from the batches."""
    return gain * lasted_s >= fork_s * min(1.0, forked_cores / max(1, cores))


@dataclass(frozen=True)
class Decision:
    plan: Plan
    current_ms: float
    proposed_ms: float


class Tuner:
    def __init__(self, policy: Policy, profile: Profile, topology: Topology, settings: TunerSettings) -> None:
        self.policy = policy
        self.profile = profile
        self.topology = topology
        self.settings = settings
        self.last_switch = float("-inf")
        self.declined = ""  # why the last look kept the plan, for the log after a change of the traffic
        self.switch_cost: SwitchCost | None = None  # None: switches cost nothing (no reconciler to ask)

    def consider(
        self,
        current: Plan,
        distribution: BatchDistribution,
        observed: int,
        now: float,
        moved: bool = False,
        lasted_s: float = float("inf"),
    ) -> Decision | None:
        """A plan to switch to, or None. `moved`: the batch sizes just changed (the estimator restarted its
        counts): the wait for batches and the cool-down, which keep noise in a steady stream from switching
        the plan, are skipped once, since the traffic itself has changed; the gain is still required, and a switch
        that forks must pay for itself over the traffic's remaining time (`lasted_s`: how long it has lasted)."""
        if not moved and observed < self.settings.min_batches:
            self.declined = f"{observed} batches since the last plan, {self.settings.min_batches} needed"
            return None
        if not moved and now - self.last_switch < self.settings.cooldown_s:
            self.declined = f"the last plan change was {now - self.last_switch:.0f} s ago, the cool-down is longer"
            return None
        proposed = self.policy.plan(self.profile, self.topology, distribution)
        current_ms = self.expected_latency(current, distribution)
        proposed_ms = self.expected_latency(proposed, distribution)
        if not proposed_ms < current_ms * (1.0 - self.settings.min_gain):
            self.declined = (
                f"the plan served is predicted at {current_ms:.1f} ms, the best one for it at {proposed_ms:.1f} ms: "
                f"less than the {self.settings.min_gain:.0%} gain needed to switch"
            )
            return None
        if not self._pays_for_forks(proposed, 1.0 - proposed_ms / current_ms, lasted_s):
            return None
        self.last_switch = now
        return Decision(proposed, current_ms, proposed_ms)

    def _pays_for_forks(self, proposed: Plan, gain: float, lasted_s: float) -> bool:
        cost = self.switch_cost
        forks = [] if cost is None else cost.forks_needed(proposed)
        if cost is None or not forks or cost.fork_s is None:
            return True
        if covers_switch(gain, lasted_s, cost.fork_s, sum(forks), self.topology.usable_cores):
            return True
        self.declined = (
            f"a switch forks {len(forks)} worker(s), {cost.fork_s:.1f} s each as measured, on cores the batches use: a "
            f"{gain:.0%} gain over the traffic's next {lasted_s:.0f} s (as long as it has lasted) does not pay for it"
        )
        return False

    def expected_latency(self, plan: Plan, distribution: BatchDistribution) -> float:
        expected = self.policy.expected_latency(self.profile, plan, distribution)
        if expected is None:
            raise PolicyError(
                f"policy {self.policy.name!r} adapts but cannot predict a plan's expected latency; "
                "implement Policy.expected_latency or set adapts = False"
            )
        return expected
