"""Profiles kept up to date from production timings.

Every slice a worker computes reports (threads, inputs, compute time), measured while the other
instances run beside it, so it carries the interference an offline profile can miss. Per cell the
learner keeps a robust running estimate: each sample is clipped to within a factor of two of the
current estimate (one stalled call cannot drag it) and folded into an exponentially weighted mean of
log-latency. Its weight decays with age, so a cell nobody uses any more hands the say back to the
offline measurement.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from policies.planning.profile import Cell, Profile

CLIP_FACTOR = 2.0


@dataclass
class _Estimate:
    log_ms: float
    weight: float  # decayed number of samples behind the estimate
    seen: float  # time of the last sample


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
        if estimate is None:
            self._cells[key] = _Estimate(value, 1.0, now)
            return
        limit = math.log(CLIP_FACTOR)
        value = min(max(value, estimate.log_ms - limit), estimate.log_ms + limit)
        estimate.log_ms += self.smoothing * (value - estimate.log_ms)
        estimate.weight = self._decayed(estimate, now) + 1.0
        estimate.seen = now

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

    def _decayed(self, estimate: _Estimate, now: float) -> float:
        return estimate.weight * math.pow(0.5, max(0.0, now - estimate.seen) / self.half_life_s)


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
