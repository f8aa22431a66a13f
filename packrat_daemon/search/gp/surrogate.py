"""Latency over (threads, batch): the physics model times scikit-optimize's Gaussian-process correction.

The correction is a GP over log2(threads), log2(batch) of the model's log residuals, with a Matérn-5/2
kernel: it follows what the model cannot express (an SMT knee, a cache cliff) and gives every cell an
uncertainty σ (log space). Its kernel is either set from the residuals (fixed) or fitted by maximum
marginal likelihood; the strategies choose.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence

import numpy as np
from skopt.learning import GaussianProcessRegressor
from skopt.learning.gaussian_process.kernels import ConstantKernel, Matern

from packrat_daemon.search.gp import physics

CellKey = tuple[int, int]

ROUGHNESS = 0.01  # how far a true cell may sit off any smooth trend (log space)
MODEL_FLOOR = 0.05  # least doubt about the surrogate far from every measurement (log space)
UNPROVEN_DOUBT = 0.15  # doubt while there are too few cells to judge the fit's own error
LENGTH_SCALE = 1.0  # octaves of threads and of batch over which residuals stay correlated
# Bounds of a fitted kernel: residuals correlated over a quarter octave to 8 octaves, doubt up to e^1.
LENGTH_SCALE_BOUNDS = (0.25, 8.0)
AMPLITUDE_CEILING = 1.0
FIT_RESTARTS = 2


def _coords(cells: Sequence[CellKey]) -> np.ndarray:
    return np.log2(np.array(cells, dtype=float))


class Surrogate:
    """Fitted to measured cells; `predict` gives each cell's median latency and its σ (log space)."""

    def __init__(self, measured: Mapping[CellKey, float], *, fit_kernel: bool = False, seed: int = 0) -> None:
        cells = list(measured)
        latencies = np.array([measured[c] for c in cells], dtype=float)
        self.theta = physics.fit(cells, latencies)
        residual = np.log(latencies / physics.predict(self.theta, cells))
        self.amplitude = _residual_amplitude(residual, int(np.count_nonzero(self.theta)))
        self.gp = GaussianProcessRegressor(
            kernel=_kernel(self.amplitude, fit_kernel),
            alpha=ROUGHNESS**2,  # a measured cell sits off the smooth trend by its roughness
            optimizer="fmin_l_bfgs_b" if fit_kernel else None,
            n_restarts_optimizer=FIT_RESTARTS if fit_kernel else 0,
            random_state=seed,  # where a fitted kernel's restarts begin
        )
        with warnings.catch_warnings():
            # With a handful of cells the likelihood is flat along some bound; the bounds are the answer then.
            warnings.simplefilter("ignore")
            self.gp.fit(_coords(cells), residual)

    def predict(self, cells: Sequence[CellKey]) -> tuple[np.ndarray, np.ndarray]:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # sklearn warns when rounding leaves a variance just below 0
            mean, std = self.gp.predict(_coords(cells), return_std=True)
        # A true cell differs from the smooth trend by its own roughness too.
        sigma = np.sqrt(std**2 + ROUGHNESS**2)
        return physics.predict(self.theta, cells) * np.exp(mean), sigma


def _residual_amplitude(residual: np.ndarray, active_terms: int) -> float:
    """The GP's prior doubt: the fit's own error, which least squares understates by about n/(n-p);
    with too few spare cells that estimate means nothing, so stay doubtful until they exist."""
    spare = len(residual) - active_terms
    if spare < 2:
        return UNPROVEN_DOUBT
    return max(MODEL_FLOOR, float(np.sqrt(np.mean(residual**2) * len(residual) / spare)))


def _kernel(amplitude: float, fit: bool) -> ConstantKernel:
    if not fit:
        return ConstantKernel(amplitude**2, "fixed") * Matern(LENGTH_SCALE * np.ones(2), "fixed", nu=2.5)
    return ConstantKernel(amplitude**2, (MODEL_FLOOR**2, AMPLITUDE_CEILING**2)) * Matern(
        LENGTH_SCALE * np.ones(2), LENGTH_SCALE_BOUNDS, nu=2.5
    )
