"""The daemon's start-up profile: the full grid when it is small, else the adaptive search under a budget.

A daemon started without a profile used to measure every (threads, batch) cell before its first request:
at 16 cores and a largest batch of 64 that is 112 cells side by side, minutes to an hour for a real
model. Above `ADAPTIVE_ABOVE_CELLS` cells it now measures with the adaptive search (`adaptive_profile`)
instead, within `--profile-budget`, and the search's filled table is used only to choose what to measure:

- **Measured and estimated cells are kept apart.** `StartProfile.measured` holds the cells measured on
  real workers; `StartProfile.estimated` the surrogate's values for the others. The daemon plans and
  serves on the measured cells only: a row's L̂(t, b) then reads the smallest *measured* batch of at
  least b, an upper bound of the filled table's value (filled cells never exceed a measured cell to
  their right), so a plan on the measured cells never rests on an estimate.
- **An estimated cell is measured before a plan rests on it.** The plan on the filled table may use
  cells the budget left unmeasured (the search stopped on the budget, not on its certificate). Those
  cells are measured now, beyond the budget, and the plan is made again, until every cell it reads is
  measured. Its cells measured, the filled table's plan is also the best plan on the measured cells
  alone (every other plan only gets slower there), so nothing the search found is lost.

Everything here is pure: cells come from the `measure(threads, batch) -> Cell` callable (real workers
in the daemon, a table in tests).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from packrat_daemon.search.budget import Budget, StepReport
from packrat_daemon.search.grid import CellKey, Grid, fill_rows, plan_cells
from packrat_daemon.search.loop import MODEL_NOISE, adaptive_profile
from policies.base import Plan
from policies.planning.distribution import BatchDistribution
from policies.planning.profile import Cell, Profile

# Grids up to this many cells are measured whole: the search needs a few anchors before it chooses
# anything, so on a small grid (this 2-core machine's 10 cells, a 4-core machine's 20) it saves little
# and its estimates would cost accuracy for nothing.
ADAPTIVE_ABOVE_CELLS = 24

MeasureCell = Callable[[int, int], Cell]
PlanFor = Callable[[Profile], Plan]


@dataclass
class StartProfile:
    """What start-up measured (`measured`), and the surrogate's estimate of every other grid cell."""

    mode: str  # "grid" (every cell measured) or "adaptive"
    grid_size: int
    measured: dict[CellKey, Cell] = field(default_factory=dict)
    estimated: dict[CellKey, float] = field(default_factory=dict)
    stopped: str = "grid"  # the search's own stop: "confirmed", "budget" or "grid"
    confirmed_beyond_budget: list[CellKey] = field(default_factory=list)  # measured because a plan rested on them

    def profile(self, **meta: str) -> Profile:
        """The measured cells only: what the daemon plans and serves on."""
        return Profile(self.measured, **meta)

    def describe(self) -> str:
        if self.mode == "grid":
            return f"the full grid: {len(self.measured)} cells measured"
        extra = (
            f", {len(self.confirmed_beyond_budget)} more because the plan rested on them"
            if self.confirmed_beyond_budget
            else ""
        )
        return (
            f"adaptive: {len(self.measured)} of {self.grid_size} cells measured (search stopped: {self.stopped}"
            f"{extra}); {len(self.estimated)} estimated, kept for provenance, never served on"
        )


def uses_search(grid_size: int, budget: Budget) -> bool:
    """Whether start-up measures adaptively: a grid above the threshold and a budget short of the grid."""
    return grid_size > ADAPTIVE_ABOVE_CELLS and not budget.covers_grid


def start_profile(
    measure: MeasureCell,
    grid_cells: Sequence[CellKey],
    distribution: BatchDistribution,
    cores: int,
    budget: Budget,
    plan_for: PlanFor,
    on_step: Callable[[StepReport], None] | None = None,
    on_confirm: Callable[[CellKey], None] | None = None,
) -> StartProfile:
    """Measure the start-up profile: every cell of a small grid, else the adaptive search, then the plan's cells.

    `plan_for(profile)` is the policy's plan on a table (for the daemon's own distribution); `on_confirm`
    hears of each estimated cell measured because that plan rested on it.
    """
    cells = sorted({(int(t), int(b)) for t, b in grid_cells})
    found = StartProfile("grid" if not uses_search(len(cells), budget) else "adaptive", len(cells))

    def take(threads: int, batch: int) -> float:
        cell = measure(threads, batch)
        key = (threads, batch)
        found.measured[key] = found.measured[key].merged(cell) if key in found.measured else cell
        return cell.latency_ms

    if found.mode == "grid":
        for threads, batch in cells:
            latency = take(threads, batch)
            if on_step is not None:
                on_step(StepReport(len(found.measured), len(cells), (threads, batch), latency, {}))
        return found
    result = adaptive_profile(
        take, cells, distribution.batches, cores, budget=budget, noise=MODEL_NOISE, on_step=on_step
    )
    found.stopped = result.stopped
    grid = Grid(cells, cores, distribution.batches)
    estimate = {key: cell.latency_ms for key, cell in result.profile.items()}
    while True:
        latencies = {key: cell.latency_ms for key, cell in found.measured.items()}
        filled = Profile.from_latencies(fill_rows(grid, latencies, estimate))
        rests_on = plan_cells(plan_for(filled), filled, distribution, cores, grid)
        missing = [key for key in rests_on if key not in latencies]
        if not missing:
            break
        for key in missing:
            if on_confirm is not None:
                on_confirm(key)
            take(*key)
            found.confirmed_beyond_budget.append(key)
    found.estimated = {key: cell.latency_ms for key, cell in filled.items() if key not in found.measured}
    return found
