"""How a coordinator splits the machine's cores among the models: `packrat coordinate`'s joint plan, and the
splits users make today that its simulation compares it with.

- `joint`: policies.colocation.plan_jointly (what `packrat coordinate` does);
- `every`: each model plans for all the machine's cores, as independent daemons do (the shares overlap);
- `even`: a static even split;
- `proportional`: cores in proportion to each model's offered work.

A `Strategy` proposes a split for the models' demands and re-scores the split served under them; the
co-location loop (packrat_daemon.coordinate.core) asks it at every look. Pure functions of their inputs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from packrat_daemon.wire.errors import ConfigError
from policies.colocation import JointPlan, ModelDemand, evaluate, plan_jointly

STRATEGIES = ("joint", "every", "even", "proportional")


@dataclass(frozen=True)
class Strategy:
    name: str  # one of STRATEGIES
    cores: int  # the machine's usable cores
    min_cores: int = 1  # the fewest a model is given (joint and proportional)

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
        """The split served (`split`: each model's cores) under `demands`."""
        if self.name == "every":
            return every_core(demands, self.cores)
        return evaluate(demands, split, total_cores=self.cores)


def even_counts(models: int, cores: int) -> list[int]:
    """The cores as evenly as they divide, the first models taking the remainder (none checked: see
    `coordinate.shares.even_split` for the coordinator's checked one)."""
    base, extra = divmod(cores, models)
    return [base + (1 if k < extra else 0) for k in range(models)]


def proportional_split(loads: Sequence[float], cores: int, min_cores: int = 1) -> list[int]:
    """min_cores each, the rest in proportion to `loads` by largest remainder (even when there is no load)."""
    spare = cores - min_cores * len(loads)
    if spare < 0:
        raise ConfigError(f"{len(loads)} models need {min_cores} core(s) each; the machine has {cores}")
    total = sum(loads)
    if total <= 0:
        return [min_cores + extra for extra in even_counts(len(loads), spare)]
    exact = [spare * load / total for load in loads]
    given = [math.floor(x) for x in exact]
    order = sorted(range(len(loads)), key=lambda k: (-(exact[k] - given[k]), k))
    for k in order[: spare - sum(given)]:
        given[k] += 1
    return [min_cores + g for g in given]


def every_core(demands: Sequence[ModelDemand], cores: int) -> JointPlan:
    """Each model planned for all `cores` as if alone: what independent daemons do (the shares overlap)."""
    shares = tuple(evaluate([demand], [cores]).shares[0] for demand in demands)
    total = sum(d.rate_per_s for d in demands)
    weights = [d.rate_per_s / total if total else 1 / len(demands) for d in demands]
    predicted = sum(w * s.predicted_ms for w, s in zip(weights, shares, strict=True) if w > 0)
    return JointPlan(shares, cores, predicted)
