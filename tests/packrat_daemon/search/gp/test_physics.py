"""The latency model's terms, its non-negative fit by relative error, and its predictions."""

from __future__ import annotations

import numpy as np

from packrat_daemon.search.gp import physics

CELLS = [(t, b) for t in (1, 2, 4, 8, 16) for b in (1, 2, 8, 64, 512)]


def test_each_cell_has_the_models_six_terms() -> None:
    np.testing.assert_allclose(physics.features([(4, 8)]), [[1.0, 0.25, 8.0, 2.0, 4.0, 16.0]])
    assert physics.features(CELLS).shape == (len(CELLS), 6)


def test_a_table_the_model_can_express_is_fitted_exactly() -> None:
    theta = np.array([2.0, 1.0, 0.05, 3.0, 0.1, 0.001])
    latencies = physics.predict(theta, CELLS)
    fitted = physics.fit(CELLS, latencies)
    np.testing.assert_allclose(physics.predict(fitted, CELLS), latencies, rtol=1e-6)
    np.testing.assert_allclose(fitted, theta, rtol=1e-4, atol=1e-9)


def test_the_coefficients_are_never_negative() -> None:
    # Latency falling with the batch cannot be expressed with costs >= 0: the fit keeps every term >= 0.
    latencies = np.array([100.0 / b + 1.0 for _, b in CELLS])
    assert (physics.fit(CELLS, latencies) >= 0).all()


def test_the_fit_weighs_relative_error_so_one_large_outlier_does_not_bend_the_small_cells() -> None:
    # 1 ms plus 1 ms per input, with the largest cell 50% slow. Least absolute squares would miss the 2 ms
    # cells by 37% to over 1000%; least relative error keeps them within 1%.
    latencies = np.array([1.0 + b for _, b in CELLS])
    latencies[CELLS.index((16, 512))] *= 1.5
    predicted = physics.predict(physics.fit(CELLS, latencies), CELLS)
    small = [k for k, (_, b) in enumerate(CELLS) if b == 1]
    np.testing.assert_allclose(predicted[small], latencies[small], rtol=0.01)
