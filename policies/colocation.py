"""The joint plan of several models on one machine: how many cores each gets, and its ⟨i, t, b⟩ inside them.

Two daemons that each plan for every usable core oversubscribe the machine by 2× whenever both are busy.
This planner divides the usable cores among the models instead, so their plans together never hold more
threads than there are cores, and picks each model's pool inside its share. It is a pure function of
frozen inputs, as every policy is; a coordinator applies its answer (docs/colocation.md).

Method:

1. **Each model on each core count.** For every model m and every share c in min_cores..cores, the packrat
   policy's plan on c cores for m's live batch sizes (`policies.packrat`, the exact solver), and that plan's
   service time for each batch size: the fastest of its layouts that carries the batch
   (`policies.planning.layouts.LayoutTable`, as the policy's own `expected_latency`). Over the batch
   distribution that gives the service time's mean E[S] and second moment E[S²].
2. **Queueing.** Batches reach a model at λ per second; its sojourn (queue and service) is the M/G/1
   mean by Pollaczek–Khinchine: W = E[S] + λ·E[S²] / (2·(1 − ρ)), with ρ = λ·E[S]. A model near
   saturation thus gains much more from a core than one at rest, which a split proportional to load
   does not see. At ρ ≥ 1 the queue grows without bound: W is infinite. One server per model is the
   daemon's own shape (one batch in flight at a time); the service times are the profile's, which hold
   because the shares are disjoint and so no model slows another by oversubscription.
3. **Dividing the cores exactly.** A dynamic programme over models × cores used minimises, lexicographically:
   the load the split cannot carry (Σ ρ over the saturated models), then how far the models with a
   latency target are over it (Σ of each excess over its target, relative), then the traffic-weighted
   mean sojourn Σ λ_m·W_m / Σ λ_m (equal weights when no model has traffic). Each term is a sum over
   models, so the order is exact under the DP. On equal scores the cores go to the busier models
   (Σ λ_m·c_m, larger first), so a model without traffic keeps min_cores, and then to the earlier
   model. Every core is given: a core a share's plan does not use is headroom for that model.

A split whose best plans saturate some model is still returned, with `predicted_ms` infinite (and None
in its JSON): it is the least overloaded split, and the caller decides. `worth_moving` is the hysteresis
a coordinator applies before moving cores: a move costs workers started and stopped, so a predicted
gain under `min_gain` is not worth one.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from packrat_daemon.wire.errors import InfeasibleError, ProfileError
from policies.base import Plan, format_ms
from policies.colocation_options import Option, options, sojourn_ms
from policies.planning.distribution import BatchDistribution
from policies.planning.profile import Profile

# Two scores this close (relative) are a tie, so that float rounding never decides where a core goes.
TIE = 1e-9


@dataclass(frozen=True)
class ModelDemand:
    """What one model asks of the machine: its profile, live batch sizes and batch arrival rate."""

    name: str
    profile: Profile
    distribution: BatchDistribution  # the live batch sizes, as the daemon batches them
    rate_per_s: float  # batches per second as the daemon sees them
    target_ms: float | None = None  # a mean sojourn to keep under before the mean is minimised

    def __post_init__(self) -> None:
        if not self.name:
            raise ProfileError("each model on the machine needs a non-empty name")
        if not (self.rate_per_s >= 0 and math.isfinite(self.rate_per_s)):
            raise ProfileError(
                f"model {self.name}: the arrival rate must be zero or more batches per second, got {self.rate_per_s}"
            )
        if self.target_ms is not None and not (self.target_ms > 0 and math.isfinite(self.target_ms)):
            raise ProfileError(
                f"model {self.name}: a latency target must be a positive number of ms (or none), got {self.target_ms}"
            )


@dataclass(frozen=True)
class ModelShare:
    name: str
    cores: int  # usable cores this model gets
    plan: Plan  # feasible on Topology.synthetic(cores)
    service_ms: float  # expected service time of one batch under this plan
    predicted_ms: float  # expected sojourn: queueing + service (inf when saturated)
    busy_fraction: float  # rate × service time (utilisation; 1 or more: saturated)
    target_ms: float | None = None  # the model's target, if it declared one
    second_ms2: float = 0.0  # the service time's second moment under this plan
    busy_threads: float = 0.0  # threads one batch keeps busy, on average

    @property
    def saturated(self) -> bool:
        return self.busy_fraction >= 1.0

    @property
    def meets_target(self) -> bool:
        return self.target_ms is None or self.predicted_ms <= self.target_ms

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "cores": self.cores,
            "plan": self.plan.to_json(),
            "service_ms": _finite(self.service_ms),
            "predicted_ms": _finite(self.predicted_ms),
            "busy_fraction": _finite(self.busy_fraction),
            "target_ms": self.target_ms,
        }


@dataclass(frozen=True)
class JointPlan:
    shares: tuple[ModelShare, ...]  # in the order of the demands
    cores: int  # the machine's usable cores
    predicted_ms: float  # traffic-weighted mean sojourn over all models (inf when one is saturated)
    # Every model planned for all the cores, the shares overlapping (policies.colocation_choice.shared_plan):
    # each share's service time is then its own plan's slowed by the others' collisions.
    shared: bool = False

    def share(self, name: str) -> ModelShare:
        for share in self.shares:
            if share.name == name:
                return share
        raise ProfileError(f"no model named {name!r} in this joint plan (models: {', '.join(self.names)})")

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(share.name for share in self.shares)

    @property
    def split(self) -> tuple[int, ...]:
        """The cores of each model, in the order of the demands."""
        return tuple(share.cores for share in self.shares)

    @property
    def saturated(self) -> tuple[str, ...]:
        return tuple(share.name for share in self.shares if share.saturated)

    @property
    def missed_targets(self) -> tuple[str, ...]:
        return tuple(share.name for share in self.shares if not share.meets_target)

    def describe(self) -> str:
        parts = [f"{s.name} {s.cores} cores ({s.plan.describe()})" for s in self.shares]
        mean = "saturated" if math.isinf(self.predicted_ms) else f"mean sojourn {format_ms(self.predicted_ms)}"
        return f"{' · '.join(parts)}; {mean}"

    def to_json(self) -> dict[str, Any]:
        return {
            "cores": self.cores,
            "shared": self.shared,
            "predicted_ms": _finite(self.predicted_ms),
            "saturated": list(self.saturated),
            "missed_targets": list(self.missed_targets),
            "shares": [share.to_json() for share in self.shares],
        }


def plan_jointly(demands: Sequence[ModelDemand], cores: int, min_cores: int = 1) -> JointPlan:
    """The split of `cores` among `demands` and each model's plan inside its share (the module's method)."""
    _check(demands, cores, min_cores)
    options = [_options(demand, cores - min_cores * (len(demands) - 1), min_cores) for demand in demands]
    weights = _weights(demands)
    # best[used] = (score, split) over the models placed so far, using exactly `used` cores.
    best: dict[int, tuple[tuple[float, ...], tuple[int, ...]]] = {0: ((0.0, 0.0, 0.0, 0.0), ())}
    for index, demand in enumerate(demands):
        left = min_cores * (len(demands) - index - 1)  # cores the models after this one still need
        step: dict[int, tuple[tuple[float, ...], tuple[int, ...]]] = {}
        for used, (score, split) in best.items():
            for share, option in options[index].items():
                total = used + share
                if total + left > cores:
                    continue
                term = _score(demand, option, share, weights[index])
                candidate = (tuple(a + b for a, b in zip(score, term, strict=True)), (*split, share))
                if total not in step or _better(candidate, step[total]):
                    step[total] = candidate
        best = step
    if cores not in best:  # every model had a feasible option or _options raised; so `cores` is reachable
        raise AssertionError("the DP left the machine's cores unreachable")
    return evaluate(demands, best[cores][1], total_cores=cores)


def evaluate(demands: Sequence[ModelDemand], cores_each: Sequence[int], total_cores: int | None = None) -> JointPlan:
    """The joint plan of a given split: each model's best plan inside its share, scored as plan_jointly scores.

    For the baselines (an even or proportional split) and to re-score the current split under new demands.
    `total_cores`: the machine's cores (default: the sum of the shares)."""
    if len(cores_each) != len(demands):
        raise ProfileError(f"a split needs one core count per model: {len(demands)} models, {len(cores_each)} counts")
    cores = sum(cores_each) if total_cores is None else total_cores
    _check(demands, cores, 1)
    if any(c < 1 for c in cores_each) or sum(cores_each) > cores:
        raise InfeasibleError(
            f"the split {list(cores_each)} gives a model no core or more than the machine's {cores} in total; "
            "give each model at least one core and at most the machine's cores together",
            largest_servable_batch=0,
        )
    shares = []
    for demand, share in zip(demands, cores_each, strict=True):
        option = _options(demand, share, share).get(share)
        if option is None:
            raise InfeasibleError(
                f"model {demand.name} has no plan on {share} cores for batches up to "
                f"{demand.distribution.max_batch}; give it more cores or profile its smaller thread counts",
                largest_servable_batch=0,
            )
        shares.append(_share(demand, share, option))
    weights = _weights(demands)
    predicted = sum(w * s.predicted_ms for w, s in zip(weights, shares, strict=True) if w > 0)
    return JointPlan(tuple(shares), cores, predicted)


def worth_moving(current: JointPlan, proposed: JointPlan, min_gain: float) -> bool:
    """Whether to move from `current` (re-scored under the demands `proposed` was planned for) to `proposed`.

    Only a different split moves cores. It is worth it when it carries load the current one cannot, meets
    targets the current one misses, or cuts the predicted mean sojourn by at least `min_gain` (a fraction).
    When both leave the same models saturated (a burst above what any share carries), it is worth it when
    it cuts their overload (Σ ρ, the planner's first term) by `min_gain`: the queue then grows slower.
    """
    if not 0.0 <= min_gain < 1.0:
        raise ProfileError(f"min_gain is a fraction in [0, 1), e.g. 0.1 for 10%; got {min_gain!r}")
    if current.names != proposed.names:
        raise ProfileError(
            f"the plans are of different models ({', '.join(current.names)} and {', '.join(proposed.names)}); "
            "re-score the current split with evaluate() under the new demands first"
        )
    if current.split == proposed.split:
        return False
    if len(proposed.saturated) != len(current.saturated):
        return len(proposed.saturated) < len(current.saturated)
    if len(proposed.missed_targets) != len(current.missed_targets):
        return len(proposed.missed_targets) < len(current.missed_targets)
    if math.isinf(proposed.predicted_ms) and math.isinf(current.predicted_ms):
        # Both leave the same number of models saturated: the one that overloads them less drains sooner.
        return _overload(proposed) <= _overload(current) * (1.0 - min_gain)
    if math.isinf(proposed.predicted_ms):
        return False
    if math.isinf(current.predicted_ms):
        return True
    return proposed.predicted_ms <= current.predicted_ms * (1.0 - min_gain)


def should_move(
    current: JointPlan, proposed: JointPlan, min_gain: float, since_move_s: float = math.inf, cooldown_s: float = 0.0
) -> bool:
    """The coordinator's rule, one for `packrat coordinate` and the simulation: move to `proposed` when
    `worth_moving` says so, at most once per `cooldown_s` (seconds since the last move: `since_move_s`)
    unless the proposed split carries load the current one cannot (a growing queue waits for no cool-down)."""
    if cooldown_s < 0:
        raise ProfileError(f"the cool-down is a number of seconds >= 0, got {cooldown_s!r}")
    relieves = len(proposed.saturated) < len(current.saturated)
    if since_move_s < cooldown_s and not relieves:
        return False
    return worth_moving(current, proposed, min_gain)


# -- internals ---------------------------------------------------------------------------------


def _overload(plan: JointPlan) -> float:
    """The load a split cannot carry: Σ ρ over its saturated models (the first term of plan_jointly's score)."""
    return sum(share.busy_fraction for share in plan.shares if share.saturated)


def _check(demands: Sequence[ModelDemand], cores: int, min_cores: int) -> None:
    if not demands:
        raise ProfileError("a joint plan needs at least one model's demand")
    names = [demand.name for demand in demands]
    if len(set(names)) != len(names):
        raise ProfileError(f"each model on the machine needs its own name; got {names}")
    if cores < 1 or min_cores < 1:
        raise ProfileError(f"the machine's cores and each model's least share must be >= 1, got {cores}, {min_cores}")
    if len(demands) * min_cores > cores:
        raise InfeasibleError(
            f"{len(demands)} models need at least {min_cores} core(s) each, {len(demands) * min_cores} in all, but "
            f"the machine has {cores} usable; serve fewer models here, lower min_cores or give more cores",
            largest_servable_batch=0,
        )


def _weights(demands: Sequence[ModelDemand]) -> list[float]:
    """Each model's share of the traffic: its weight in the mean sojourn (equal when there is none)."""
    total = sum(demand.rate_per_s for demand in demands)
    if total <= 0:
        return [1.0 / len(demands)] * len(demands)
    return [demand.rate_per_s / total for demand in demands]


def _score(demand: ModelDemand, option: Option, share: int, weight: float) -> tuple[float, float, float, float]:
    """A model's terms of the lexicographic score: overload, target excess, weighted sojourn, -(rate × cores)."""
    rho = demand.rate_per_s / 1000.0 * option.mean_ms
    wait = sojourn_ms(option.mean_ms, option.second_ms2, demand.rate_per_s)
    if math.isinf(wait):
        return (rho, 0.0, 0.0, -demand.rate_per_s * share)
    excess = 0.0 if demand.target_ms is None else max(0.0, wait / demand.target_ms - 1.0)
    return (0.0, excess, weight * wait, -demand.rate_per_s * share)


def _better(a: tuple[tuple[float, ...], tuple[int, ...]], b: tuple[tuple[float, ...], tuple[int, ...]]) -> bool:
    """Whether score `a` beats `b`: lexicographic with a relative tie tolerance; then the earlier model's cores."""
    for x, y in zip(a[0], b[0], strict=True):
        if abs(x - y) > TIE * max(1.0, abs(x), abs(y)):
            return x < y
    return a[1] > b[1]


def _share(demand: ModelDemand, share: int, option: Option) -> ModelShare:
    busy = demand.rate_per_s / 1000.0 * option.mean_ms
    wait = sojourn_ms(option.mean_ms, option.second_ms2, demand.rate_per_s)
    return ModelShare(
        demand.name, share, option.plan, option.mean_ms, wait, busy, demand.target_ms, option.second_ms2,
        option.busy_threads,
    )  # fmt: skip


def _options(demand: ModelDemand, most: int, least: int) -> dict[int, Option]:
    return options(demand.name, demand.profile, demand.distribution, most, least)


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None
