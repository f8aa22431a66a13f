"""How a coordinator splits the machine's cores among the models: `packrat coordinate`'s joint plan, and the
splits users make today that its simulation compares it with.

- `joint`: what `packrat coordinate` does: policies.colocation_choice.choose among every model on all cores,
  the even and proportional splits and policies.colocation.plan_jointly's split, judged on the traffic seen
  (its fast rule moves to plan_jointly's split at once);
- `every`: each model plans for all the machine's cores, as independent daemons do (the shares overlap);
- `even`: a static even split;
- `proportional`: cores in proportion to each model's offered work.

A `Strategy` proposes a split for the models' demands and re-scores the split served under them; the
co-location loop (packrat_daemon.coordinate.core) asks it at every look. Pure functions of their inputs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from packrat_daemon.measure.emulation import DEFAULT_FULL_LOAD
from packrat_daemon.wire.errors import ConfigError
from policies.colocation import JointPlan, ModelDemand, evaluate, plan_jointly
from policies.colocation_choice import (
    MODE_GAIN,
    Choice,
    RateHistory,
    Scorer,
    choose,
    even_counts,
    proportional_split,
    shared_plan,
)

STRATEGIES = ("joint", "every", "even", "proportional")
__all__ = ["STRATEGIES", "Strategy", "even_counts", "every_core", "proportional_split"]


@dataclass(frozen=True)
class Strategy:
    name: str  # one of STRATEGIES
    cores: int  # the machine's usable cores
    min_cores: int = 1  # the fewest a model is given (joint and proportional)
    # The slow-down with every core busy that the joint strategy's choice predicts with (its interference):
    # the emulation's default, fitted to Inception-v3 instances measured side by side (docs/emulation.md).
    full_load: float = DEFAULT_FULL_LOAD
    # How the joint strategy's choice scores a candidate split on a rate history: None, the closed-form
    # prediction (policies.colocation_choice.predicted_delay); or a callable passed in from above, such as the
    # simulation's replay of the recent traffic (packrat_daemon.simulate.colocated_replay), which this layer
    # cannot import. `mode_gain`: the least gain of a move between every model on all cores and a split.
    score: Scorer | None = field(default=None, compare=False)
    mode_gain: float = MODE_GAIN
    judge_bursts: bool = False  # bursts that rarely meet judged by `score` too, not served on all cores by rule

    def __post_init__(self) -> None:
        if self.name not in STRATEGIES:
            raise ConfigError(f"unknown co-location strategy {self.name!r}; choose one of {', '.join(STRATEGIES)}")

    def propose(self, demands: Sequence[ModelDemand]) -> JointPlan:
        """The split this strategy gives `demands`, with each model's plan inside its share."""
        name, cores = self.name, self.cores
        if name == "joint":
            return plan_jointly(demands, cores, self.min_cores)
        if name == "every":
            return every_core(demands, cores)
        if name == "even":
            return evaluate(demands, even_counts(len(demands), cores))
        loads = [evaluate([d], [cores]).shares[0].busy_fraction for d in demands]
        return evaluate(demands, proportional_split(loads, cores, self.min_cores))

    def rescore(self, demands: Sequence[ModelDemand], split: Sequence[int]) -> JointPlan:
        """The split served (`split`: each model's cores; more than the machine's in all: every model on all
        of them) under `demands`."""
        if self.name == "every":
            return every_core(demands, self.cores)
        if sum(split) > self.cores:
            return shared_plan(demands, self.cores, self.full_load)
        return evaluate(demands, split, total_cores=self.cores)

    def choose(
        self,
        demands: Sequence[ModelDemand],
        histories: Sequence[RateHistory],
        current: JointPlan,
        min_gain: float,
        collisions: float | None,
    ) -> Choice:
        """The joint strategy's choice among splits (policies.colocation_choice.choose) for its slow rule."""
        return choose(
            demands,
            self.cores,
            histories,
            current,
            min_gain,
            self.min_cores,
            collisions,
            self.full_load,
            self.score,
            self.mode_gain,
            self.judge_bursts,
        )


def every_core(demands: Sequence[ModelDemand], cores: int) -> JointPlan:
    """Each model planned for all `cores` as if alone: what independent daemons do (the shares overlap)."""
    shares = tuple(evaluate([demand], [cores]).shares[0] for demand in demands)
    total = sum(d.rate_per_s for d in demands)
    weights = [d.rate_per_s / total if total else 1 / len(demands) for d in demands]
    predicted = sum(w * s.predicted_ms for w, s in zip(weights, shares, strict=True) if w > 0)
    return JointPlan(shares, cores, predicted)
