"""Full latency tables to replay the search against, and how its plans are scored on them.

Shared by the search tests and `bench/search.py`. Analytic tables come from latency models
(Amdahl-style thread scaling with a per-batch fixed cost, plus shapes the surrogate cannot express
exactly, plus noise); "measuring" a cell looks it up. The true latency of a plan is its L̂ in the full
table under the solver's rule.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from packrat_daemon.search import AdaptiveResult, Budget, Strategy, adaptive_profile
from policies.planning.profile import Profile
from policies.solver import Solver

Table = dict[tuple[int, int], float]
Shape = Callable[[int, int], float]

THREADS = list(range(1, 17))
BATCHES = [2**k for k in range(11)]  # the paper's grid: 16 thread counts × 11 batch sizes
GRID = [(t, b) for t in THREADS for b in BATCHES]
QUARTER = Budget(fraction=0.25)


# -- analytic latency models -----------------------------------------------------------------------
def amdahl(t: int, b: int) -> float:
    """The textbook case: a per-batch fixed cost plus work with a serial fraction."""
    return 4.0 + 3.0 * b * (0.08 + 0.92 / t)


def batch_limited(t: int, b: int) -> float:
    """Small batches cannot keep many threads busy; work grows slightly sub-linearly in the batch."""
    effective = t / (1 + t / (4.0 * b))
    return 2.0 + 0.25 * t + 2.5 * b**0.93 * (0.03 + 0.97 / effective)


def cache_cliff(t: int, b: int) -> float:
    """A 25% step when the inputs per thread spill out of cache: no smooth model has it."""
    base = 6.0 + 1.8 * b * (0.1 + 0.9 / t) + 0.1 * t
    return base * (1.25 if b / t > 24 else 1.0)


def smt_knee(t: int, b: int) -> float:
    """Threads beyond 8 are SMT siblings worth 30% of a core."""
    effective = min(t, 8) + 0.3 * max(t - 8, 0)
    return 3.0 + 0.15 * t + 2.0 * b * (0.05 + 0.95 / effective)


def parallel_fixed(t: int, b: int) -> float:
    """A large parallelisable fixed cost: big instances win."""
    return 30.0 / t + 1.0 + 0.5 * b * (0.02 + 0.98 / t)


SHAPES: list[Shape] = [amdahl, batch_limited, cache_cliff, smt_knee, parallel_fixed]

CASES = [
    # shape, seed, targets, cores, measurement jitter
    (amdahl, 0, [1, 8, 64, 256], 16, 0.0),
    (amdahl, 1, [3, 24, 100, 1000], 16, 0.01),
    (batch_limited, 2, [1, 8, 64, 256], 16, 0.0),
    (batch_limited, 3, [2, 16, 48, 512], 12, 0.01),
    (cache_cliff, 4, [3, 24, 100, 1000], 16, 0.0),
    (cache_cliff, 5, [1, 8, 64, 256], 8, 0.01),
    (smt_knee, 6, [5, 33, 128], 16, 0.0),
    (smt_knee, 7, [1, 12, 200], 12, 0.01),
    (parallel_fixed, 8, [1, 8, 64, 256], 16, 0.0),
    (parallel_fixed, 9, [2, 48, 1000], 7, 0.01),
]


def full_table(shape: Shape, seed: int, noise: float = 0.01) -> Table:
    rng = np.random.default_rng(seed)
    return {(t, b): shape(t, b) * math.exp(noise * rng.standard_normal()) for t, b in GRID}


# -- a profile measured on a real machine ------------------------------------------------------------
# Built-in ResNet-50, 1 and 2 threads × batches 1..16, measured by bench/profile_cost.py on a 2-core
# machine while other jobs ran: note the outliers (1×6 above 1×7, 2×9 above 2×10, 1×1 high).
RESNET50_2CORES = {
    1: "167.3 210.3 336.1 445.2 575.6 871.0 797.1 908.8 983.7 1052.7 1295.6 1413.7 1434.2 1595.5 1637.9 1745.3",
    2: "72.6 129.6 177.0 238.5 293.7 311.9 384.1 445.3 837.7 566.1 637.5 687.4 731.7 865.1 922.9 964.8",
}
RESNET50_TARGETS = [[8, 12, 16], [4, 8, 12, 16], [2, 6, 10, 14], [1, 2, 3, 4], [16]]


def resnet50_table() -> Table:
    return {(t, b): float(v) for t, row in RESNET50_2CORES.items() for b, v in enumerate(row.split(), start=1)}


# -- replay and score --------------------------------------------------------------------------------
def replay(
    table: Table,
    targets: list[int],
    cores: int,
    seed: int,
    jitter: float = 0.0,
    budget: Budget = QUARTER,
    strategy: Strategy | None = None,
) -> AdaptiveResult:
    """The search with every measurement read from `table`, times exp(jitter·N(0,1)) seeded by `seed`."""
    rng = np.random.default_rng(seed + 1000)

    def measure(t: int, b: int) -> float:
        return table[(t, b)] * (math.exp(jitter * rng.standard_normal()) if jitter else 1.0)

    return adaptive_profile(
        measure, list(table), targets, cores, budget=budget, strategy=strategy, seed=seed, noise=jitter
    )


def gaps(result: AdaptiveResult, table: Table, cores: int) -> dict[int, float]:
    """Per target: the chosen plan's true latency over the full table's optimum, minus one."""
    truth = Profile.from_latencies(table)
    solver = Solver(truth, cores)
    out = {}
    for batch, solution in result.solutions.items():
        true_latency = max(truth.lhat(t, b) for t, b in solution.instances)
        out[batch] = true_latency / solver.solve(batch).latency_ms - 1.0
    return out
