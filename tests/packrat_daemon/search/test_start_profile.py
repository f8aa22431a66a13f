"""The daemon's start-up profile: the full grid below the threshold, the adaptive search above it, and a
plan that never rests on an estimated cell."""

from __future__ import annotations

from packrat_daemon.search import Budget
from packrat_daemon.search.grid import plan_cells
from packrat_daemon.search.start_profile import ADAPTIVE_ABOVE_CELLS, start_profile, uses_search
from policies.packrat import PackratPolicy
from policies.planning.distribution import BatchDistribution
from policies.planning.profile import Cell, Profile
from policies.planning.topology import Topology
from tests.helpers.replay_tables import amdahl, batch_limited, full_table

CORES = 16
BATCHES = [1, 2, 4, 8, 16, 32, 64]
GRID = [(t, b) for t in range(1, CORES + 1) for b in BATCHES]  # the daemon's default grid at 16 cores, batch 64
AT_64 = BatchDistribution.single(64)


def run(table: dict[tuple[int, int], float], budget: Budget, cores: int = CORES, grid=GRID, distribution=AT_64):
    policy, topology = PackratPolicy(), Topology.synthetic(cores)
    asked: list[tuple[int, int]] = []

    def measure(t: int, b: int) -> Cell:
        asked.append((t, b))
        return Cell(table[(t, b)], 3)

    found = start_profile(measure, grid, distribution, cores, budget, lambda p: policy.plan(p, topology, distribution))
    return found, asked


def test_a_small_grid_is_measured_whole() -> None:
    grid = [(t, b) for t in (1, 2) for b in (1, 2, 4, 8, 16)]
    assert len(grid) <= ADAPTIVE_ABOVE_CELLS and not uses_search(len(grid), Budget(fraction=0.25))
    table = {key: amdahl(*key) for key in grid}
    found, asked = run(table, Budget(fraction=0.25), cores=2, grid=grid, distribution=BatchDistribution.single(16))
    assert found.mode == "grid" and asked == sorted(grid) and found.estimated == {}


def test_a_budget_of_the_whole_grid_measures_it_whole() -> None:
    assert not uses_search(len(GRID), Budget(fraction=1.0))


def test_above_the_threshold_the_search_measures_a_quarter_and_plans_within_three_percent() -> None:
    for shape, seed in ((amdahl, 3), (batch_limited, 5)):
        table = {key: value for key, value in full_table(shape, seed).items() if key in set(GRID)}
        found, asked = run(table, Budget(fraction=0.25))
        assert found.mode == "adaptive" and uses_search(len(GRID), Budget(fraction=0.25))
        assert len(found.measured) <= 0.25 * len(GRID) + len(found.confirmed_beyond_budget)
        assert len(found.measured) + len(found.estimated) == len(GRID)  # every cell one or the other, never both
        assert not set(found.measured) & set(found.estimated)
        topology = Topology.synthetic(CORES)
        adaptive = PackratPolicy().plan(found.profile(), topology, AT_64)
        full = PackratPolicy().plan(Profile.from_latencies(table), topology, AT_64)
        true_ms = PackratPolicy().expected_latency(Profile.from_latencies(table), adaptive, AT_64)
        assert true_ms <= full.predicted_latency_ms * 1.03, (shape.__name__, adaptive.describe(), full.describe())


def test_a_plan_resting_on_estimated_cells_has_them_measured_before_it_serves() -> None:
    table = {key: value for key, value in full_table(amdahl, 3).items() if key in set(GRID)}
    # Two measurements: the search stops on its budget before its anchors are done, its plan unconfirmed.
    found, asked = run(table, Budget(fraction=2 / len(GRID)))
    assert found.stopped == "budget" and found.confirmed_beyond_budget
    assert len(asked) == 2 + len(found.confirmed_beyond_budget)
    measured = found.profile()
    plan = PackratPolicy().plan(measured, Topology.synthetic(CORES), AT_64)
    assert set(plan_cells(plan, measured, AT_64, CORES)) <= set(found.measured)
