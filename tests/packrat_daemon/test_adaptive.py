"""Adaptive profiling: few cells measured, plans within 3% of the full table's optimum.

Full tables come from analytic latency models (Amdahl-style thread scaling with a per-batch fixed
cost, plus shapes the surrogate cannot express exactly, plus noise); "measuring" a cell looks it up.
The true latency of a plan is its L̂ in the full table under the solver's rule.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packrat_daemon.adaptive import (
    AdaptiveResult,
    Budget,
    Grid,
    Surrogate,
    adaptive_profile,
    fill_rows,
)
from packrat_daemon.cli import main
from packrat_daemon.commands.profile_adaptive import write_profile
from packrat_daemon.measure.confirm import table_confirmation
from packrat_daemon.wire.errors import ProfileError
from policies.planning.profile import Profile
from policies.solver import Solver

THREADS = list(range(1, 17))
BATCHES = [2**k for k in range(11)]  # the paper's grid: 16 thread counts × 11 batch sizes
GRID = [(t, b) for t in THREADS for b in BATCHES]
MAX_FRACTION = 0.25
MAX_GAP = 0.03
QUARTER = Budget(fraction=MAX_FRACTION)

Shape = Callable[[int, int], float]


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


def full_table(shape: Shape, seed: int, noise: float = 0.01) -> dict[tuple[int, int], float]:
    rng = np.random.default_rng(seed)
    return {(t, b): shape(t, b) * math.exp(noise * rng.standard_normal()) for t, b in GRID}


def run(
    table: dict[tuple[int, int], float], targets: list[int], cores: int, seed: int, jitter: float = 0.0,
    budget: Budget = QUARTER,
) -> AdaptiveResult:  # fmt: skip
    rng = np.random.default_rng(seed + 1000)

    def measure(t: int, b: int) -> float:
        return table[(t, b)] * (math.exp(jitter * rng.standard_normal()) if jitter else 1.0)

    return adaptive_profile(measure, list(table), targets, cores, budget=budget, seed=seed, noise=jitter)


def gaps(result: AdaptiveResult, table: dict[tuple[int, int], float], cores: int) -> dict[int, float]:
    """Per target: the chosen plan's true latency over the full table's optimum, minus one."""
    truth = Profile.from_latencies(table)
    solver = Solver(truth, cores)
    out = {}
    for batch, solution in result.solutions.items():
        true_latency = max(truth.lhat(t, b) for t, b in solution.instances)
        out[batch] = true_latency / solver.solve(batch).latency_ms - 1.0
    return out


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


@pytest.mark.parametrize(
    ("shape", "seed", "targets", "cores", "jitter"), CASES, ids=lambda v: getattr(v, "__name__", None)
)
def test_few_cells_and_plans_within_three_percent(
    shape: Shape, seed: int, targets: list[int], cores: int, jitter: float
):
    table = full_table(shape, seed)
    result = run(table, targets, cores, seed, jitter)
    assert result.grid_size == len(GRID) == 176
    # Every measurement counts, re-measurements of contested cells included.
    assert result.measurements <= MAX_FRACTION * len(GRID)
    assert len(result.measured) <= MAX_FRACTION * len(GRID)
    worst = gaps(result, table, cores)
    assert max(worst.values()) <= MAX_GAP, worst
    assert set(result.solutions) == set(targets)


def test_a_clean_amdahl_table_is_settled_well_under_budget():
    table = full_table(amdahl, seed=11, noise=0.0)
    result = run(table, [1, 8, 64, 256], cores=16, seed=11)
    assert result.stopped == "confirmed"
    assert result.measurements <= 0.15 * len(GRID)
    assert max(gaps(result, table, 16).values()) == pytest.approx(0.0, abs=1e-9)


def test_plans_are_confirmed_by_measurement_when_it_stops_early():
    table = full_table(cache_cliff, seed=12)
    result = run(table, [3, 24, 100], cores=16, seed=12)
    assert result.stopped == "confirmed"
    grid = Grid(GRID, 16, [3, 24, 100])
    for solution in result.solutions.values():
        for t, b in solution.instances:
            assert grid.lookup_cell(t, b) in result.measured


def test_same_seed_same_cells_and_plans():
    table = full_table(batch_limited, seed=13)
    first = run(table, [1, 8, 64, 256], 16, seed=13, jitter=0.01)
    second = run(table, [1, 8, 64, 256], 16, seed=13, jitter=0.01)
    assert list(first.measured) == list(second.measured)
    assert first.samples == second.samples
    assert first.solutions == second.solutions
    assert first.profile == second.profile


def test_results_hold_only_plain_python_numbers():
    result = run(full_table(smt_knee, seed=14), [2, 16, 128], 16, seed=14)
    cells = result.measured_cells()
    assert all(type(v) is int for cell in cells for v in cell)
    assert all(type(t) is int and type(b) is int for t, b in result.measured)
    for solution in result.solutions.values():
        assert all(type(t) is int and type(b) is int for t, b in solution.instances)
    json.dumps({"measured": cells})  # numpy integers would raise here


def test_budget_caps_measurements():
    result = run(full_table(cache_cliff, seed=15), [3, 24, 100, 1000], 16, seed=15, budget=Budget(fraction=0.05))
    assert result.measurements == math.floor(0.05 * len(GRID))
    assert result.stopped == "budget"
    assert set(result.solutions) == {3, 24, 100, 1000}  # a plan for every target even so


def test_a_budget_as_large_as_the_grid_measures_the_grid():
    table = full_table(amdahl, seed=16)
    result = run(table, [8, 64], 16, seed=16, budget=Budget(fraction=1.0))
    assert result.stopped == "grid"
    assert set(result.measured) == set(table)
    assert max(gaps(result, table, 16).values()) == 0.0


def test_a_seconds_budget_uses_the_clock():
    table = full_table(amdahl, seed=17)
    now = [0.0]

    def measure(t: int, b: int) -> float:
        now[0] += 1.0  # every cell takes one "second"
        return table[(t, b)]

    result = adaptive_profile(
        measure, list(table), [3, 24, 100, 1000], 16, budget=Budget(seconds=6.5), seed=17, clock=lambda: now[0]
    )
    assert result.measurements == 7  # the 7th starts at 6 s, within budget; the 8th would start at 7 s


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0.25", Budget(fraction=0.25)),
        ("1", Budget(fraction=1.0)),
        ("300s", Budget(seconds=300.0)),
        (" 2.5S ", Budget(seconds=2.5)),
    ],
)
def test_budget_parsing(text: str, expected: Budget):
    assert Budget.parse(text) == expected


@pytest.mark.parametrize("text", ["0", "-0.1", "2", "abc", "s", "-5s", "nans"])
def test_bad_budgets_say_what_is_expected(text: str):
    with pytest.raises(ProfileError, match="fraction of the grid"):
        Budget.parse(text)


def test_one_core_and_a_tiny_grid():
    table = {(1, b): 5.0 + 2.0 * b for b in (1, 2, 4, 8)}
    result = adaptive_profile(lambda t, b: table[(t, b)], list(table), [4], 1, budget=Budget(fraction=0.5))
    assert result.measurements <= 2
    assert result.solutions[4].instances == ((1, 4),)


def test_a_sparse_ragged_table():
    table = {key: value for key, value in full_table(smt_knee, seed=18).items() if key[0] % 3 != 2 and key[1] <= 512}
    table.update({(2, 1024): smt_knee(2, 1024)})  # one row longer than the others
    result = adaptive_profile(lambda t, b: table[(t, b)], list(table), [8, 100], 16, budget=Budget(fraction=0.25))
    assert set(result.profile) == set(table)
    assert max(gaps(result, table, 16).values()) <= MAX_GAP


# -- a profile measured here ----------------------------------------------------------------------
# Built-in ResNet-50, 1 and 2 threads × batches 1..16, measured by bench/profile_cost.py on this
# 2-core machine while other jobs ran: note the outliers (1×6 above 1×7, 2×9 above 2×10, 1×1 high).
RESNET50_2CORES = {
    1: "167.3 210.3 336.1 445.2 575.6 871.0 797.1 908.8 983.7 1052.7 1295.6 1413.7 1434.2 1595.5 1637.9 1745.3",
    2: "72.6 129.6 177.0 238.5 293.7 311.9 384.1 445.3 837.7 566.1 637.5 687.4 731.7 865.1 922.9 964.8",
}


def resnet50_table() -> dict[tuple[int, int], float]:
    return {(t, b): float(v) for t, row in RESNET50_2CORES.items() for b, v in enumerate(row.split(), start=1)}


@pytest.mark.parametrize("targets", [[8, 12, 16], [4, 8, 12, 16], [2, 6, 10, 14], [1, 2, 3, 4], [16]])
@pytest.mark.parametrize("jitter", [0.0, 0.02])
def test_a_measured_resnet50_profile(targets: list[int], jitter: float):
    table = resnet50_table()
    result = run(table, targets, cores=2, seed=0, jitter=jitter)
    assert result.measurements <= MAX_FRACTION * len(table)  # 8 of 32
    assert max(gaps(result, table, 2).values()) <= MAX_GAP


def test_a_small_budget_spends_fewer_cells_on_anchors():
    grid = Grid(list(resnet50_table()), 2, [8, 16])
    assert len(grid.anchors(8)) == 3
    assert len(grid.anchors(44)) == 5
    # No plan for B >= 8 on 2 cores has its slowest instance below 4 inputs: no anchor there.
    assert all(b >= 4 for _, b in grid.anchors(44))


# -- the surrogate ---------------------------------------------------------------------------------
@settings(max_examples=25, deadline=None)
@given(
    picks=st.lists(st.integers(0, len(GRID) - 1), min_size=3, max_size=30, unique=True),
    jitter=st.floats(0.0, 0.2),
    seed=st.integers(0, 10_000),
)
def test_filled_rows_are_positive_monotone_and_keep_measurements(picks: list[int], jitter: float, seed: int):
    rng = np.random.default_rng(seed)
    measured = {GRID[k]: batch_limited(*GRID[k]) * math.exp(jitter * rng.standard_normal()) for k in picks}
    grid = Grid(GRID, 16, [1024])
    mean, sigma = Surrogate(measured).predict(grid.cells)
    assert np.all(mean > 0) and np.all(np.isfinite(mean)) and np.all(sigma > 0)
    table = fill_rows(grid, measured, dict(zip(grid.cells, mean.tolist(), strict=True)))
    assert set(table) == set(GRID)
    for cell, value in measured.items():
        assert table[cell] == value
    for t in THREADS:
        row = [table[(t, b)] for b in BATCHES]
        assert all(v > 0 for v in row)
        for j, b in enumerate(BATCHES):
            if (t, b) not in measured:  # a filled cell never undercuts anything to its left
                assert row[j] >= max(row[:j], default=0.0)
    Profile.from_latencies(table)  # valid: positive and finite everywhere


def test_the_surrogate_recovers_an_amdahl_table_from_anchors():
    grid = Grid(GRID, 16, [1024])
    measured = {cell: amdahl(*cell) for cell in grid.anchors(44) + [(2, 8), (8, 64)]}
    mean, _ = Surrogate(measured).predict(grid.cells)
    errors = [abs(m / amdahl(*cell) - 1) for cell, m in zip(grid.cells, mean, strict=True)]
    assert max(errors) < 0.02


def test_uncertainty_is_smallest_at_measured_cells():
    grid = Grid(GRID, 16, [1024])
    measured = {cell: cache_cliff(*cell) for cell in grid.anchors(44)}
    _, sigma = Surrogate(measured).predict(grid.cells)
    doubt = dict(zip(grid.cells, sigma, strict=True))
    far = max(doubt.values())
    assert all(doubt[cell] < far / 2 for cell in measured)


# -- confirmation and the command line --------------------------------------------------------------
def test_table_confirmation_is_the_slowest_instance():
    profile = Profile.from_latencies({(1, 4): 10.0, (1, 8): 18.0, (2, 8): 11.0})
    assert table_confirmation(profile.lhat, [(1, 5), (2, 8)]) == 18.0
    assert table_confirmation(profile.lhat, [(1, 2), (2, 8)], interference=1.1) == pytest.approx(12.1)


def write_table(path, table: dict[tuple[int, int], float]) -> str:  # noqa: ANN001
    Profile.from_latencies(table).write_csv(path)
    return str(path)


def test_cli_replay_prints_measured_cells_and_solve_style_plans(tmp_path, capsys):
    table = full_table(amdahl, seed=19)
    path = write_table(tmp_path / "full.csv", table)
    argv = ["profile", "--adaptive", "--replay", path, "--cores", "16", "--batches", "1,8,64,256",
            "--budget", "0.25", "--seed", "3", "--json"]  # fmt: skip
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert 0 < len(out["measured"]) <= 0.25 * 176
    assert all(type(v) is int and len(cell) == 2 for cell in out["measured"] for v in cell)
    assert [plan["batch"] for plan in out["plans"]] == [1, 8, 64, 256]
    truth = Profile.read_csv(path)
    solver = Solver(truth, 16)
    for plan, confirmed in zip(out["plans"], out["confirmed"], strict=True):
        assert set(plan) == {"batch", "latency_ms", "instances"}
        assert all(set(i) == {"threads", "batch"} for i in plan["instances"])
        assert sum(i["batch"] for i in plan["instances"]) == plan["batch"]
        assert sum(i["threads"] for i in plan["instances"]) <= 16
        assert confirmed["latency_ms"] <= solver.solve(plan["batch"]).latency_ms * (1 + MAX_GAP)

    assert main(argv) == 0  # the same seed answers the same
    assert json.loads(capsys.readouterr().out) == out


def test_cli_replay_is_the_library_search_plus_packrat_solve(tmp_path, capsys):
    from packrat_daemon.commands.solve import solve_plans
    from policies.planning.topology import Topology

    table = full_table(smt_knee, seed=20)
    path = write_table(tmp_path / "full.csv", table)
    assert main(["profile", "--adaptive", "--replay", path, "--cores", "12", "--batches", "4,48",
                 "--seed", "5", "--json"]) == 0  # fmt: skip
    out = json.loads(capsys.readouterr().out)
    # The CSV rounds latencies to 4 decimals: search the table as the command read it.
    result = run({key: cell.latency_ms for key, cell in Profile.read_csv(path).items()}, [4, 48], 12, seed=5)
    assert out["measured"] == result.measured_cells()
    # Solved by `packrat solve`'s own code path: identical plan objects.
    assert out["plans"] == solve_plans(result.profile, Topology.synthetic(12), [4, 48], "packrat")


def test_cli_replay_noise_is_seeded(tmp_path, capsys):
    path = write_table(tmp_path / "full.csv", full_table(cache_cliff, seed=22))
    argv = ["profile", "--adaptive", "--replay", path, "--batches", "8,100", "--noise", "0.02", "--json"]
    outputs = []
    for seed in ("1", "1", "2"):
        assert main([*argv, "--seed", seed]) == 0
        outputs.append(json.loads(capsys.readouterr().out))
    assert outputs[0] == outputs[1]
    assert outputs[0]["cores"] == 16  # a replayed table plans for the cores it covers by default
    assert outputs[0]["measurements"] <= 44 and outputs[2]["measurements"] <= 44


def test_cli_replay_errors_are_clear(tmp_path, capsys):
    path = write_table(tmp_path / "full.csv", {(1, 1): 5.0, (1, 2): 9.0})
    assert main(["profile", "--adaptive", "--replay", path, "--batches", "2", "--budget", "lots"]) == 2
    assert "--budget must be" in capsys.readouterr().err
    assert main(["profile", "--adaptive", "--replay", str(tmp_path / "missing.csv"), "--batches", "2"]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_written_profile_round_trips_and_marks_estimates(tmp_path):
    table = full_table(amdahl, seed=21)
    result = run(table, [8, 64], 16, seed=21)
    from policies.planning.profile import Cell

    cells = {cell: Cell(value, 3, value * 1.05) for cell, value in result.measured.items()}
    path = tmp_path / "adaptive.csv"
    write_profile(result, cells, path, model="builtin:resnet50", runtime="torch")
    again = Profile.read_csv(path)
    assert again.model == "builtin:resnet50"
    assert set(again) == set(result.profile)
    for cell, _ in result.profile.items():
        assert again.latency(*cell) == pytest.approx(result.profile.latency(*cell), abs=1e-4)
    rows = path.read_text().splitlines()
    assert sum(row.endswith(",measured") for row in rows) == len(result.measured)
    assert sum(row.endswith(",surrogate") for row in rows) == 176 - len(result.measured)
