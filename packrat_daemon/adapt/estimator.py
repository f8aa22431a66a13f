"""The live batch-size distribution: which batch sizes the batcher actually forms, recent ones weighing most.

The counts decay with a half-life of a minute, so the distribution is steady under steady traffic (a
Poisson stream does not make the plan flap). But when the traffic itself changes, the old counts fade
only as fast as that half-life: ten seconds after a change of the batch sizes, the new ones would still
weigh about a tenth, and the tuner would plan for the traffic that is gone. So the estimator also
watches the last RECENT batches: when most of them are of sizes that held under NOVEL_SHARE of the
counts, the traffic has moved, and the counts restart from those new batches alone. A size that is
merely rare cannot trigger it (a size with a tenth of the traffic fills 12 of 16 batches in a row about
once in a billion), so under steady traffic nothing restarts.

Time only ever decays the counts (by 2^-(elapsed / half-life), a factor in [0, 1] that at worst underflows
to 0), and a clock that goes back decays nothing until it has caught up again: no gap, however long, can
overflow them.
"""

from __future__ import annotations

import logging
import math
from collections import deque

from policies.planning.distribution import BatchDistribution

log = logging.getLogger("packrat.daemon")

RECENT = 16  # the last batches a change of the traffic is judged on
NOVEL_SHARE = 0.1  # a batch of a size below this share of the decayed counts is new traffic
SHIFT_SHARE = 0.75  # the share of the recent batches that must be new for the counts to restart


class BatchSizeEstimator:
    """Exponentially decayed counts of the batch sizes dispatched (half-life in seconds), restarted when
    the traffic moves (see the module)."""

    def __init__(self, half_life_s: float = 60.0, top: int = 8) -> None:
        self.half_life_s = half_life_s
        self.top = top
        self._weights: dict[int, float] = {}
        self._last: float | None = None  # the time the counts were last decayed to (None: never)
        self._first: float | None = None  # the first batch seen (the rate's window is shorter until a while after)
        self._total = 0.0  # the sum of _weights (restarted with them)
        self._batches = 0.0  # decayed counts of batches and inputs, for the rates (never restarted)
        self._inputs = 0.0
        self._recent: deque[tuple[int, bool]] = deque(maxlen=RECENT)  # (size, new when it came)
        self._novel = 0  # how many of _recent were new
        self.restarts = 0
        self.observed = 0  # batches seen since the last reset (the tuner waits for enough of them)
        self.since: float | None = None  # when the traffic began, or last moved (a restart): how long it has lasted

    def observe(self, batch: int, now: float) -> None:
        self._decay(now)
        if self._first is None:
            self._first = self.since = now
        novel = self._weights.get(batch, 0.0) < NOVEL_SHARE * self._total
        if len(self._recent) == RECENT:
            self._novel -= self._recent[0][1]
        self._recent.append((batch, novel))
        self._novel += novel
        if self._novel >= SHIFT_SHARE * RECENT:
            # Judged as each batch comes: at a high rate, the new sizes stop being new within a second.
            self._restart()
            self.since = now
        self._weights[batch] = self._weights.get(batch, 0.0) + 1.0
        self._total += 1.0
        self._batches += 1.0
        self._inputs += batch
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
        return self._batches / window, self._inputs / window

    def lasted_s(self, now: float) -> float:
        """How long the traffic has lasted since it began or last moved (0 before any batch)."""
        return 0.0 if self.since is None else max(0.0, now - self.since)

    def reset_count(self) -> None:
        self.observed = 0

    def _restart(self) -> None:
        before = ", ".join(f"{b}" for b, _ in sorted(self._weights.items(), key=lambda item: -item[1])[:4])
        novel = self._novel
        self._weights = {}
        for batch, new in self._recent:
            if new:  # the old traffic's last batches are left out
                self._weights[batch] = self._weights.get(batch, 0.0) + 1.0
        self._total = float(novel)
        self._recent = deque(((batch, False) for batch, _ in self._recent), maxlen=RECENT)
        self._novel = 0
        self.restarts += 1
        log.info("the traffic moved: %d of the last %d batches were of sizes seldom seen before (the counts were "
                 "mostly of %s); the batch sizes restart from those", novel, len(self._recent), before)  # fmt: skip

    def _decay(self, now: float) -> None:
        if self._last is not None and not now > self._last:  # the same instant, a clock gone back (or NaN)
            return
        factor = 1.0 if self._last is None else math.pow(0.5, (now - self._last) / self.half_life_s)
        self._last = now
        if factor < 1.0:
            # Sizes that faded below a hundredth of a batch are forgotten, so the map stays small.
            self._weights = {b: w * factor for b, w in self._weights.items() if w * factor >= 0.01}
            self._total *= factor
            self._batches *= factor
            self._inputs *= factor
