"""The expected-improvement strategy: textbook Bayesian optimisation on the leads.

The surrogate's kernel is fitted by maximum marginal likelihood (amplitude and one length scale per
axis). Unconfirmed plan cells come first, least known first: the certificate needs them and a plan's
latency is a guess until they are measured. After that, each cell is worth the expected improvement
(skopt's EI) summed over its leads: how far, in log latency, measuring it is expected to move a plan
past its bound. A re-measured cell's σ is its noise, so contests between measured plans weigh less
on their own, without a hand-set weight.
"""

from __future__ import annotations

from skopt.acquisition import gaussian_ei

from packrat_daemon.search.base import Assessment, Kind, Strategy, lead_belief
from packrat_daemon.search.grid import CellKey


class ExpectedImprovementStrategy(Strategy):
    name = "expected-improvement"
    fits_kernel_by_default = True

    def pick(self, assessment: Assessment) -> CellKey:
        unconfirmed = [lead.cell for lead in assessment.leads if lead.kind is Kind.UNCONFIRMED]
        if unconfirmed:
            return max(unconfirmed, key=lambda c: (assessment.doubt[c], -c[0], -c[1]))
        leads = lead_belief(assessment)
        improvement = gaussian_ei(leads.rows, leads, y_opt=0.0, xi=0.0)
        value: dict[CellKey, float] = {}
        for lead, gain in zip(assessment.leads, improvement, strict=True):
            value[lead.cell] = value.get(lead.cell, 0.0) + float(gain)
        return max(value, key=lambda c: (value[c], -c[0], -c[1]))
