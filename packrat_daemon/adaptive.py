"""Adaptive profiling: measure only the (threads, batch) cells that decide the plan.

Profiling every cell of a threads × batch grid takes hours for a large model, yet the solver's answer
for a batch size B depends on few cells: those whose latency sits near the plan's latency bound λ_B.
This module finds them with a Bayesian ask/tell loop and fills every other cell from a surrogate:

1. Measure a few anchor cells: corners and centre of the region the targets can use (rows that fit
   the cores; batches from B_min / cores, below which no plan's slowest instance lies, up to B_max).
2. Fit the surrogate: an Amdahl-style model with a per-batch fixed cost,
   L ≈ c0 + c1/t + (c2 + c3/t)·b + c4·t + c5·b²/t (non-negative least squares on relative error;
   the last term is cache pressure), times a Gaussian-process correction of its log residuals, which
   also gives each unmeasured cell an uncertainty σ. Filled rows are non-decreasing in batch and
   never contradict a measured cell.
3. Solve exactly on the filled table: the plan for each target and its predicted latency λ_B.
4. Pick the cells worth measuring:
   - the plan's own cells, until measured: its latency is only a guess before;
   - the explorer: solve again with every unmeasured cell lowered by OPTIMISM_Z σ. If that beats λ_B
     by more than `tolerance`, its unmeasured cells could change the answer; each is weighed by
     the probability that it really is fast enough;
   - the sceptic (only when measurements are noisy): lower measured cells by their own noise too.
     A rival plan that then wins is a contest between measured cells; both sides are re-measured.
   A `skopt.Optimizer` over (thread index, batch index) chooses among them: its regressor is the
   value of measuring each cell (`DecisionModel`), its acquisition LCB, so among equally decisive
   cells it prefers the one the surrogate knows least.
5. Stop when every plan is confirmed by measurement and neither explorer nor sceptic can improve any
   plan by more than the tolerances — or when the budget (every measurement counts) is spent.

Everything here is pure: measurements come from the `measure(threads, batch) -> ms` callable, so a
full table can stand in for a model (replay) in research and tests.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import nnls
from sklearn.base import BaseEstimator, RegressorMixin

from packrat_daemon.wire.errors import ProfileError
from policies.planning.profile import Profile
from policies.solver import Solution, Solver

CellKey = tuple[int, int]
Measure = Callable[[int, int], float]

FULL_ANCHORS_FROM = 16  # measurements in the budget from which all four corners are anchors
ROUGHNESS = 0.01  # how far a true cell may sit off any smooth trend (log space)
MAX_SAMPLES = 4  # re-measurements of one contested cell; more rarely settles a contest within budget
MODEL_FLOOR = 0.05  # least doubt about the surrogate far from every measurement (log space)
UNPROVEN_DOUBT = 0.15  # doubt while there are too few cells to judge the fit's own error
LENGTH_SCALE = np.array([1.0, 1.0])  # octaves of threads, batch over which residuals stay correlated
OPTIMISM_Z = 2.0  # "plausibly as fast as": a prediction lowered by this many σ
TOLERANCE = 0.01  # improvements smaller than this fraction of λ are not worth a measurement
CONTEST_TOLERANCE = 0.01  # the same for a re-measurement of a contest between measured plans
REMEASURE_WEIGHT = 0.5  # a re-measurement is worth less than a first look at an equally decisive cell
EXPLORATION_KAPPA = 1.0  # LCB weight on a candidate cell's σ: prefer the cells we know least


# -- budget --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Budget:
    """How much measuring the adaptive profile may do: a fraction of the grid's cells, or seconds."""

    fraction: float | None = None
    seconds: float | None = None

    @classmethod
    def parse(cls, text: str) -> Budget:
        """'0.25' → a quarter of the grid; '300s' → five minutes of measuring."""
        raw = text.strip().lower()
        try:
            if raw.endswith("s"):
                seconds = float(raw[:-1])
                if seconds > 0 and math.isfinite(seconds):
                    return cls(seconds=seconds)
            else:
                fraction = float(raw)
                if 0 < fraction <= 1:
                    return cls(fraction=fraction)
        except ValueError:
            pass
        raise ProfileError(
            f"--budget must be a fraction of the grid in (0, 1] like 0.25, or seconds like 300s; got {text!r}"
        )

    def max_cells(self, grid_size: int) -> int:
        if self.fraction is None:
            return grid_size
        return max(1, min(grid_size, math.floor(self.fraction * grid_size + 1e-9)))

    @property
    def covers_grid(self) -> bool:
        return self.fraction is not None and self.fraction >= 1


# -- result --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class StepReport:
    """What the loop knows after one more measurement (for progress lines)."""

    measured: int
    max_cells: int
    cell: CellKey
    latency_ms: float
    solutions: Mapping[int, Solution]


@dataclass(frozen=True)
class AdaptiveResult:
    measured: dict[CellKey, float]  # median of each measured cell, in the order first measured
    samples: dict[CellKey, int]  # how often each cell was measured (close contests are re-measured)
    profile: Profile  # every grid cell: measured ones as measured, the rest from the surrogate
    solutions: dict[int, Solution]  # target batch → the exact plan on `profile`
    stopped: str  # "confirmed" (certificate reached), "budget", or "grid" (every cell measured)
    grid_size: int

    @property
    def measurements(self) -> int:
        return sum(self.samples.values())

    @property
    def fraction(self) -> float:
        return len(self.measured) / self.grid_size

    def measured_cells(self) -> list[list[int]]:
        """[[threads, batch], ...] as plain ints (skopt hands out numpy integers; JSON rejects them)."""
        return [[int(t), int(b)] for t, b in self.measured]


# -- the grid ------------------------------------------------------------------------------------
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


# -- the surrogate -------------------------------------------------------------------------------
def _features(cells: Sequence[CellKey]) -> np.ndarray:
    """Amdahl-style terms: fixed cost, its parallel part, serial and parallel work per input, a
    per-thread overhead (synchronisation grows with the team), and cache pressure (inputs per thread
    beyond what the caches hold make each input dearer)."""
    t = np.array([c[0] for c in cells], dtype=float)
    b = np.array([c[1] for c in cells], dtype=float)
    return np.column_stack([np.ones_like(t), 1.0 / t, b, b / t, t, b * b / t])


def _coords(cells: Sequence[CellKey]) -> np.ndarray:
    return np.log2(np.array(cells, dtype=float)) / LENGTH_SCALE


def _matern52(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    d = np.sqrt(((a[:, None, :] - b[None, :, :]) ** 2).sum(-1)) * math.sqrt(5.0)
    return (1.0 + d + d * d / 3.0) * np.exp(-d)


class Surrogate:
    """Latency over (threads, batch) fitted to measured cells: physics times a smooth correction.

    `predict` gives the median latency and its uncertainty σ (log space) for any cells.
    """

    def __init__(self, measured: Mapping[CellKey, float], roughness: float = ROUGHNESS) -> None:
        cells = list(measured)
        latencies = np.array([measured[c] for c in cells], dtype=float)
        self.roughness = roughness
        self.theta = _fit_physics(_features(cells), latencies)
        residual = np.log(latencies / self._physics(cells))
        active = int(np.count_nonzero(self.theta))
        spare = len(cells) - active
        # The residuals of a least-squares fit understate its error by about n/(n-p); with too few
        # spare cells that estimate means nothing, so stay doubtful until they exist.
        if spare >= 2:
            amplitude = max(MODEL_FLOOR, float(np.sqrt(np.mean(residual**2) * len(cells) / spare)))
        else:
            amplitude = UNPROVEN_DOUBT
        self.amplitude = amplitude
        self._x = _coords(cells)
        kernel = amplitude**2 * _matern52(self._x, self._x) + roughness**2 * np.eye(len(cells))
        self._chol = np.linalg.cholesky(kernel)
        self._alpha = np.linalg.solve(self._chol.T, np.linalg.solve(self._chol, residual))

    def _physics(self, cells: Sequence[CellKey]) -> np.ndarray:
        return _features(cells) @ self.theta

    def predict(self, cells: Sequence[CellKey]) -> tuple[np.ndarray, np.ndarray]:
        cross = self.amplitude**2 * _matern52(_coords(cells), self._x)
        mean = cross @ self._alpha
        v = np.linalg.solve(self._chol, cross.T)
        variance = np.maximum(self.amplitude**2 - (v * v).sum(0), 0.0)
        # A true cell differs from the smooth trend by its own roughness too.
        sigma = np.sqrt(variance + self.roughness**2)
        return self._physics(cells) * np.exp(mean), sigma


def _fit_physics(features: np.ndarray, latencies: np.ndarray) -> np.ndarray:
    """Non-negative coefficients minimising relative error (latencies span orders of magnitude)."""
    scale = features.max(axis=0)
    weighted = features / scale / latencies[:, None]
    theta, _ = nnls(weighted, np.ones(len(latencies)))
    theta = theta / scale
    if not np.any(theta > 0):  # degenerate data: a flat model is the honest fallback
        theta = np.zeros(features.shape[1])
        theta[0] = float(np.exp(np.mean(np.log(latencies))))
    return theta


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
            value = measured.get((t, b))
            if value is None:
                value = max(running, min(estimate[(t, b)], ceiling[j + 1]))
            table[(t, b)] = value
            running = max(running, value)
    return table


# -- skopt's view of the decision ----------------------------------------------------------------
class DecisionModel(RegressorMixin, BaseEstimator):
    """skopt's regressor: minus the value of measuring each (thread index, batch index) now.

    The value comes from the surrogate and the plans (see `_candidates`); a measured cell is worth
    nothing more (skopt is told 0 for it). Its spread is the cell's σ, so LCB favours, among equally
    decisive cells, the ones the surrogate knows least.
    """

    def __init__(self, value: np.ndarray | None = None, spread: np.ndarray | None = None) -> None:
        self.value = value
        self.spread = spread

    def fit(self, X: np.ndarray, y: np.ndarray) -> DecisionModel:  # noqa: N803 - sklearn's signature
        # The decision value is recomputed from every measurement before each tell; nothing to learn here.
        return self

    def predict(self, X: np.ndarray, return_std: bool = False):  # noqa: ANN201, N803
        index = np.rint(np.asarray(X, dtype=float)).astype(int)
        rows = np.clip(index[:, 0], 0, self.value.shape[0] - 1)
        cols = np.clip(index[:, 1], 0, self.value.shape[1] - 1)
        mean = -self.value[rows, cols]
        if return_std:
            return mean, self.spread[rows, cols]
        return mean


# -- the loop ------------------------------------------------------------------------------------
@dataclass
class _State:
    profile: Profile
    solutions: dict[int, Solution]
    candidates: dict[CellKey, tuple[float, float]]  # cell → (value of measuring it, its σ)


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
    seed: int = 0,
    noise: float = 0.0,
    tolerance: float = TOLERANCE,
    on_step: Callable[[StepReport], None] | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> AdaptiveResult:
    """Measure the cells that decide the plans for `targets` on `cores` cores, within `budget`.

    `noise` is the relative jitter (σ, log space) of one measurement: with noise, a close contest
    between measured plans has its cells measured again. The budget counts every measurement.
    """
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

    def result(state: _State, stopped: str) -> AdaptiveResult:
        return AdaptiveResult(
            samples.medians(), samples.counts(), state.profile, state.solutions, stopped, len(grid.cells)
        )

    if budget.covers_grid:
        # The whole grid is affordable: measuring it is exact, and a surrogate could only add error.
        for cell in grid.cells:
            report(cell, take(cell), {})
        return result(_assess(grid, samples, targets, cores, noise, tolerance), "grid")

    for cell in grid.anchors(max_cells):
        if not budget_left():
            break
        report(cell, take(cell), {})
    state = _assess(grid, samples, targets, cores, noise, tolerance)
    optimizer = _optimizer(grid, seed)
    index = {t: k for k, t in enumerate(grid.threads)}, {b: k for k, b in enumerate(grid.batches)}
    _tell(optimizer, grid, state, [_to_index(c, index) for c in samples.samples])
    while state.candidates and budget_left():
        cell = _ask(optimizer, grid, state)
        latency = take(cell)
        state = _assess(grid, samples, targets, cores, noise, tolerance)
        report(cell, latency, state.solutions)
        _tell(optimizer, grid, state, [_to_index(cell, index)])
    return result(state, "budget" if state.candidates else "confirmed")


def _assess(
    grid: Grid, samples: _Samples, targets: Sequence[int], cores: int, noise: float, tolerance: float
) -> _State:
    """Fit, fill, solve; then find the cells whose measurement could confirm or change a plan."""
    measured = samples.medians()
    counts = samples.counts()
    mean, sigma = Surrogate(measured).predict(grid.cells)
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
    candidates: dict[CellKey, tuple[float, float]] = {}

    def add(cell: CellKey, value: float) -> None:
        old = candidates.get(cell, (0.0, 0.0))[0]
        candidates[cell] = (old + value, doubt[cell])

    def chance_below(cell: CellKey, bound: float) -> float:
        return max(_normal_cdf((math.log(bound) - math.log(table[cell])) / doubt[cell]), 1e-3)

    for batch, solution in solutions.items():
        plan_cells = _lookup_cells(grid, solution)
        for cell in plan_cells:
            if cell not in measured:
                add(cell, 1.0)  # the plan's latency is only a guess until its own cells are measured
        bound = solution.latency_ms * (1.0 - tolerance)
        hope = explorer.solve(batch)
        if hope.latency_ms < bound:
            # Unmeasured cells that, if as fast as they plausibly are, beat the plan.
            for cell in _lookup_cells(grid, hope):
                if cell not in measured:
                    add(cell, chance_below(cell, bound))
            continue
        if sceptic is None:
            continue
        bound = solution.latency_ms * (1.0 - CONTEST_TOLERANCE)
        rival = sceptic.solve(batch)
        if rival.latency_ms >= bound:
            continue  # no plausible value of any cell beats this plan by more than the tolerances
        # A contest decided by measured cells: measure both sides again (a re-measurement is worth
        # less than a first look, which the explorer above always gets first).
        for cell in _lookup_cells(grid, rival):
            if counts.get(cell, 0) < MAX_SAMPLES:
                add(cell, chance_below(cell, bound) * REMEASURE_WEIGHT)
        slowest = max(plan_cells, key=lambda c: table[c])
        if counts[slowest] < MAX_SAMPLES:
            above = 1.0 - _normal_cdf((math.log(rival.latency_ms) - math.log(table[slowest])) / doubt[slowest])
            add(slowest, max(above, 1e-3) * REMEASURE_WEIGHT)
    return _State(Profile.from_latencies(table), solutions, candidates)


def _lookup_cells(grid: Grid, solution: Solution) -> list[CellKey]:
    return list(dict.fromkeys(grid.lookup_cell(t, b) for t, b in solution.instances))


def _normal_cdf(z: float) -> float:
    return 0.5 * math.erfc(-z / math.sqrt(2.0))


def _optimizer(grid: Grid, seed: int):  # noqa: ANN202 - skopt.Optimizer, imported lazily
    from skopt import Optimizer
    from skopt.space import Integer

    # skopt needs low < high in every dimension; a one-row or one-column grid gets an unused index.
    dimensions = [Integer(0, max(len(grid.threads) - 1, 1)), Integer(0, max(len(grid.batches) - 1, 1))]
    return Optimizer(
        dimensions,
        base_estimator=DecisionModel(),
        acq_func="LCB",
        acq_func_kwargs={"kappa": EXPLORATION_KAPPA},
        acq_optimizer="sampling",
        # Sampled with replacement: this many draws miss a given cell of a 1000-cell grid < 1e-4 of the time.
        acq_optimizer_kwargs={"n_points": max(2000, 10 * len(grid.cells))},
        n_initial_points=0,
        avoid_duplicates=False,  # re-measuring a contested cell is a legitimate pick
        random_state=seed,
    )


def _value_grid(grid: Grid, state: _State) -> tuple[np.ndarray, np.ndarray]:
    shape = (max(len(grid.threads), 2), max(len(grid.batches), 2))
    value, spread = np.zeros(shape), np.zeros(shape)
    rows = {t: k for k, t in enumerate(grid.threads)}
    cols = {b: k for k, b in enumerate(grid.batches)}
    for (t, b), (v, s) in state.candidates.items():
        value[rows[t], cols[b]] = v
        spread[rows[t], cols[b]] = s
    return value, spread


def _to_index(cell: CellKey, index: tuple[dict[int, int], dict[int, int]]) -> list[int]:
    return [index[0][cell[0]], index[1][cell[1]]]


def _tell(optimizer, grid: Grid, state: _State, points: list[list[int]]) -> None:  # noqa: ANN001
    value, spread = _value_grid(grid, state)
    optimizer.base_estimator_.set_params(value=value, spread=spread)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # What a measurement leaves behind is a cell whose value is known: skopt is told 0 for it.
        optimizer.tell(points, [0.0] * len(points))


def _ask(optimizer, grid: Grid, state: _State) -> CellKey:  # noqa: ANN001
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # skopt warns when its pick was told before; a re-measure is fine
        ti, bi = (int(v) for v in optimizer.ask())
    if ti < len(grid.threads) and bi < len(grid.batches):
        cell = (grid.threads[ti], grid.batches[bi])
        if cell in state.candidates:
            return cell
    # skopt's random sample can miss every candidate on a huge grid: take the most valuable one.
    return max(state.candidates, key=lambda c: (state.candidates[c], -c[0], -c[1]))
