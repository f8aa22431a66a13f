"""Which split to serve, judged on the traffic a coordinator sees: the joint plan's, or a simple one.

The joint planner (policies.colocation) minimises a mean sojourn over disjoint shares at one rate per model.
That is the right split only when the rates hold and the models are busy together. When collisions are
rare, every model on all the cores serves each one on the whole machine while the others idle; when the
traffic comes in bursts shorter than a move, no split that follows it can be reached in time. So the
coordinator chooses among four candidates, each a pure function of the demands:

- `every`: every model planned for all the cores, the shares overlapping (`shared_plan`). Its service
  times are each model's own plan's, slowed while the others' batches run beside it: a batch of T_m busy
  threads with the others' T_j busy at once runs max(1, (T_m + Σ T_j) / cores) times slower (the cores
  time-shared), each other model busy with its own busy fraction, found by a fixed point (`collisions`).
  A batch's work progresses at 1/slow-down, so its time is stretched by the harmonic mean of the slow-downs
  over the others' states, not the arithmetic one, which overrated the collisions under heavy load and made
  splits look better than they run (docs/colocation.md, the family);
- `even` and `proportional` (cores in proportion to each model's busy fraction on all the cores);
- `joint`: `plan_jointly`'s split.

Each is scored by `predicted_delay` over a rate history: per stretch of it, each model's M/G/1 sojourn at
that stretch's rate (ρ capped at 0.95) plus the wait behind the work it could not carry (a fluid backlog
carried from one stretch to the next and drained as the load falls), traffic-weighted. Steady traffic is
one stretch of HOLD_S at the rates now (a split that cannot carry them is charged the queue it grows in
that time); bursty traffic is the last seconds as they came, so a split that carries every burst with the
whole machine beats one that would have to move at each. `choose` moves only to a candidate that beats the
split served by `min_gain` on every history it is given (the rates and their upper bound: the margin the
prediction's noise asks) and says which it serves and why.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from itertools import product
from typing import Any

from packrat_daemon.wire.errors import ConfigError, ProfileError
from policies.colocation import JointPlan, ModelDemand, ModelShare, evaluate, plan_jointly
from policies.colocation_options import sojourn_ms

MODES = ("every", "even", "proportional", "joint")
MODE_GAIN = 0.2  # the least predicted gain of a move between every model on all cores and a split
HOLD_S = 10.0  # steady rates are judged over this long: the queue a split that cannot carry them grows meanwhile
RHO_CAP = 0.95  # the M/G/1 term is read at most this busy; beyond it the fluid backlog carries the wait
FIXED_POINT = 30  # iterations of the collision fixed point (it converges in a few when a split can exist)
HIGH_Z = 3.0  # a stretch this many standard deviations above a model's median may be part of a burst …
BURST_Z = 4.0  # … a run of them this far above the stretches around it is one …
BURST_BINS = 4  # … one that falls back within this many stretches …
BURSTS = 1  # … seen this many times in the history: the traffic is bursty
RARE = 0.25  # bursts collide rarely: at most this share of the stretches with a burst have two or more


# How a candidate split is scored (ms, lower is better) on a rate history: `predicted_delay` unless the caller
# passes another (the simulation's replay of the traffic, packrat_daemon.simulate.colocated_replay). A pure
# function of the split, the demands (each model's live batch sizes) and the history, as far as choose is told.
Scorer = Callable[["JointPlan", Sequence[ModelDemand], "RateHistory"], float]


@dataclass(frozen=True)
class Sharing:
    """How busy threads slow each other on one machine: the emulated workers' rule. A batch keeping `own`
    threads busy while `total` are (its own included) runs f(total)/f(own) · max(1, total/cores) times slower
    than alone: the interference of a busier machine, f linear from 1 alone to `full_load` with every core
    busy, and time-sharing past the cores."""

    cores: int
    full_load: float = 1.0

    def __post_init__(self) -> None:
        if self.cores < 1 or not self.full_load >= 1.0:
            raise ProfileError(
                f"a machine needs a core or more and a full-load slow-down >= 1 (1: none); got {self.cores}, "
                f"{self.full_load}"
            )

    def factor(self, busy: float) -> float:
        if self.cores <= 1:
            return 1.0
        return 1.0 + (self.full_load - 1.0) * (min(max(busy, 1.0), self.cores) - 1.0) / (self.cores - 1)

    def slowdown(self, own: float, total: float) -> float:
        return self.factor(total) / self.factor(own) * max(1.0, total / self.cores)


@dataclass(frozen=True)
class RateHistory:
    """Each model's batch rate (batches per second) over consecutive stretches of `bin_s` seconds."""

    bin_s: float
    rates: tuple[tuple[float, ...], ...]  # per stretch, one rate per model in the demands' order

    def __post_init__(self) -> None:
        if not (self.bin_s > 0 and self.rates):
            raise ProfileError("a rate history needs a positive stretch length and at least one stretch")

    @classmethod
    def steady(cls, demands: Sequence[ModelDemand]) -> RateHistory:
        return cls(HOLD_S, (tuple(d.rate_per_s for d in demands),))


@dataclass(frozen=True)
class Choice:
    mode: str  # the candidate served: one of MODES
    plan: JointPlan  # its split and plans
    scores: tuple[tuple[str, float], ...]  # each candidate's predicted delay (ms) on the first history
    current_ms: float  # the split served, predicted the same way
    move: bool  # whether the chosen split is worth a move from the one served (on every history)
    bursty: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "split": list(self.plan.split),
            "why": self.describe(),
            "bursty": self.bursty,
            "predicted_ms": {mode: (score if math.isfinite(score) else None) for mode, score in self.scores},
        }

    def describe(self) -> str:
        """What the coordinator serves and why, for its status."""
        scored = ", ".join(f"{mode} {_ms(score)}" for mode, score in self.scores)
        what = {
            "every": "every model on all cores (collisions are rare enough)",
            "even": "an even split",
            "proportional": "a split in proportion to load",
            "joint": "the joint plan's split",
        }[self.mode]
        traffic = "bursty traffic, judged over its last bursts" if self.bursty else "the traffic now"
        return f"{what}, the best predicted for {traffic} (mean delay: {scored})"


def even_counts(models: int, cores: int) -> list[int]:
    """The cores as evenly as they divide, the first models taking the remainder."""
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


def collisions(
    shares: Sequence[ModelShare], busy: Sequence[float], machine: Sharing, second: bool = False
) -> list[float]:
    """Each model's slow-down while it serves (`Sharing.slowdown`), each other model busy with probability
    `busy[j]` (independently) with its `busy_threads`: on shared cores they time-share, on disjoint shares
    they only interfere. A batch's work progresses at 1/slow-down, so its time is its work over the mean of
    that rate: the slow-down is the harmonic mean over the others' states, not the arithmetic one (which
    overrates the collisions: at a 2x slow-down half the time, a batch takes 1.33x its time alone, not 1.5x).
    With `second`, the factor of the service time's second moment instead: a batch's time squared over its
    time alone squared, each batch in one state (the others' batches as long as its own), E[s] x the mean."""
    slow = []
    for m, share in enumerate(shares):
        others = [j for j in range(len(shares)) if j != m]
        own = max(1.0, share.busy_threads)
        rate = mean = 0.0
        for states in product((False, True), repeat=len(others)):
            chance, threads = 1.0, own
            for j, on in zip(others, states, strict=True):
                chance *= busy[j] if on else 1.0 - busy[j]
                threads += shares[j].busy_threads if on else 0.0
            factor = machine.slowdown(own, threads)
            rate += chance / factor
            mean += chance * factor
        slow.append(mean / rate if second else 1.0 / rate)
    return slow


def slowdowns(
    shares: Sequence[ModelShare], rates: Sequence[float], machine: Sharing, saturated: Sequence[bool]
) -> tuple[list[float], list[float]]:
    """The fixed point of `collisions`: each model busy λ·S·slow-down of the time (all of it while `saturated`);
    each model's mean slow-down and its service time's second-moment factor there."""
    slow = [1.0] * len(shares)
    busy = [0.0] * len(shares)
    for _ in range(FIXED_POINT):
        busy = [
            1.0 if full else min(1.0, rate / 1000.0 * share.service_ms * s)
            for share, rate, s, full in zip(shares, rates, slow, saturated, strict=True)
        ]
        slow = collisions(shares, busy, machine)
    return slow, collisions(shares, busy, machine, second=True)


def shared_plan(demands: Sequence[ModelDemand], cores: int, full_load: float = 1.0) -> JointPlan:
    """Every model planned for all `cores` (the shares overlapping). Each share's service time is its plan's
    alone; its predicted sojourn and busy fraction are slowed by the collisions at the demands' rates."""
    alone = [evaluate([demand], [cores]).shares[0] for demand in demands]
    rates = [d.rate_per_s for d in demands]
    slow, square = slowdowns(alone, rates, Sharing(cores, full_load), [False] * len(alone))
    shares = []
    for share, demand, s, s2 in zip(alone, demands, slow, square, strict=True):
        mean, second = share.service_ms * s, share.second_ms2 * s2
        wait = sojourn_ms(mean, second, demand.rate_per_s)
        busy = demand.rate_per_s / 1000.0 * mean
        shares.append(replace(share, predicted_ms=wait, busy_fraction=busy))
    total = sum(rates)
    weights = [r / total if total else 1.0 / len(rates) for r in rates]
    predicted = sum(w * s.predicted_ms for w, s in zip(weights, shares, strict=True) if w > 0)
    return JointPlan(tuple(shares), cores, predicted, shared=True)


def predicted_delay(plan: JointPlan, history: RateHistory, full_load: float = 1.0) -> float:
    """The traffic-weighted mean delay (ms) of `plan` over `history` (the module's fluid M/G/1 reading)."""
    base = plan.shares  # each plan's service time alone: the collisions (or interference) are read per stretch
    machine = Sharing(plan.cores, full_load)
    backlog = [0.0] * len(base)  # seconds of work queued beyond what the model carries
    total = weight = 0.0
    for rates in history.rates:
        slow, square = slowdowns(base, rates, machine, [b > 0 for b in backlog])
        for m, (share, rate) in enumerate(zip(base, rates, strict=True)):
            if rate <= 0:
                backlog[m] = max(0.0, backlog[m] - history.bin_s)
                continue
            mean_s = share.service_ms * slow[m] / 1000.0
            end = max(0.0, backlog[m] + (rate * mean_s - 1.0) * history.bin_s)
            capped = min(rate, RHO_CAP / mean_s)
            queueing = sojourn_ms(mean_s * 1000.0, share.second_ms2 * square[m], capped) / 1000.0
            total += rate * history.bin_s * (queueing + (backlog[m] + end) / 2.0)
            weight += rate * history.bin_s
            backlog[m] = end
    return 1000.0 * total / weight if weight > 0 else 0.0


def candidates(
    demands: Sequence[ModelDemand], cores: int, min_cores: int = 1, full_load: float = 1.0
) -> dict[str, JointPlan]:
    """The four candidate splits (MODES) for `demands`."""
    loads = [evaluate([d], [cores]).shares[0].busy_fraction for d in demands]
    return {
        "every": shared_plan(demands, cores, full_load),
        "even": evaluate(demands, even_counts(len(demands), cores), total_cores=cores),
        "proportional": evaluate(demands, proportional_split(loads, cores, min_cores), total_cores=cores),
        "joint": plan_jointly(demands, cores, min_cores),
    }


def choose(
    demands: Sequence[ModelDemand],
    cores: int,
    histories: Sequence[RateHistory],
    current: JointPlan,
    min_gain: float,
    min_cores: int = 1,
    collisions: float | None = None,
    full_load: float = 1.0,
    score: Scorer | None = None,
    mode_gain: float = MODE_GAIN,
    judge_bursts: bool = False,
) -> Choice:
    """The candidate with the least predicted delay on `histories[0]`, and whether to move to it from
    `current`: only when it beats the split served by `min_gain` on every history.

    `collisions`: for bursty traffic, the share of its bursts that meet another model's (`collide`); None for
    traffic that is not bursty. Bursts that rarely meet (at most RARE) are served by every model on all the
    cores, each burst on the whole machine, and no split is chased; bursts that meet are judged as steady
    traffic at the rates over the bursts' whole pattern. `score`: how a split is scored on a history
    (default `predicted_delay`); `mode_gain`: the least gain of a move between every model on all the cores
    and a split; `judge_bursts`: bursts that rarely meet are judged by the score too (one that replays them)
    rather than served on all the cores by rule."""
    if not histories:
        raise ProfileError("choose needs at least one rate history to judge the splits on")

    def delay(plan: JointPlan, history: RateHistory) -> float:
        return predicted_delay(plan, history, full_load) if score is None else score(plan, demands, history)

    found = candidates(demands, cores, min_cores, full_load)
    scores = {mode: delay(plan, histories[0]) for mode, plan in found.items()}
    best = min(MODES, key=lambda mode: (scores[mode], MODES.index(mode)))
    rare = collisions is not None and collisions <= RARE and not judge_bursts
    if rare:
        best = "every"
    plan = found[best]
    same = plan.shared == current.shared and (plan.shared or plan.split == current.split)
    served = [delay(current, h) for h in histories]
    gains = [1.0 - delay(plan, h) / d if d > 0 else 0.0 for h, d in zip(histories, served, strict=True)]
    # Between every model on all the cores and a split, each model's whole plan changes and the prediction of
    # the collisions is the coarsest part: such a move asks MODE_GAIN at least.
    needed = max(min_gain, mode_gain) if plan.shared != current.shared else min_gain
    move = not same and (rare and best == "every" or min(gains) >= needed)
    bursty = collisions is not None
    current_ms = served[0]
    if not move:  # the split served stays: say which candidate it is
        best, plan = mode_of(current, found), current
    return Choice(best, plan, tuple((m, scores[m]) for m in MODES), current_ms, move, bursty)


def mode_of(plan: JointPlan, found: dict[str, JointPlan]) -> str:
    """Which candidate a split served is (the joint plan's when it is none of the simple ones)."""
    if plan.shared:
        return "every"
    for mode in ("joint", "even", "proportional"):
        if found[mode].split == plan.split:
            return mode
    return "joint"


def high(counts: Sequence[int], z: float = HIGH_Z) -> list[bool]:
    """Which stretches of one model's requests lie `z` standard deviations (Poisson) above its median."""
    if not counts:
        return []
    median = statistics.median(counts)
    return [n > median + z * math.sqrt(max(median, 1.0)) for n in counts]


def collide(counts: Sequence[Sequence[int]]) -> float:
    """Of the stretches in which some model bursts (`high`), the share in which two or more do at once."""
    flags = [high(model) for model in counts]
    together = [sum(column) for column in zip(*flags, strict=True)]
    bursting = [n for n in together if n >= 1]
    return sum(1 for n in bursting if n >= 2) / len(bursting) if bursting else 0.0


def bursty(counts: Sequence[int]) -> bool:
    """Whether one model's requests per stretch show BURSTS bursts: runs of at most BURST_BINS stretches above
    its median (`high`) that stand BURST_Z standard deviations (Poisson) above the two stretches before and
    the two after them. A rise that stays is a shift, not a burst; and a stretch is judged against its own
    neighbours, not the median, so that the level before a shift does not read as a burst after it."""
    flags = high(counts)
    seen, start = 0, None
    for k, flag in enumerate([*flags, False]):
        if flag and start is None:
            start = k
        elif not flag and start is not None:
            if start > 0 and k < len(counts) and k - start <= BURST_BINS:
                around = [*counts[max(0, start - 2) : start], *counts[k : k + 2]]
                level = sum(around) / len(around)
                peak = sum(counts[start:k]) / (k - start)
                seen += peak > level + BURST_Z * math.sqrt(max(level, 1.0))
            start = None
    return seen >= BURSTS


def _ms(value: float) -> str:
    return "saturated" if math.isinf(value) else f"{value:.3g} ms"
