"""What the search loop and a strategy share: a strategy's label and surrogate, and the belief the
acquisition functions read off the leads."""

from __future__ import annotations

import math

import numpy as np
import pytest

from packrat_daemon.search.base import Assessment, Belief, Kind, Lead, Strategy, lead_belief
from packrat_daemon.search.decisive import DecisiveStrategy
from packrat_daemon.search.expected_improvement import ExpectedImprovementStrategy
from packrat_daemon.search.grid import CellKey
from tests.helpers.replay_tables import amdahl


def test_a_strategy_is_labelled_by_name_and_by_a_kernel_it_would_not_choose() -> None:
    assert DecisiveStrategy().label == "decisive"
    assert DecisiveStrategy(fit_kernel=False).label == "decisive"
    assert DecisiveStrategy(fit_kernel=True).label == "decisive (fitted kernel)"
    assert ExpectedImprovementStrategy().label == "expected-improvement"
    assert ExpectedImprovementStrategy(fit_kernel=False).label == "expected-improvement (fixed kernel)"


def test_the_surrogate_fits_its_kernel_only_where_the_strategy_says() -> None:
    measured = {cell: amdahl(*cell) for cell in [(1, 1), (1, 64), (4, 8), (16, 1), (16, 64), (2, 16), (8, 2)]}
    assert DecisiveStrategy().surrogate(measured, seed=0).gp.optimizer is None
    fitted = DecisiveStrategy(fit_kernel=True).surrogate(measured, seed=0).gp
    assert fitted.optimizer == "fmin_l_bfgs_b" and fitted.kernel_ != fitted.kernel


def test_a_strategy_must_say_how_it_picks() -> None:
    class Pickless(Strategy):
        name = "pickless"
        fits_kernel_by_default = False

    with pytest.raises(TypeError, match="abstract"):
        Pickless()  # type: ignore[abstract]


def test_a_belief_answers_by_row_with_or_without_its_spread() -> None:
    belief = Belief(np.array([0.5, -1.0, 2.0]), np.array([0.1, 0.2, 0.3]))
    rows = np.array([[2], [0]])
    np.testing.assert_array_equal(belief.predict(rows), [2.0, 0.5])
    mean, std = belief.predict(rows, return_std=True)
    np.testing.assert_array_equal(mean, [2.0, 0.5])
    np.testing.assert_array_equal(std, [0.3, 0.1])
    np.testing.assert_array_equal(belief.rows, [[0], [1], [2]])


def test_each_lead_is_its_log_distance_from_its_bound_on_the_side_that_keeps_the_plan() -> None:
    table: dict[CellKey, float] = {(1, 8): 20.0, (2, 8): 12.0, (4, 8): 9.0}
    doubt: dict[CellKey, float] = {(1, 8): 0.01, (2, 8): 0.2, (4, 8): 0.3}
    leads = [
        Lead((2, 8), Kind.FASTER, 10.0, remeasure=False),  # keeps the plan while slower than 10 ms
        Lead((4, 8), Kind.SLOWER, 10.0, remeasure=False),  # keeps the plan while faster than 10 ms
        Lead((1, 8), Kind.UNCONFIRMED, 20.0, remeasure=True),
    ]
    belief = lead_belief(Assessment(table, doubt, leads))
    np.testing.assert_allclose(belief.mean, [math.log(1.2), math.log(10 / 9), 0.0])
    np.testing.assert_array_equal(belief.std, [0.2, 0.3, 0.01])
