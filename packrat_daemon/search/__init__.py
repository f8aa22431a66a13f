"""Adaptive profiling: measure only the (threads, batch) cells that decide the exact plans.

`adaptive_profile` runs the search loop (`loop`); a `Strategy` (`base`) fits the surrogate (`gp`)
and picks the next cell: `DecisiveStrategy` (the default) or `ExpectedImprovementStrategy`.
`start_profile` is the daemon's start-up measurement on top of it. `bench/search.py` replays both
strategies on the same tables.

The names are imported on first use: the strategies and the surrogate import scikit-optimize (most of a
second), which the daemon needs only when it measures, and `grid` and `budget` are read without it.
"""

from __future__ import annotations

import importlib
from typing import Any

_HOMES = {
    "Strategy": "base",
    "AdaptiveResult": "budget",
    "Budget": "budget",
    "StepReport": "budget",
    "DecisiveStrategy": "decisive",
    "ExpectedImprovementStrategy": "expected_improvement",
    "CellKey": "grid",
    "Grid": "grid",
    "fill_rows": "grid",
    "Measure": "loop",
    "adaptive_profile": "loop",
}

__all__ = ["DEFAULT_STRATEGY", "STRATEGIES", *_HOMES]


def __getattr__(name: str) -> Any:
    if name in ("STRATEGIES", "DEFAULT_STRATEGY"):
        from packrat_daemon.search.decisive import DecisiveStrategy
        from packrat_daemon.search.expected_improvement import ExpectedImprovementStrategy

        strategies = {s.name: s for s in (DecisiveStrategy(), ExpectedImprovementStrategy())}
        globals().update(STRATEGIES=strategies, DEFAULT_STRATEGY=strategies["decisive"])
        return globals()[name]
    if name in _HOMES:
        value = getattr(importlib.import_module(f"packrat_daemon.search.{_HOMES[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
