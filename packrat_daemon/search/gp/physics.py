"""The Amdahl-style latency model: L ≈ c0 + c1/t + (c2 + c3/t)·b + c4·t + c5·b²/t, coefficients ≥ 0."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from scipy.optimize import nnls

CellKey = tuple[int, int]


def features(cells: Sequence[CellKey]) -> np.ndarray:
    """Fixed cost, its parallel part, serial and parallel work per input, a per-thread overhead
    (synchronisation grows with the team), and cache pressure (inputs per thread beyond what the
    caches hold make each input dearer)."""
    t = np.array([c[0] for c in cells], dtype=float)
    b = np.array([c[1] for c in cells], dtype=float)
    return np.column_stack([np.ones_like(t), 1.0 / t, b, b / t, t, b * b / t])


def fit(cells: Sequence[CellKey], latencies: np.ndarray) -> np.ndarray:
    """Non-negative coefficients minimising relative error (latencies span orders of magnitude)."""
    terms = features(cells)
    scale = terms.max(axis=0)
    weighted = terms / scale / latencies[:, None]
    theta, _ = nnls(weighted, np.ones(len(latencies)))
    theta = theta / scale
    if not np.any(theta > 0):  # degenerate data: a flat model is the honest fallback
        theta = np.zeros(terms.shape[1])
        theta[0] = float(np.exp(np.mean(np.log(latencies))))
    return theta


def predict(theta: np.ndarray, cells: Sequence[CellKey]) -> np.ndarray:
    return features(cells) @ theta
