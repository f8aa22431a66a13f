"""The surrogate: physics times scikit-optimize's Gaussian-process correction."""

from __future__ import annotations

import math

import pytest

from packrat_daemon.search import Grid
from packrat_daemon.search.gp import ROUGHNESS, Surrogate
from tests.helpers.replay_tables import GRID, amdahl, cache_cliff


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


def test_far_from_every_measurement_the_doubt_is_the_prior():
    measured = {cell: amdahl(*cell) * (1.02 if cell == (2, 2) else 1.0) for cell in [(1, 1), (1, 2), (2, 1), (2, 2)]}
    surrogate = Surrogate(measured)
    _, sigma = surrogate.predict([(16, 1024)])
    # Ten octaves away the Matérn correlation is nil: the prior amplitude plus the cell's own roughness.
    assert sigma[0] == pytest.approx(math.sqrt(surrogate.amplitude**2 + ROUGHNESS**2), rel=1e-6)


def test_a_fitted_kernel_explains_the_cells_at_least_as_well_as_the_fixed_one():
    grid = Grid(GRID, 16, [1024])
    measured = {cell: cache_cliff(*cell) for cell in grid.anchors(44) + [(2, 64), (4, 512), (8, 8), (16, 128)]}
    fixed = Surrogate(measured, fit_kernel=False)
    fitted = Surrogate(measured, fit_kernel=True)
    # The fixed kernel lies inside the fitted one's bounds and is where its search starts.
    assert fitted.gp.log_marginal_likelihood_value_ >= fixed.gp.log_marginal_likelihood_value_ - 1e-9
    assert fitted.gp.kernel_ != fixed.gp.kernel_
