"""Which layout runs a batch: the one rule the dispatcher, the split check and the packrat policy share.

A plan may keep several layouts of the same cores warm (say one 2-thread instance beside two 1-thread
instances). Each batch runs on the layout whose exact split of it predicts the lowest latency, except
that a batch stays on one instance unless splitting it is predicted at least `min_split_gain` faster:
profiles measured on a shared machine are good to a few percent, and a split has costs the profile does
not see (a gather per batch, more processes), so on a near tie one instance is the safer bet.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import NamedTuple

from packrat_daemon.wire.errors import InfeasibleError
from policies.planning.distribution import BatchDistribution
from policies.planning.profile import Profile
from policies.split import split_batch

Layout = tuple[int, ...]  # the thread counts of one layout's instances


class Split(NamedTuple):
    """One batch divided over one layout: its predicted latency and the inputs each instance takes."""

    latency_ms: float
    rows: list[int]  # per instance, in layout order; 0: the instance stays idle

    @property
    def busy(self) -> int:
        return sum(1 for rows in self.rows if rows)


def split_pays(split_ms: float, alone_ms: float, min_split_gain: float) -> bool:
    """Whether several instances predicted at `split_ms` are worth it against one at `alone_ms`."""
    return split_ms <= alone_ms * (1.0 - min_split_gain)


def fastest(splits: Sequence[Split], min_split_gain: float = 0.0) -> int:
    """Index of the split to run a batch with, from each layout's split of it.

    The lowest predicted latency (fewer busy instances on a tie), except that the batch stays on one
    instance unless the split pays for itself (`split_pays`).
    """
    scored = [(split.latency_ms, split.busy) for split in splits]
    best = min(range(len(scored)), key=scored.__getitem__)
    if scored[best][1] > 1:
        alone = [k for k, (_, busy) in enumerate(scored) if busy == 1]
        if alone:
            one = min(alone, key=lambda k: scored[k][0])
            if not split_pays(scored[best][0], scored[one][0], min_split_gain):
                return one
    return best


def split_on(profile: Profile, layout: Sequence[int], batch: int) -> Split | None:
    """The exact split of `batch` over `layout`, or None when the layout's profiled rows cannot carry it."""
    try:
        return Split(*split_batch(profile, layout, batch))
    except InfeasibleError:
        return None


class LayoutTable:
    """Each layout's split of each batch size of a distribution, computed once so that sets of layouts
    can be weighed against each other cheaply (the packrat policy weighs many).

    Its predictions give each batch its fastest split with no per-batch margin: the packrat policy
    applies `min_split_gain` to a plan as a whole, against the best one-instance pool.
    """

    def __init__(self, profile: Profile, layouts: Iterable[Sequence[int]], distribution: BatchDistribution) -> None:
        self.distribution = distribution
        self.splits: dict[Layout, dict[int, Split | None]] = {}
        for layout in map(tuple, layouts):
            if layout not in self.splits:
                self.splits[layout] = {batch: split_on(profile, layout, batch) for batch in distribution.batches}

    def carries(self, layout: Layout) -> bool:
        """Whether `layout` alone can serve every batch size of the distribution."""
        return None not in self.splits[layout].values()

    def batch_latencies(self, layouts: Iterable[Layout] | None = None) -> dict[int, float | None]:
        """Per batch size, its predicted latency on the fastest of `layouts` (default: all) that carries it
        (None: none does)."""
        chosen = list(self.splits) if layouts is None else list(layouts)
        latencies: dict[int, float | None] = {}
        for batch in self.distribution.batches:
            splits = [split for layout in chosen if (split := self.splits[layout][batch]) is not None]
            latencies[batch] = splits[fastest(splits)].latency_ms if splits else None
        return latencies

    def expected(self, layouts: Iterable[Layout] | None = None) -> float:
        """Expected latency when each batch runs on the fastest of `layouts` (default: all) that carries it;
        inf when some batch size has none."""
        latencies = self.batch_latencies(layouts)
        return sum(
            weight * (math.inf if (latency := latencies[batch]) is None else latency)
            for batch, weight in self.distribution.weights
        )


def best_one_instance(profile: Profile, cores: int, distribution: BatchDistribution) -> tuple[int, float] | None:
    """(threads, expected latency) of the best pool of one instance, or None if none carries every batch."""
    candidates = [(threads,) for threads in profile.threads() if threads <= cores]
    table = LayoutTable(profile, candidates, distribution)
    best: tuple[int, float] | None = None
    for layout in candidates:
        expected = table.expected([layout])
        if expected != math.inf and (best is None or expected < best[1]):
            best = (layout[0], expected)
    return best
