"""The joint strategy's slow rule: the choice among splits (policies.colocation_choice) fed from a model's
readings (packrat_daemon.coordinate.readings, which the Watch of packrat_daemon.coordinate.watch extends).

`judge` is the slow rule's last step when the strategy chooses among splits: it judges the candidates on
the rates now and at their upper bound (n + noise_z·√n inputs counted instead of n, the margin a Poisson
rate's noise asks of a predicted gain), or, while some model's traffic is bursty (`bursty`), on the last
history_s as it came (`history`, stretches of bin_s); the fast rule then stands down (packrat_daemon.
coordinate.watch), since a burst shorter than a move cannot be followed, and the split held must carry the
models through the bursts. A move is made at most once per cool-down unless it relieves a saturated model,
and every model on all the cores (the start, the safe default) is left only once arrivals_s of rates exist.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from packrat_daemon.coordinate.readings import Readings
from policies.colocation import JointPlan, ModelDemand
from policies.colocation_choice import BURST_BINS, Choice, RateHistory, collide
from policies.colocation_choice import bursty as is_bursty

# The strategy's choice among splits: (demands, histories to judge on, split served, min gain, bursty).
Chooser = Callable[[Sequence[ModelDemand], Sequence[RateHistory], JointPlan, float, float | None], Choice]


@dataclass(frozen=True)
class Judged:
    """The slow rule's verdict: the choice, whether to move to it, and whether to ask again at the next look
    whatever the rates do (a split that won while the first seconds were still being read)."""

    choice: Choice
    move: bool
    again: bool = False


def judge(
    watch: Readings,
    now: float,
    slow: Sequence[ModelDemand],
    served: JointPlan,
    choose: Chooser,
    burst: bool,
    settled: bool = True,
) -> Judged:
    """The slow rule by the strategy's choice among splits: judged on the bursts as they came, or on the
    rates now and at their upper bound; whether to move (at most once per cool-down unless the move relieves
    a saturated model; never to a split that leaves more models saturated than the one served). Unless
    `settled`, the rates' window still mixes the traffic before a change with the traffic after it: two
    models each half busy over it may never be busy together, so such a window overstates the collisions on
    shared cores. On it only a move back to every model on all the cores (which
    the overstatement cannot favour) or one that relieves a saturated model is made; a move to a split waits
    for the window to hold the new traffic alone."""
    settings = watch.settings
    histories = [RateHistory.steady(slow), RateHistory.steady(upper(watch, now, slow))]
    collisions = collide([counts(watch, name, now) for name in watch.names]) if burst else None
    choice = choose(slow, histories, served, settings.min_gain, collisions)
    relieves = len(choice.plan.saturated) < len(served.saturated)
    if len(choice.plan.saturated) > len(served.saturated):
        # The choice scores a split by its delay over HOLD_S, which a small overload adds little to; but a split
        # its own queueing model leaves more models saturated than the one served is never moved to: near
        # saturation that is the noise of the rates, and the look after such a move relieved it at once.
        return Judged(choice, False)
    # A burst is told from a shift by falling back within BURST_BINS stretches: until that long has been read,
    # a rise may be either, and a move slower than a burst cannot follow one.
    settle = max(settings.arrivals_s, (BURST_BINS + 1) * settings.bin_s)
    if served.shared and not choice.plan.shared and not watch.covered(now, settle):
        # Every model on all the cores is the safe default: it is left for a split only once the first
        # seconds have shown whether the traffic comes in bursts, so that the first burst starts no chase.
        return Judged(choice, False, again=True)  # asked again at the next look, not only once the rates change
    if not (settled or relieves or choice.plan.shared):
        return Judged(choice, False)
    return Judged(choice, choice.move and (now - watch.last_move >= settings.cooldown_s or relieves))


def upper(watch: Readings, now: float, demands: Sequence[ModelDemand]) -> tuple[ModelDemand, ...]:
    """`demands` at each model's rate noise_z standard deviations above its estimate: n + z·√n inputs
    counted over the slow window instead of n."""
    span, z = watch.settings.arrivals_s, watch.settings.noise_z
    raised = []
    for demand in demands:
        counted = watch.inputs_per_s(demand.name, now, span) * span
        factor = (counted + z * math.sqrt(counted)) / counted if counted > 0 else 1.0
        raised.append(dataclasses.replace(demand, rate_per_s=demand.rate_per_s * factor))
    return tuple(raised)


def counts(watch: Readings, name: str, now: float) -> list[int]:
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


def bursts(watch: Readings, now: float) -> bool:
    """Whether some model's requests over the last history_s, per bin_s, come in bursts (colocation_choice)."""
    return any(is_bursty(counts(watch, name, now)) for name in watch.names)
