"""The search loop: measure only the (threads, batch) cells that decide the plans.

Profiling every cell of a threads × batch grid takes hours for a large model, yet the solver's answer
for a batch size B depends on few cells: those whose latency sits near the plan's latency bound λ_B.

1. Measure a few anchor cells (`Grid.anchors`).
2. Fit the surrogate (`gp.Surrogate`) and fill every unmeasured cell from it (`fill_rows`).
3. Solve exactly on the filled table: the plan for each target and its predicted latency λ_B.
4. Find the leads, the cells whose measurement could confirm or change a plan:
   - the plan's own cells, until measured: its latency is only a guess before;
   - the explorer: solve again with every unmeasured cell lowered by OPTIMISM_Z σ. If that beats λ_B
     by more than `tolerance`, its unmeasured cells could change the answer;
   - the sceptic (only when measurements are noisy): lower measured cells by their own noise too.
     A rival plan that then wins is a contest between measured cells; both sides are re-measured.
   The strategy picks which lead to measure.
5. Stop when there is no lead (every plan is confirmed by measurement and neither explorer nor sceptic
   can improve any plan by more than the tolerances), or when the budget (every measurement counts) is spent.

Everything here is pure: measurements come from the `measure(threads, batch) -> ms` callable, so a
full table can stand in for a model (replay) in research and tests.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from packrat_daemon.search.base import Assessment, Kind, Lead, Strategy
from packrat_daemon.search.budget import AdaptiveResult, Budget, StepReport
from packrat_daemon.search.grid import CellKey, Grid, fill_rows
from packrat_daemon.wire.errors import ProfileError
from policies.planning.profile import Profile
from policies.solver import Solution, Solver

Measure = Callable[[int, int], float]

MAX_SAMPLES = 4  # re-measurements of one contested cell; more rarely settles a contest within budget
OPTIMISM_Z = 2.0  # "plausibly as fast as": a prediction lowered by this many σ
TOLERANCE = 0.01  # improvements smaller than this fraction of λ are not worth a measurement
CONTEST_TOLERANCE = 0.01  # the same for a re-measurement of a contest between measured plans
# One real cell is the median of a few timed runs on a shared machine: assume this much jitter, so
# a near-tie between measured plans is measured again rather than decided by one lucky run.
MODEL_NOISE = 0.02


@dataclass
class _State:
    profile: Profile
    solutions: dict[int, Solution]
    assessment: Assessment


class _Samples:
    """Every measurement so far; a cell's latency is the median of its samples."""

    def __init__(self) -> None:
        self.samples: dict[CellKey, list[float]] = {}

    def add(self, cell: CellKey, latency: float) -> None:
        self.samples.setdefault(cell, []).append(latency)

    def __len__(self) -> int:
        return sum(len(v) for v in self.samples.values())

    def medians(self) -> dict[CellKey, float]:
        return {c: float(np.median(v)) for c, v in self.samples.items()}

    def counts(self) -> dict[CellKey, int]:
        return {c: len(v) for c, v in self.samples.items()}


def adaptive_profile(
    measure: Measure,
    grid_cells: Sequence[CellKey],
    targets: Sequence[int],
    cores: int,
    *,
    budget: Budget,
    strategy: Strategy | None = None,
    seed: int = 0,
    noise: float = 0.0,
    tolerance: float = TOLERANCE,
    on_step: Callable[[StepReport], None] | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> AdaptiveResult:
    """Measure the cells that decide the plans for `targets` on `cores` cores, within `budget`.

    `noise` is the relative jitter (σ, log space) of one measurement: with noise, a close contest
    between measured plans has its cells measured again. The budget counts every measurement.
    `strategy` defaults to `DEFAULT_STRATEGY`; `seed` drives its randomness (a fitted kernel's restarts):
    the same seed and measurements give the same cells and plans.
    """
    from packrat_daemon.search import DEFAULT_STRATEGY

    strategy = strategy or DEFAULT_STRATEGY
    targets = sorted({int(b) for b in targets})
    if not targets or targets[0] < 1:
        raise ProfileError(f"target batch sizes must be positive, got {list(targets)}")
    grid = Grid(grid_cells, cores, targets)
    max_cells = budget.max_cells(len(grid.cells))
    started = clock()
    samples = _Samples()

    def take(cell: CellKey) -> float:
        latency = float(measure(*cell))
        if not math.isfinite(latency) or latency <= 0:
            raise ProfileError(f"measuring cell {cell} gave {latency} ms; a latency must be positive")
        samples.add(cell, latency)
        return latency

    def budget_left() -> bool:
        if len(samples) >= max_cells:
            return False
        return budget.seconds is None or clock() - started < budget.seconds

    def report(cell: CellKey, latency: float, solutions: Mapping[int, Solution]) -> None:
        if on_step is not None:
            on_step(StepReport(len(samples), max_cells, cell, latency, solutions))

    def assess() -> _State:
        return _assess(grid, samples, strategy, seed, targets, cores, noise, tolerance)

    def result(state: _State, stopped: str) -> AdaptiveResult:
        return AdaptiveResult(
            samples.medians(), samples.counts(), state.profile, state.solutions, stopped, len(grid.cells)
        )

    if budget.covers_grid:
        # The whole grid is affordable: measuring it is exact, and a surrogate could only add error.
        for cell in grid.cells:
            report(cell, take(cell), {})
        return result(assess(), "grid")

    for cell in grid.anchors(max_cells):
        if not budget_left():
            break
        report(cell, take(cell), {})
    state = assess()
    while state.assessment.leads and budget_left():
        cell = strategy.pick(state.assessment)
        latency = take(cell)
        state = assess()
        report(cell, latency, state.solutions)
    return result(state, "budget" if state.assessment.leads else "confirmed")


def _assess(
    grid: Grid,
    samples: _Samples,
    strategy: Strategy,
    seed: int,
    targets: Sequence[int],
    cores: int,
    noise: float,
    tolerance: float,
) -> _State:
    """Fit, fill, solve; then find the leads: the cells whose measurement could confirm or change a plan."""
    measured = samples.medians()
    counts = samples.counts()
    mean, sigma = strategy.surrogate(measured, seed).predict(grid.cells)
    estimate = {c: float(m) for c, m in zip(grid.cells, mean, strict=True)}
    # σ of every cell: the surrogate's doubt, or a measured median's own noise.
    doubt = {c: float(s) for c, s in zip(grid.cells, sigma, strict=True)}
    doubt.update({c: noise / math.sqrt(n) for c, n in counts.items()})
    table = fill_rows(grid, measured, estimate)
    solver = Solver(Profile.from_latencies(table), cores)
    solutions = {b: solver.solve(b) for b in targets}
    # The explorer's table: every unmeasured cell as fast as it plausibly is.
    hopeful = {c: v * math.exp(-OPTIMISM_Z * doubt[c]) for c, v in estimate.items()}
    explorer = Solver(Profile.from_latencies(fill_rows(grid, measured, hopeful)), cores)
    # The sceptic's table: measured cells too, within their noise (a lucky measurement misleads).
    sceptic = None
    if noise > 0:
        lucky = {c: v * math.exp(-OPTIMISM_Z * doubt[c]) for c, v in measured.items()}
        sceptic = Solver(Profile.from_latencies(fill_rows(grid, lucky, hopeful)), cores)
    leads: list[Lead] = []
    for batch, solution in solutions.items():
        plan_cells = _lookup_cells(grid, solution)
        leads += [Lead(c, Kind.UNCONFIRMED, solution.latency_ms, False) for c in plan_cells if c not in measured]
        bound = solution.latency_ms * (1.0 - tolerance)
        hope = explorer.solve(batch)
        if hope.latency_ms < bound:
            # Unmeasured cells that, if as fast as they plausibly are, beat the plan.
            leads += [Lead(c, Kind.FASTER, bound, False) for c in _lookup_cells(grid, hope) if c not in measured]
            continue
        if sceptic is None:
            continue
        bound = solution.latency_ms * (1.0 - CONTEST_TOLERANCE)
        rival = sceptic.solve(batch)
        if rival.latency_ms >= bound:
            continue  # no plausible value of any cell beats this plan by more than the tolerances
        # A contest decided by measured cells: measure both sides again.
        leads += [
            Lead(c, Kind.FASTER, bound, True) for c in _lookup_cells(grid, rival) if counts.get(c, 0) < MAX_SAMPLES
        ]
        slowest = max(plan_cells, key=lambda c: table[c])
        # An unmeasured slowest cell is an unconfirmed lead already; only a measured one is re-measured.
        if 0 < counts.get(slowest, 0) < MAX_SAMPLES:
            leads.append(Lead(slowest, Kind.SLOWER, rival.latency_ms, True))
    return _State(Profile.from_latencies(table), solutions, Assessment(table, doubt, leads))


def _lookup_cells(grid: Grid, solution: Solution) -> list[CellKey]:
    return list(dict.fromkeys(grid.lookup_cell(t, b) for t, b in solution.instances))
