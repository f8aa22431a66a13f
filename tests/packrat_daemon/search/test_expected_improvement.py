"""The expected-improvement strategy: plan cells first, then skopt's EI summed over each cell's leads."""

from __future__ import annotations

import pytest

from packrat_daemon.search import ExpectedImprovementStrategy
from packrat_daemon.search.base import Assessment, Kind, Lead
from tests.helpers.replay_tables import CASES, GRID, Shape, full_table, gaps, replay

STRATEGY = ExpectedImprovementStrategy()


def test_unconfirmed_plan_cells_come_first_least_known_first():
    table = {(1, 8): 10.0, (2, 4): 10.0, (4, 2): 5.0}
    doubt = {(1, 8): 0.05, (2, 4): 0.1, (4, 2): 0.3}
    leads = [
        Lead((1, 8), Kind.UNCONFIRMED, 10.0, False),
        Lead((2, 4), Kind.UNCONFIRMED, 10.0, False),
        Lead((4, 2), Kind.FASTER, 9.9, False),
    ]
    assert STRATEGY.pick(Assessment(table, doubt, leads)) == (2, 4)


def test_among_rivals_the_larger_expected_improvement_wins():
    # Equally far above the bound: only the wider one can plausibly fall far below it.
    table = {(2, 4): 11.0, (4, 2): 11.0}
    doubt = {(2, 4): 0.05, (4, 2): 0.3}
    leads = [Lead((2, 4), Kind.FASTER, 10.0, False), Lead((4, 2), Kind.FASTER, 10.0, False)]
    assert STRATEGY.pick(Assessment(table, doubt, leads)) == (4, 2)


def test_a_plan_cell_that_may_be_slower_than_its_rival_counts():
    table = {(2, 4): 10.5, (4, 2): 9.0}
    doubt = {(2, 4): 0.05, (4, 2): 0.01}
    # (2, 4) sits above the rival's 10 ms: measuring it again likely shows the plan lost.
    leads = [Lead((2, 4), Kind.SLOWER, 10.0, True), Lead((4, 2), Kind.FASTER, 8.0, True)]
    assert STRATEGY.pick(Assessment(table, doubt, leads)) == (2, 4)


def test_the_kernel_is_fitted_unless_told_otherwise():
    assert STRATEGY.fit_kernel
    assert STRATEGY.label == "expected-improvement"
    fixed = ExpectedImprovementStrategy(fit_kernel=False)
    assert not fixed.fit_kernel and fixed.label == "expected-improvement (fixed kernel)"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("shape", "seed", "targets", "cores", "jitter"), CASES, ids=lambda v: getattr(v, "__name__", None)
)
def test_few_cells_and_plans_within_three_percent_on_analytic_tables(
    shape: Shape, seed: int, targets: list[int], cores: int, jitter: float
):
    table = full_table(shape, seed)
    result = replay(table, targets, cores, seed, jitter, strategy=STRATEGY)
    assert result.measurements <= 0.25 * len(GRID)
    assert max(gaps(result, table, cores).values()) <= 0.03
