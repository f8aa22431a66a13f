"""Adaptive profiling: measure only the (threads, batch) cells that decide the exact plans.

`adaptive_profile` runs the search loop (`loop`); a `Strategy` (`base`) fits the surrogate (`gp`)
and picks the next cell: `DecisiveStrategy` (the default) or `ExpectedImprovementStrategy`.
`bench/search.py` replays both on the same tables.
"""

from packrat_daemon.search.base import Strategy
from packrat_daemon.search.budget import AdaptiveResult, Budget, StepReport
from packrat_daemon.search.decisive import DecisiveStrategy
from packrat_daemon.search.expected_improvement import ExpectedImprovementStrategy
from packrat_daemon.search.grid import CellKey, Grid, fill_rows
from packrat_daemon.search.loop import Measure, adaptive_profile

STRATEGIES: dict[str, Strategy] = {s.name: s for s in (DecisiveStrategy(), ExpectedImprovementStrategy())}
DEFAULT_STRATEGY = STRATEGIES["decisive"]

__all__ = [
    "DEFAULT_STRATEGY",
    "STRATEGIES",
    "AdaptiveResult",
    "Budget",
    "CellKey",
    "DecisiveStrategy",
    "ExpectedImprovementStrategy",
    "Grid",
    "Measure",
    "StepReport",
    "Strategy",
    "adaptive_profile",
    "fill_rows",
]
