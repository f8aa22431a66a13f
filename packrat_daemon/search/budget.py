"""How much measuring an adaptive profile may do, and what it hands back."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from packrat_daemon.search.grid import CellKey
from packrat_daemon.wire.errors import ProfileError
from policies.planning.profile import Profile
from policies.solver import Solution


@dataclass(frozen=True)
class Budget:
    """A fraction of the grid's cells, or seconds of measuring."""

    fraction: float | None = None
    seconds: float | None = None

    @classmethod
    def parse(cls, text: str, flag: str = "--budget") -> Budget:
        """'0.25' → a quarter of the grid; '300s' → five minutes of measuring. `flag` names the option in errors."""
        raw = text.strip().lower()
        try:
            if raw.endswith("s"):
                seconds = float(raw[:-1])
                if seconds > 0 and math.isfinite(seconds):
                    return cls(seconds=seconds)
            else:
                fraction = float(raw)
                if 0 < fraction <= 1:
                    return cls(fraction=fraction)
        except ValueError:
            pass
        raise ProfileError(
            f"{flag} must be a fraction of the grid in (0, 1] like 0.25, or seconds like 300s; got {text!r}"
        )

    def max_cells(self, grid_size: int) -> int:
        if self.fraction is None:
            return grid_size
        return max(1, min(grid_size, math.floor(self.fraction * grid_size + 1e-9)))

    @property
    def covers_grid(self) -> bool:
        return self.fraction is not None and self.fraction >= 1


@dataclass(frozen=True)
class StepReport:
    """What the search knows after one more measurement (for progress lines)."""

    measured: int
    max_cells: int
    cell: CellKey
    latency_ms: float
    solutions: Mapping[int, Solution]


@dataclass(frozen=True)
class AdaptiveResult:
    measured: dict[CellKey, float]  # median of each measured cell, in the order first measured
    samples: dict[CellKey, int]  # how often each cell was measured (close contests are re-measured)
    profile: Profile  # every grid cell: measured ones as measured, the rest from the surrogate
    solutions: dict[int, Solution]  # target batch → the exact plan on `profile`
    stopped: str  # "confirmed" (certificate reached), "budget", or "grid" (every cell measured)
    grid_size: int

    @property
    def measurements(self) -> int:
        return sum(self.samples.values())

    @property
    def fraction(self) -> float:
        return len(self.measured) / self.grid_size

    def measured_cells(self) -> list[list[int]]:
        """[[threads, batch], ...] as plain ints, ready for JSON."""
        return [[int(t), int(b)] for t, b in self.measured]
