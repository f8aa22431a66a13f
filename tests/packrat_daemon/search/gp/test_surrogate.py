"""The surrogate: physics times scikit-optimize's Gaussian-process correction."""

from __future__ import annotations

import math

import numpy as np
import pytest

from packrat_daemon.search import Grid
from packrat_daemon.search.gp import MODEL_FLOOR, ROUGHNESS, Surrogate
from packrat_daemon.search.gp.surrogate import UNPROVEN_DOUBT
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


def test_with_too_few_spare_cells_the_doubt_stays_at_its_unproven_level() -> None:
    # Four cells against up to six coefficients: the fit's own error means nothing yet.
    surrogate = Surrogate({cell: amdahl(*cell) for cell in [(1, 1), (1, 2), (2, 1), (2, 2)]})
    assert surrogate.amplitude == UNPROVEN_DOUBT


def test_a_table_the_model_explains_exactly_keeps_the_least_doubt() -> None:
    measured = {(t, b): amdahl(t, b) for t in (1, 2, 4, 8, 16) for b in (1, 4, 16, 64, 256, 1024)}
    surrogate = Surrogate(measured)
    assert surrogate.amplitude == MODEL_FLOOR
    mean, _ = surrogate.predict(list(measured))
    np.testing.assert_allclose(mean, list(measured.values()), rtol=1e-3)


def test_every_cell_gets_a_latency_and_a_doubt_of_at_least_its_roughness() -> None:
    grid = Grid(GRID, 16, [1024])
    measured = {cell: cache_cliff(*cell) for cell in grid.anchors(44)}
    mean, sigma = Surrogate(measured).predict(grid.cells)
    assert mean.shape == sigma.shape == (len(grid.cells),)
    assert (mean > 0).all() and (sigma >= ROUGHNESS).all()


def test_the_same_seed_gives_the_same_fitted_surrogate() -> None:
    measured = {cell: cache_cliff(*cell) for cell in Grid(GRID, 16, [1024]).anchors(44)}
    first, second = (Surrogate(measured, fit_kernel=True, seed=3).predict([(3, 5), (12, 700)]) for _ in range(2))
    np.testing.assert_array_equal(first[0], second[0])
    np.testing.assert_array_equal(first[1], second[1])
