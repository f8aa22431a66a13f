"""Which split to serve, judged on the traffic a coordinator sees: the joint plan's, or a simple one.

The joint planner (policies.colocation) minimises a mean sojourn over disjoint shares at one rate per model.
That is the right split only when the rates hold and the models are busy together. When collisions are
rare, every model on all the cores serves each one on the whole machine while the others idle; when the
traffic comes in bursts shorter than a move, no split that follows it can be reached in time. So the
coordinator chooses among four candidates, each a pure function of the demands:

- `every`: every model planned for all the cores, the shares overlapping (`shared_plan`). Its service
  times are each model's own plan's, slowed while the others' batches run beside it: a batch of T_m busy
  threads with the others' T_j busy at once runs max(1, (T_m + Σ T_j) / cores) times slower (the cores
  time-shared), each other model busy with its own busy fraction, found by a fixed point (`collisions`);
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
from collections.abc import Sequence
from dataclasses import dataclass, replace
from itertools import product
from typing import Any

from packrat_daemon.wire.errors import ConfigError, ProfileError
from policies.colocation import JointPlan, ModelDemand, ModelShare, evaluate, plan_jointly
from policies.colocation_options import sojourn_ms

MODES = ("every", "even", "proportional", "joint")
HOLD_S = 10.0  # steady rates are judged over this long: the queue a split that cannot carry them grows meanwhile
RHO_CAP = 0.95  # the M/G/1 term is read at most this busy; beyond it the fluid backlog carries the wait
FIXED_POINT = 30  # iterations of the collision fixed point (it converges in a few when a split can exist)
BURST_Z = 4.0  # a stretch this many standard deviations above a model's median is part of a burst …
BURST_BINS = 4  # … one that falls back within this many stretches …
BURSTS = 1  # … seen this many times in the history: the traffic is bursty
RARE = 0.25  # bursts collide rarely: at most this share of the stretches with a burst have two or more


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


def collisions(shares: Sequence[ModelShare], busy: Sequence[float], cores: int) -> list[float]:
    """Each model's slow-down on shared cores: the expected max(1, busy threads / cores) while it serves, each
    other model busy with probability `busy[j]` (independently) with its `busy_threads`."""
    slow = []
    for m, share in enumerate(shares):
        others = [j for j in range(len(shares)) if j != m]
        expected = 0.0
        for states in product((False, True), repeat=len(others)):
            chance, threads = 1.0, max(1.0, share.busy_threads)
            for j, on in zip(others, states, strict=True):
                chance *= busy[j] if on else 1.0 - busy[j]
                threads += shares[j].busy_threads if on else 0.0
            expected += chance * max(1.0, threads / cores)
        slow.append(expected)
    return slow


def shared_slowdowns(
    shares: Sequence[ModelShare], rates: Sequence[float], cores: int, saturated: Sequence[bool]
) -> list[float]:
    """The fixed point of `collisions`: each model busy λ·S·slow-down of the time (all of it while `saturated`)."""
    slow = [1.0] * len(shares)
    for _ in range(FIXED_POINT):
        busy = [
            1.0 if full else min(1.0, rate / 1000.0 * share.service_ms * s)
            for share, rate, s, full in zip(shares, rates, slow, saturated, strict=True)
        ]
        slow = collisions(shares, busy, cores)
    return slow


def shared_plan(demands: Sequence[ModelDemand], cores: int) -> JointPlan:
    """Every model planned for all `cores` (the shares overlapping). Each share's service time is its plan's
    alone; its predicted sojourn and busy fraction are slowed by the collisions at the demands' rates."""
    alone = [evaluate([demand], [cores]).shares[0] for demand in demands]
    rates = [d.rate_per_s for d in demands]
    slow = shared_slowdowns(alone, rates, cores, [False] * len(alone))
    shares = []
    for share, demand, s in zip(alone, demands, slow, strict=True):
        mean, second = share.service_ms * s, share.second_ms2 * s * s
        wait = sojourn_ms(mean, second, demand.rate_per_s)
        busy = demand.rate_per_s / 1000.0 * mean
        shares.append(replace(share, predicted_ms=wait, busy_fraction=busy))
    total = sum(rates)
    weights = [r / total if total else 1.0 / len(rates) for r in rates]
    predicted = sum(w * s.predicted_ms for w, s in zip(weights, shares, strict=True) if w > 0)
    return JointPlan(tuple(shares), cores, predicted, shared=True)


def predicted_delay(plan: JointPlan, history: RateHistory) -> float:
    """The traffic-weighted mean delay (ms) of `plan` over `history` (the module's fluid M/G/1 reading)."""
    base = plan.shares  # a shared plan's service times are each plan's alone: the collisions are read per stretch
    backlog = [0.0] * len(base)  # seconds of work queued beyond what the model carries
    total = weight = 0.0
    for rates in history.rates:
        slow = shared_slowdowns(base, rates, plan.cores, [b > 0 for b in backlog]) if plan.shared else [1.0] * len(base)
        for m, (share, rate) in enumerate(zip(base, rates, strict=True)):
            if rate <= 0:
                backlog[m] = max(0.0, backlog[m] - history.bin_s)
                continue
            mean_s = share.service_ms * slow[m] / 1000.0
            end = max(0.0, backlog[m] + (rate * mean_s - 1.0) * history.bin_s)
            capped = min(rate, RHO_CAP / mean_s)
            queueing = sojourn_ms(mean_s * 1000.0, share.second_ms2 * slow[m] ** 2, capped) / 1000.0
            total += rate * history.bin_s * (queueing + (backlog[m] + end) / 2.0)
            weight += rate * history.bin_s
            backlog[m] = end
    return 1000.0 * total / weight if weight > 0 else 0.0


def candidates(demands: Sequence[ModelDemand], cores: int, min_cores: int = 1) -> dict[str, JointPlan]:
    """The four candidate splits (MODES) for `demands`."""
    loads = [evaluate([d], [cores]).shares[0].busy_fraction for d in demands]
    return {
        "every": shared_plan(demands, cores),
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
) -> Choice:
    """The candidate with the least predicted delay on `histories[0]`, and whether to move to it from
    `current`: only when it beats the split served by `min_gain` on every history.

    `collisions`: for bursty traffic, the share of its bursts that meet another model's (`collide`); None for
    traffic that is not bursty. Bursts that rarely meet (at most RARE) are served by every model on all the
    cores, each burst on the whole machine, and no split is chased; bursts that meet are judged as steady
    traffic at the rates over the bursts' whole pattern."""
    if not histories:
        raise ProfileError("choose needs at least one rate history to judge the splits on")
    found = candidates(demands, cores, min_cores)
    scores = {mode: predicted_delay(plan, histories[0]) for mode, plan in found.items()}
    best = min(MODES, key=lambda mode: (scores[mode], MODES.index(mode)))
    if collisions is not None and collisions <= RARE:
        best = "every"
    plan = found[best]
    same = plan.shared == current.shared and (plan.shared or plan.split == current.split)
    move = not same and (
        best == "every"
        and collisions is not None
        and collisions <= RARE
        or all(predicted_delay(plan, h) <= predicted_delay(current, h) * (1.0 - min_gain) for h in histories)
    )
    bursty = collisions is not None
    current_ms = predicted_delay(current, histories[0])
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


def high(counts: Sequence[int]) -> list[bool]:
    """Which stretches of one model's requests lie BURST_Z standard deviations (Poisson) above its median."""
    if not counts:
        return []
    median = statistics.median(counts)
    return [n > median + BURST_Z * math.sqrt(max(median, 1.0)) for n in counts]


def collide(counts: Sequence[Sequence[int]]) -> float:
    """Of the stretches in which some model bursts (`high`), the share in which two or more do at once."""
    flags = [high(model) for model in counts]
    together = [sum(column) for column in zip(*flags, strict=True)]
    bursting = [n for n in together if n >= 1]
    return sum(1 for n in bursting if n >= 2) / len(bursting) if bursting else 0.0


def bursty(counts: Sequence[int]) -> bool:
    """Whether one model's requests per stretch show BURSTS bursts: runs of at most BURST_BINS stretches
    BURST_Z standard deviations above its median (`high`), with a stretch that is not before and after each
    (a rise that stays is a shift, not a burst)."""
    flags = high(counts)
    seen, run, opened = 0, 0, False
    for flag in flags:
        if flag:
            run += 1
            continue
        if opened and 0 < run <= BURST_BINS:
            seen += 1
        opened, run = True, 0
    return seen >= BURSTS


def _ms(value: float) -> str:
    return "saturated" if math.isinf(value) else f"{value:.3g} ms"
