"""The joint strategy's slow rule: the choice among splits (policies.colocation_choice) fed from a Watch.

`decide` is the slow rule's last step when the strategy chooses among splits: it judges the candidates on
the rates now and at their upper bound (n + noise_z·√n inputs counted instead of n, the margin a Poisson
rate's noise asks of a predicted gain), or, while some model's traffic is bursty (`bursty`), on the last
history_s as it came (`history`, stretches of bin_s); the fast rule then stands down (packrat_daemon.
coordinate.watch), since a burst shorter than a move cannot be followed, and the split held must carry the
models through the bursts. A move is made at most once per cool-down unless it relieves a saturated model.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from policies.colocation import JointPlan, ModelDemand
from policies.colocation_choice import Choice, RateHistory, collide
from policies.colocation_choice import bursty as is_bursty
from policies.planning.distribution import BatchDistribution

if TYPE_CHECKING:
    from packrat_daemon.coordinate.watch import Watch

# The strategy's choice among splits: (demands, histories to judge on, split served, min gain, bursty).
Chooser = Callable[[Sequence[ModelDemand], Sequence[RateHistory], JointPlan, float, float | None], Choice]


def judge(
    watch: Watch,
    now: float,
    bases: Sequence[ModelDemand],
    slow: Sequence[ModelDemand],
    served: JointPlan,
    choose: Chooser,
    burst: bool,
) -> tuple[bool, Choice]:
    """The slow rule by the strategy's choice among splits: judged on the bursts as they came, or on the
    rates now and at their upper bound; whether to move (at most once per cool-down unless the move relieves
    a saturated model), and the choice."""
    settings = watch.settings
    histories = [RateHistory.steady(slow), RateHistory.steady(upper(watch, now, slow))]
    collisions = collide([counts(watch, name, now) for name in watch.names]) if burst else None
    choice = choose(slow, histories, served, settings.min_gain, collisions)
    relieves = len(choice.plan.saturated) < len(served.saturated)
    return choice.move and (now - watch.last_move >= settings.cooldown_s or relieves), choice


def upper(watch: Watch, now: float, demands: Sequence[ModelDemand]) -> tuple[ModelDemand, ...]:
    """`demands` at each model's rate noise_z standard deviations above its estimate: n + z·√n inputs
    counted over the slow window instead of n."""
    span, z = watch.settings.arrivals_s, watch.settings.noise_z
    raised = []
    for demand in demands:
        counted = watch.inputs_per_s(demand.name, now, span) * span
        factor = (counted + z * math.sqrt(counted)) / counted if counted > 0 else 1.0
        raised.append(dataclasses.replace(demand, rate_per_s=demand.rate_per_s * factor))
    return tuple(raised)


def counts(watch: Watch, name: str, now: float) -> list[int]:
    """One model's requests in each stretch of bin_s over the last history_s (those its readings span)."""
    settings = watch.settings
    found = []
    start = now - settings.history_s
    while start + settings.bin_s <= now + 1e-9:
        counted = watch.count(name, start, start + settings.bin_s)
        if counted is not None:
            found.append(counted[0])
        start += settings.bin_s
    return found


def bursts(watch: Watch, now: float) -> bool:
    """Whether some model's requests over the last history_s, per bin_s, come in bursts (colocation_choice)."""
    return any(is_bursty(counts(watch, name, now)) for name in watch.names)


def _mean(distribution: BatchDistribution) -> float:
    return sum(batch * weight for batch, weight in distribution.weights)
