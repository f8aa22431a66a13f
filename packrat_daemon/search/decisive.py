"""The decisive-cell strategy: measure the cell most likely to confirm or change a plan.

Each lead is worth the probability that measuring its cell changes a plan (skopt's PI on the leads),
an unconfirmed plan cell is worth 1, and a cell's worth is the sum over its leads. A re-measurement is
worth less than a first look at an equally decisive cell. Among equally decisive cells, skopt's LCB
prefers the one the surrogate knows least.

It is the default, with the kernel set from the residuals rather than fitted: a kernel fitted to a
handful of cells saves a few measurements but trusts them too far, and on the measured ResNet-50
table of `bench/search.py` it chose a plan well beyond 3% of the optimum (bench/results/search.json).
"""

from __future__ import annotations

import numpy as np
from skopt.acquisition import gaussian_lcb, gaussian_pi

from packrat_daemon.search.base import Assessment, Belief, Kind, Strategy, lead_belief
from packrat_daemon.search.grid import CellKey

REMEASURE_WEIGHT = 0.5  # a re-measurement is worth less than a first look at an equally decisive cell
LEAST_CHANCE = 1e-3  # a lead never counts for nothing: the certificate needs it settled
EXPLORATION_KAPPA = 1.0  # LCB weight on a cell's σ: prefer the cells we know least


class DecisiveStrategy(Strategy):
    name = "decisive"
    fits_kernel_by_default = False

    def pick(self, assessment: Assessment) -> CellKey:
        leads = lead_belief(assessment)
        chance = np.maximum(gaussian_pi(leads.rows, leads, y_opt=0.0, xi=0.0), LEAST_CHANCE)
        value: dict[CellKey, float] = {}
        for lead, p in zip(assessment.leads, chance, strict=True):
            worth = float(p) * (REMEASURE_WEIGHT if lead.remeasure else 1.0)
            if lead.kind is Kind.UNCONFIRMED:
                worth = 1.0  # the certificate needs every plan cell measured, however likely its value
            value[lead.cell] = value.get(lead.cell, 0.0) + worth
        cells = list(value)
        # LCB of "minus the value", with the cell's σ as its spread: lowest is best.
        beliefs = Belief(np.array([-value[c] for c in cells]), np.array([assessment.doubt[c] for c in cells]))
        bound = gaussian_lcb(beliefs.rows, beliefs, kappa=EXPLORATION_KAPPA)
        return min(zip(bound, cells, strict=True), key=lambda item: (item[0], item[1]))[1]
