"""The (threads, batch) cells an adaptive profile may measure, and how a partly measured table is filled."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from packrat_daemon.wire.errors import ProfileError
from policies.base import Plan
from policies.planning.distribution import BatchDistribution
from policies.planning.layouts import best_one_instance, split_on
from policies.planning.profile import Profile

CellKey = tuple[int, int]

FULL_ANCHORS_FROM = 16  # measurements in the budget from which all four corners are anchors


class Grid:
    """The cells that may be measured; rows may be ragged (a replayed table can be sparse)."""

    def __init__(self, cells: Sequence[CellKey], cores: int, targets: Sequence[int]) -> None:
        self.cells = sorted({(int(t), int(b)) for t, b in cells})
        if not self.cells:
            raise ProfileError("the profiling grid is empty; give --threads and --batches")
        self.threads = sorted({t for t, _ in self.cells})
        self.batches = sorted({b for _, b in self.cells})
        self.rows: dict[int, list[int]] = {t: [] for t in self.threads}
        for t, b in self.cells:
            self.rows[t].append(b)
        if not any(t <= cores for t in self.threads):
            raise ProfileError(f"every thread count in the grid exceeds the {cores} usable cores")
        self.search = self._search_region(cores, max(targets))
        # The slowest instance of a plan for B carries at least B / cores inputs: anchors below that
        # would pin the surrogate where no plan's latency is decided.
        self.smallest_decisive_batch = max(1, math.ceil(min(targets) / cores))

    def _search_region(self, cores: int, largest_target: int) -> list[CellKey]:
        """Cells a plan for the targets could use: rows that fit the cores, and per row the batches up
        to the first one that holds the largest target (an instance never takes more inputs)."""
        region = []
        for t in self.threads:
            if t > cores:
                continue
            for b in self.rows[t]:
                region.append((t, b))
                if b >= largest_target:
                    break
        return region

    def lookup_cell(self, threads: int, batch: int) -> CellKey:
        """The cell the solver's rule L̂ reads for `batch` inputs on `threads` threads."""
        for b in self.rows[threads]:
            if b >= batch:
                return threads, b
        return threads, self.rows[threads][-1]

    def anchors(self, budget: int) -> list[CellKey]:
        """Corners and centre of the search region: they pin the surrogate's thread and batch shape.

        A small budget keeps only two opposite corners and the centre: on a small grid each anchor
        is a large share of the cells, and the decisive cells are better use of it.
        """
        rows: dict[int, list[int]] = {}
        for t, b in self.search:
            rows.setdefault(t, []).append(b)
        for t, batches in rows.items():
            decisive = [b for b in batches if b >= self.smallest_decisive_batch]
            rows[t] = decisive or batches[-1:]
        threads = sorted(rows)
        middle = _geometric_middle(threads)
        low, high = threads[0], threads[-1]
        chosen = [(low, rows[low][0]), (high, rows[high][-1]), (middle, _geometric_middle(rows[middle]))]
        if budget >= FULL_ANCHORS_FROM:
            chosen += [(low, rows[low][-1]), (high, rows[high][0])]
        return list(dict.fromkeys(chosen))


def _geometric_middle(values: Sequence[int]) -> int:
    target = math.sqrt(values[0] * values[-1])
    return min(values, key=lambda v: (abs(math.log(v / target)), v))


def fill_rows(grid: Grid, measured: Mapping[CellKey, float], estimate: Mapping[CellKey, float]) -> dict[CellKey, float]:
    """Every grid cell: measured ones as measured, others from `estimate`, kept non-decreasing in batch.

    An estimated cell is clipped between the largest value left of it and the smallest measured value
    right of it, so no filled cell contradicts a measurement. Noisy measured rows stay as measured
    (the solver is exact on non-monotone rows).
    """
    table: dict[CellKey, float] = {}
    for t, batches in grid.rows.items():
        ceiling = [math.inf] * (len(batches) + 1)
        for j in range(len(batches) - 1, -1, -1):
            value = measured.get((t, batches[j]), math.inf)
            ceiling[j] = min(ceiling[j + 1], value)
        running = 0.0
        for j, b in enumerate(batches):
            found = measured.get((t, b))
            value = max(running, min(estimate[(t, b)], ceiling[j + 1])) if found is None else found
            table[(t, b)] = value
            running = max(running, value)
    return table


def plan_cells(
    plan: Plan, profile: Profile, distribution: BatchDistribution, cores: int, grid: Grid | None = None
) -> list[CellKey]:
    """The cells serving `plan` reads for the distribution's batch sizes: each layout's split of each batch,
    and the best one instance it is weighed against. With `grid`, as the grid cells L̂ reads."""

    def cell(threads: int, rows: int) -> CellKey:
        if grid is not None and threads in grid.rows:
            return grid.lookup_cell(threads, rows)
        return threads, next((b for b in profile.batches(threads) if b >= rows), rows)

    cells: list[CellKey] = []
    for batch in distribution.batches:
        if plan.split != "exact" or plan.oversubscribed:
            cells += [cell(i.threads, max(i.batch, 1)) for i in plan.instances]
            continue
        for layout in plan.layout_threads:
            split = split_on(profile, layout, batch)
            if split is not None:
                cells += [cell(t, rows) for t, rows in zip(layout, split.rows, strict=True) if rows]
        alone = best_one_instance(profile, cores, BatchDistribution.single(batch))
        if alone is not None:
            cells.append(cell(alone[0], batch))
    return list(dict.fromkeys(cells))
