"""The cost of a padded sequence, the one rule the planner (`policies.planning.tokens`) and the emulated workers
(`workers.runtimes.emulated`) share: it sits at the bottom layer so that both may read it.

Latency follows padded tokens as it follows the batch: `rows` sequences padded to `length` cost what a batch of
`rows · length / reference` costs at the profile's length `reference`, read off a profile row of (batch, ms)
points by linear interpolation, and below its smallest batch along the line through its first two (a batch's fixed
cost stays: at least FLOOR of the first). `bench/lengths.py` measures how far it holds on this machine's BERT.
"""

from __future__ import annotations

from collections.abc import Sequence

FLOOR = 0.1  # a slice costs at least this share of the profile's smallest batch: its fixed cost per batch


def equivalent_batch(rows: int, length: int, reference: int) -> float:
    """The batch at the profile's length that costs what `rows` sequences padded to `length` cost."""
    return rows * length / reference if reference > 0 and length > 0 else float(rows)


def interpolate(row: Sequence[tuple[int, float]], batch: float) -> float | None:
    """The latency of a (fractional) batch on a profile row of (batch, ms) pairs sorted by batch, linear between
    its points and below the first along the line through the first two; None past the last (or an empty row)."""
    if not row:
        return None
    first_batch, first_ms = row[0]
    if batch <= first_batch:
        if len(row) == 1:
            return max(FLOOR * first_ms, first_ms * batch / first_batch)
        second_batch, second_ms = row[1]
        slope = (second_ms - first_ms) / (second_batch - first_batch)
        return max(FLOOR * first_ms, first_ms - slope * (first_batch - batch))
    for (low, low_ms), (high, high_ms) in zip(row, row[1:], strict=False):
        if batch <= high:
            return low_ms + (high_ms - low_ms) * (batch - low) / (high - low)
    return None
