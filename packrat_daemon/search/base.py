"""The interface between the search loop and a strategy (after optuna's samplers).

The loop owns what every strategy shares: anchors, the filled table, the exact plans, the budget,
and the certificate that ends the search (no `Lead` left). A strategy decides two things: whether the
surrogate's kernel is fitted or set from the residuals, and which lead to measure next.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum

import numpy as np

from packrat_daemon.search.gp import Surrogate
from packrat_daemon.search.grid import CellKey


class Kind(Enum):
    UNCONFIRMED = "unconfirmed"  # a cell of a plan, not yet measured: the plan's latency is a guess
    FASTER = "faster"  # if the cell is faster than `bound_ms`, a rival plan beats the current one
    SLOWER = "slower"  # if the cell is slower than `bound_ms`, the current plan loses to a measured rival


@dataclass(frozen=True)
class Lead:
    """A cell whose measurement could confirm or change a plan for one target batch size."""

    cell: CellKey
    kind: Kind
    bound_ms: float
    remeasure: bool  # the cell was measured already: a contest between measured plans


@dataclass(frozen=True)
class Assessment:
    """What the search knows now: each cell's latency (measured or filled), its σ (log space), the leads."""

    table: Mapping[CellKey, float]
    doubt: Mapping[CellKey, float]
    leads: Sequence[Lead]


class Strategy(ABC):
    """One way to run the search: how the surrogate's kernel is set, and which lead to measure next.

    A strategy holds no search state (the loop does), so one instance serves any number of searches.
    """

    name: str
    fits_kernel_by_default: bool

    def __init__(self, fit_kernel: bool | None = None) -> None:
        self.fit_kernel = self.fits_kernel_by_default if fit_kernel is None else fit_kernel

    @property
    def label(self) -> str:
        """The name, plus the kernel where it differs from the strategy's own choice (for benches)."""
        if self.fit_kernel == self.fits_kernel_by_default:
            return self.name
        return f"{self.name} ({'fitted' if self.fit_kernel else 'fixed'} kernel)"

    def surrogate(self, measured: Mapping[CellKey, float], seed: int) -> Surrogate:
        """Fit the surrogate to the measured cells' medians; `seed` starts a fitted kernel's restarts."""
        return Surrogate(measured, fit_kernel=self.fit_kernel, seed=seed)

    @abstractmethod
    def pick(self, assessment: Assessment) -> CellKey:
        """The next cell to measure; `assessment.leads` is never empty here."""


class Belief:
    """Values as skopt's acquisition functions expect a fitted model: `predict(X, return_std=True)`,
    where row i of X names value i."""

    def __init__(self, mean: np.ndarray, std: np.ndarray) -> None:
        self.mean, self.std = mean, std
        self.rows = np.arange(len(mean)).reshape(-1, 1)

    def predict(self, X: np.ndarray, return_std: bool = False) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
        rows = np.asarray(X, dtype=int)[:, 0]
        return (self.mean[rows], self.std[rows]) if return_std else self.mean[rows]


def lead_belief(assessment: Assessment) -> Belief:
    """Each lead's distance from its bound on the side that keeps the plan (log space), with its σ.

    With y_opt = 0, skopt's PI on this belief is the chance that measuring a lead's cell changes a
    plan, and its EI the expected size of that change.
    """
    leads = assessment.leads
    margin = np.array([math.log(assessment.table[lead.cell] / lead.bound_ms) for lead in leads])
    sign = np.array([-1.0 if lead.kind is Kind.SLOWER else 1.0 for lead in leads])
    return Belief(sign * margin, np.array([assessment.doubt[lead.cell] for lead in leads]))
