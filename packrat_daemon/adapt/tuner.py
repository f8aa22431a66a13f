"""The tuner: when the live distribution moves, ask the policy for a plan and decide whether to switch.

Hysteresis (switch only for a predicted gain of at least `min_gain`), a cool-down between switches and
a minimum number of observed batches keep the pool from flapping; the policy itself stays a pure
function. The tuner only proposes: the daemon hands an accepted plan to the reconciler.
"""

from __future__ import annotations

from dataclasses import dataclass

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

    def consider(
        self, current: Plan, distribution: BatchDistribution, observed: int, now: float, moved: bool = False
    ) -> Decision | None:
        """A plan to switch to, or None. `moved`: the batch sizes just changed (the estimator restarted its
        counts): the wait for batches and the cool-down, which keep noise in a steady stream from switching
        the plan, are skipped once, since the traffic itself has changed; the gain is still required."""
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
        self.last_switch = now
        return Decision(proposed, current_ms, proposed_ms)

    def expected_latency(self, plan: Plan, distribution: BatchDistribution) -> float:
        expected = self.policy.expected_latency(self.profile, plan, distribution)
        if expected is None:
            raise PolicyError(
                f"policy {self.policy.name!r} adapts but cannot predict a plan's expected latency; "
                "implement Policy.expected_latency or set adapts = False"
            )
        return expected
