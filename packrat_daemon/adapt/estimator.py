"""The live batch-size distribution: which batch sizes the batcher actually forms, recent ones weighing most."""

from __future__ import annotations

import math

from policies.planning.distribution import BatchDistribution


class BatchSizeEstimator:
    """Exponentially decayed counts of the batch sizes dispatched (half-life in seconds)."""

    def __init__(self, half_life_s: float = 60.0, top: int = 8) -> None:
        self.half_life_s = half_life_s
        self.top = top
        self._weights: dict[int, float] = {}
        self._last = 0.0
        self._first: float | None = None  # the first batch seen (the rate's window is shorter until a while after)
        self.observed = 0  # batches seen since the last reset (the tuner waits for enough of them)

    def observe(self, batch: int, now: float) -> None:
        self._decay(now)
        if self._first is None:
            self._first = now
        self._weights[batch] = self._weights.get(batch, 0.0) + 1.0
        self.observed += 1

    def distribution(self, now: float) -> BatchDistribution | None:
        """The most frequent batch sizes with their weights, or None before any batch was seen."""
        self._decay(now)
        ranked = sorted(self._weights.items(), key=lambda item: -item[1])[: self.top]
        if not ranked:
            return None
        return BatchDistribution.from_counts(dict(ranked))

    def rates(self, now: float) -> tuple[float, float]:
        """(batches, inputs) per second over the same decayed window as the distribution: a decayed count
        divided by the window's length, which is half_life / ln 2 once the first batch is long past."""
        self._decay(now)
        if self._first is None or now <= self._first:
            return 0.0, 0.0
        window = self.half_life_s / math.log(2) * (1.0 - math.pow(0.5, (now - self._first) / self.half_life_s))
        batches = sum(self._weights.values())
        inputs = sum(b * w for b, w in self._weights.items())
        return batches / window, inputs / window

    def reset_count(self) -> None:
        self.observed = 0

    def _decay(self, now: float) -> None:
        if now <= self._last:
            return
        factor = math.pow(0.5, (now - self._last) / self.half_life_s) if self._last else 1.0
        self._last = now
        if factor < 1.0:
            # Sizes that faded below a hundredth of a batch are forgotten, so the map stays small.
            self._weights = {b: w * factor for b, w in self._weights.items() if w * factor >= 0.01}
