"""The batch-size distribution a pool is chosen for."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from packrat_daemon.wire.errors import ConfigError


@dataclass(frozen=True)
class BatchDistribution:
    """Probability of each batch size, normalised; frozen so a policy can only read it."""

    weights: tuple[tuple[int, float], ...]  # (batch, probability), sorted by batch

    @classmethod
    def single(cls, batch: int) -> BatchDistribution:
        return cls.from_counts({batch: 1.0})

    @classmethod
    def from_counts(cls, counts: Mapping[int, float]) -> BatchDistribution:
        items = [(int(b), float(w)) for b, w in counts.items() if w > 0]
        if not items:
            raise ConfigError("a batch distribution needs at least one batch size with positive weight")
        if any(b < 1 for b, _ in items):
            raise ConfigError(f"batch sizes must be >= 1, got {sorted(b for b, _ in items)}")
        total = sum(w for _, w in items)
        return cls(tuple(sorted((b, w / total) for b, w in items)))

    @property
    def batches(self) -> list[int]:
        return [b for b, _ in self.weights]

    @property
    def max_batch(self) -> int:
        return self.weights[-1][0]

    def most_likely(self, count: int) -> list[int]:
        ranked = sorted(self.weights, key=lambda item: (-item[1], -item[0]))
        return sorted(b for b, _ in ranked[:count])
