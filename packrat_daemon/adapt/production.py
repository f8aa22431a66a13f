"""Profiles kept up to date from production timings.

Every slice a worker computes reports (threads, inputs, compute time), measured while the other
instances run beside it, so it carries the interference an offline profile can miss. Per cell the
learner keeps a robust running estimate: each sample is clipped to within a factor of two of the
current estimate (one stalled call cannot drag it) and folded into an exponentially weighted mean of
log-latency. Its weight decays with age, so a cell nobody uses any more hands the say back to the
offline measurement.

Time is an input like any other: a restart, a clock stepped back or forward, a batch size unseen for a
week. So each estimate keeps its weight as of a time (`weighed`), and only ever multiplies it by a
decay factor 2^-(elapsed / half-life) with elapsed clamped to [0, MAX_AGE_S]: a factor in [0, 1], which at
worst underflows to 0 and can never overflow. Restoring a saved estimate takes its weight as of the save,
never un-decaying it to its last sample's time (2^(age / half-life) overflows after 1 024 half-lives, a
week at 10 minutes). An estimate whose weight decayed below FORGOTTEN_WEIGHT holds no evidence any more:
it is dropped, so a size that comes back starts afresh and the state file keeps only what counts.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from packrat_daemon.measure.split_check import dispatched_splits
from policies.base import InstancePlan, Plan, Policy
from policies.planning.distribution import BatchDistribution
from policies.planning.layouts import best_one_instance
from policies.planning.profile import Cell, Profile
from policies.planning.topology import Topology

CLIP_FACTOR = 2.0
# Beyond these an age or a weight is not something production measured but a clock that jumped or a file
# that was edited: clamped to them. A year is past any decay that still matters (50 000 half-lives); a
# billion samples is past any cell's steady weight (rate × half-life / ln 2: 100 000 slices/s for 10 min
# is under 10^8), and keeps a sum of every cell's weight far from a float's range.
MAX_AGE_S = 366 * 86400.0
MAX_WEIGHT = 1e9
FORGOTTEN_WEIGHT = 1e-6  # 20 half-lives: nothing left of the evidence


@dataclass
class _Estimate:
    log_ms: float
    weight: float  # decayed number of samples behind the estimate, as of `weighed`
    weighed: float  # the time `weight` holds for
    seen: float  # time of the last sample (for its age only: the weight never decays from it)


class ProductionProfile:
    def __init__(self, half_life_s: float = 600.0, smoothing: float = 0.1, min_weight: float = 3.0) -> None:
        self.half_life_s = half_life_s
        self.smoothing = smoothing  # weight of a new sample in the running mean
        self.min_weight = min_weight  # a cell needs this much recent evidence before it counts
        self._cells: dict[tuple[int, int], _Estimate] = {}
        self.samples = 0

    def observe(self, threads: int, batch: int, compute_ms: float, now: float) -> None:
        if compute_ms <= 0 or not math.isfinite(compute_ms):
            return
        self.samples += 1
        key = (threads, batch)
        estimate = self._cells.get(key)
        value = math.log(compute_ms)
        weight = 0.0 if estimate is None else self._decayed(estimate, now)
        if estimate is None or weight < FORGOTTEN_WEIGHT:  # no evidence left to clip the sample against
            self._cells[key] = _Estimate(value, 1.0, now, now)
            return
        limit = math.log(CLIP_FACTOR)
        value = min(max(value, estimate.log_ms - limit), estimate.log_ms + limit)
        estimate.log_ms += self.smoothing * (value - estimate.log_ms)
        estimate.weight, estimate.weighed = min(weight + 1.0, MAX_WEIGHT), max(now, estimate.weighed)
        estimate.seen = max(now, estimate.seen)

    def learned(self, now: float) -> dict[tuple[int, int], Cell]:
        """Cells with enough recent evidence, as profile cells (samples = their decayed weight)."""
        cells = {}
        for key, estimate in self._cells.items():
            weight = self._decayed(estimate, now)
            # A burst of samples decays a hair while it arrives: allow for that, not for a missing one.
            if weight >= self.min_weight - 0.05:
                cells[key] = Cell(math.exp(estimate.log_ms), max(1, round(weight)))
        return cells

    def merged_into(self, base: Profile | None, now: float) -> Profile | None:
        """`base`, rescaled to production's conditions, with the learned cells folded in (by sample
        weight); None when nothing is known."""
        learned = self.learned(now)
        if not learned:
            return base
        if base is None:
            return Profile(learned)
        factor = conditions_factor(base, learned)
        return _scaled(base, factor).merged(Profile(learned, model=base.model, runtime=base.runtime))

    def conditions_factor(self, base: Profile | None, now: float) -> float:
        learned = self.learned(now)
        return conditions_factor(base, learned) if base is not None and learned else 1.0

    def export(self, now: float) -> list[LearnedCell]:
        """Every running estimate with its decayed sample weight and its age, for the state file; the forgotten
        ones (FORGOTTEN_WEIGHT) are dropped, here and from the learner."""
        cells = []
        for key, e in sorted(self._cells.items()):
            weight = self._decayed(e, now)
            if weight < FORGOTTEN_WEIGHT:
                del self._cells[key]
                continue
            cells.append(LearnedCell(key, math.exp(e.log_ms), weight, _age(now - e.seen)))
        return cells

    def restore(self, cells: Sequence[LearnedCell], now: float, elapsed: float = 0.0) -> None:
        """Take back `export`'s estimates (a restart): each as it was exported, then aged by `elapsed` seconds
        (the time since the export), so its weight decays for the downtime as it would have while serving.

        Whatever the numbers (a file edited by hand, a clock stepped back: ages negative, years, not numbers),
        nothing here can raise: a cell without a usable latency or weight is skipped, ages and weights are
        clamped (MAX_AGE_S, MAX_WEIGHT), and the weight is kept as of the export, so no growth factor is ever
        computed."""
        elapsed = _age(elapsed)
        for cell in cells:
            weight = min(cell.weight, MAX_WEIGHT)  # NaN fails the test below: every comparison with NaN is false
            if 0 < cell.latency_ms < math.inf and FORGOTTEN_WEIGHT <= weight <= MAX_WEIGHT:
                weighed = now - elapsed
                self._cells[cell.key] = _Estimate(
                    math.log(cell.latency_ms), weight, weighed, weighed - _age(cell.age_s)
                )
                self.samples += round(weight)

    def _decayed(self, estimate: _Estimate, now: float) -> float:
        """The weight at `now`: never more than as of `weighed` (a clock stepped back decays nothing)."""
        return estimate.weight * math.pow(0.5, _age(now - estimate.weighed) / self.half_life_s)


def _age(seconds: float) -> float:
    """`seconds` as an age: within [0, MAX_AGE_S], and 0 for NaN (a clock that went back, or a file's nonsense)."""
    return min(seconds, MAX_AGE_S) if seconds > 0 else 0.0


@dataclass(frozen=True)
class LearnedCell:
    """One production estimate as the state file keeps it."""

    key: tuple[int, int]
    latency_ms: float
    weight: float  # decayed number of samples behind it
    age_s: float  # since its last sample


@dataclass(frozen=True)
class SlowSplit:
    """A batch size the served plan splits, measured in production slower than one instance."""

    batch: int
    split: tuple[tuple[int, int], ...]  # (threads, rows) per busy instance
    split_ms: float  # production's timing of the split's slowest instance
    alone_threads: int
    alone_ms: float  # the best single instance on the same (production-scaled) profile

    def describe(self) -> str:
        parts = " + ".join(f"{t}t×{rows}" for t, rows in self.split)
        return (
            f"batch {self.batch}: split {parts} measured {self.split_ms:.1f} ms in production, "
            f"one {self.alone_threads}-thread instance {self.alone_ms:.1f} ms"
        )


def slow_splits(
    plan: Plan,
    splitting: Profile | None,
    merged: Profile,
    learned: Mapping[tuple[int, int], Cell],
    distribution: BatchDistribution,
    cores: int,
    min_split_gain: float,
) -> list[SlowSplit]:
    """The batch sizes that the served plan, split as the dispatcher splits them (on `splitting`), runs on
    several instances that production measured slower than the best single instance on `merged`.

    Only splits whose every busy instance production has timed count: an offline estimate is what the
    start-up split check guards, and a guess is no reason to revert. The single instance is judged on
    `merged`: production's own timing where it has one (say from before the switch to the split), else
    the offline cell scaled to production's conditions, so a machine that is merely busier than at start
    does not make a split look slower than one instance that would be just as slow.
    """
    if splitting is None or plan.split != "exact" or plan.oversubscribed:
        return []
    found = []
    for batch, busy in dispatched_splits(splitting, plan, distribution, min_split_gain):
        if len(busy) < 2 or any(key not in learned for key in busy):
            continue
        alone = best_one_instance(merged, cores, BatchDistribution.single(batch))
        split_ms = max(learned[key].latency_ms for key in busy)
        if alone is not None and split_ms > alone[1]:
            found.append(SlowSplit(batch, busy, split_ms, alone[0], alone[1]))
    return found


def conditions_factor(base: Profile, learned: dict[tuple[int, int], Cell]) -> float:
    """How much slower (> 1) or faster production runs than the offline profile, on the cells both know.

    Production timings carry interference and drift that a start-up profile, measured on a quiet
    machine, does not. Compared raw, the layout production is timing looks slower than one known only
    offline, and the tuner switches away from it for no real gain. Measured here (bench/runtimes.py,
    ResNet-50 on OpenVINO): beside other runtimes' processes, a daemon serving one 2-thread worker
    predicted a split 10% faster over its batch mix, switched, and served batches of 4 6% slower; alone,
    on the same traffic, it predicted no gain. So the offline cells are scaled by the median ratio of
    the cells both know (clipped to a factor of two) before the two are merged, assuming the
    conditions weigh on every cell alike.
    """
    ratios = sorted(
        cell.latency_ms / base.latency(*key) for key, cell in learned.items() if key in base and base.latency(*key) > 0
    )
    if not ratios:
        return 1.0
    middle = len(ratios) // 2
    median = ratios[middle] if len(ratios) % 2 else math.sqrt(ratios[middle - 1] * ratios[middle])
    return min(max(median, 1.0 / CLIP_FACTOR), CLIP_FACTOR)


def _scaled(profile: Profile, factor: float) -> Profile:
    if factor == 1.0:
        return profile
    cells = {
        key: Cell(cell.latency_ms * factor, cell.samples, None if cell.p90_ms is None else cell.p90_ms * factor)
        for key, cell in profile.items()
    }
    return Profile(cells, model=profile.model, runtime=profile.runtime, precision=profile.precision)


def revert_plan(
    policy: Policy,
    merged: Profile,
    learned: Mapping[tuple[int, int], Cell],
    distribution: BatchDistribution,
    topology: Topology,
    min_split_gain: float,
    slow: Sequence[SlowSplit],
) -> Plan:
    """The plan to serve instead of one whose splits production measured slower than one instance: the
    policy's plan on production's timings, or, when that would split a batch size just as slowly, the best
    single instance."""
    reason = "production timings reverted the plan: " + "; ".join(s.describe() for s in slow)
    plan = policy.plan(merged, topology, distribution)
    if not slow_splits(plan, merged, merged, learned, distribution, topology.usable_cores, min_split_gain):
        return dataclasses.replace(plan, reason=f"{reason}; {plan.reason}")
    alone = best_one_instance(merged, topology.usable_cores, distribution)
    threads = alone[0] if alone is not None else topology.usable_cores
    instance = InstancePlan(threads, distribution.max_batch)
    return Plan((instance,), policy.name, f"{reason}; one instance", None if alone is None else alone[1])
