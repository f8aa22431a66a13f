"""Time as an input of production's learning: ages of a week or a year, clocks stepped back, numbers that are
not numbers. Nothing overflows or raises, by design (the module's docstring), not by a caught exception."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packrat_daemon.adapt.estimator import BatchSizeEstimator
from packrat_daemon.adapt.production import (
    FORGOTTEN_WEIGHT,
    MAX_AGE_S,
    MAX_WEIGHT,
    LearnedCell,
    ProductionProfile,
)

WEEK = 7 * 86400.0
ANY_FLOAT = st.floats(allow_nan=True, allow_infinity=True)


def test_a_cell_unseen_for_a_week_is_saved_and_restored_without_overflow() -> None:
    """The finding: 10-minute half-lives, a cell last seen 8 days ago (1 152 half-lives) was restored as
    weight × 2^1152, an OverflowError that left the daemon hung."""
    learner = ProductionProfile(min_weight=1)
    for k in range(50):
        learner.observe(1, 4, 10.0, now=float(k))
    learner.observe(1, 1, 2.0, now=8 * 86400.0)  # another size keeps coming; size 4 has vanished for 8 days
    exported = learner.export(now=8 * 86400.0)
    assert [c.key for c in exported] == [(1, 1)]  # forgotten: no evidence left to keep
    # As an older file would hold it: the vanished cell with its weight underflowed to a denormal.
    ancient = [*exported, LearnedCell((1, 4), 10.0, 5e-324, 8 * 86400.0)]
    again = ProductionProfile(min_weight=1)
    again.restore(ancient, now=100.0, elapsed=WEEK)
    assert [c.key for c in again.export(now=100.0)] == []  # a week more of downtime: (1, 1) is gone too
    again.observe(1, 4, 20.0, now=101.0)  # the size comes back: learned afresh, not clipped to a stale estimate
    assert again.export(now=101.0)[0].latency_ms == pytest.approx(20.0)


def test_a_restored_weight_is_taken_as_of_the_save_and_decays_from_there() -> None:
    learner = ProductionProfile(min_weight=1, half_life_s=100.0)
    learner.restore([LearnedCell((2, 8), 5.0, 8.0, 3 * 366 * 86400.0)], now=0.0, elapsed=100.0)
    (cell,) = learner.export(now=0.0)
    assert cell.weight == 4.0 and cell.age_s == MAX_AGE_S  # one half-life of downtime; the age clamped to a year
    assert learner.export(now=-1000.0)[0].weight == 8.0  # a clock gone back: no decay, and never growth


def test_a_clock_stepped_back_neither_grows_a_weight_nor_raises() -> None:
    learner = ProductionProfile(min_weight=1, half_life_s=10.0)
    learner.observe(1, 2, 3.0, now=1000.0)
    learner.observe(1, 2, 3.0, now=10.0)  # back by 990 s
    (cell,) = learner.export(now=10.0)
    assert cell.weight == 2.0 and cell.age_s == 0.0
    learner.observe(1, 2, 3.0, now=1010.0)  # forward again: one half-life since the weight's time, then a sample
    assert learner.export(now=1010.0)[0].weight == 2.0
    estimator = BatchSizeEstimator(half_life_s=10.0)
    estimator.observe(4, now=1000.0)
    estimator.observe(4, now=0.0)
    distribution = estimator.distribution(now=-5.0)
    assert distribution is not None and distribution.weights == ((4, 1.0),)
    assert estimator.rates(now=-5.0) == (0.0, 0.0)


def test_a_year_between_batches_decays_to_nothing_and_the_sizes_restart() -> None:
    estimator = BatchSizeEstimator(half_life_s=60.0)
    for k in range(20):
        estimator.observe(8, now=float(k))
    assert estimator.distribution(now=366 * 86400.0) is None  # every count faded below a hundredth
    estimator.observe(2, now=366 * 86400.0 + 1)
    distribution = estimator.distribution(now=366 * 86400.0 + 1)
    assert distribution is not None and distribution.weights == ((2, 1.0),)


@settings(max_examples=300, derandomize=True, database=None, deadline=None)
@given(
    st.lists(st.tuples(ANY_FLOAT, ANY_FLOAT, ANY_FLOAT), max_size=6),
    ANY_FLOAT,
    ANY_FLOAT,
    st.floats(min_value=-1e12, max_value=1e12),
)
def test_restoring_any_numbers_never_raises_and_keeps_weights_and_ages_in_range(
    cells: list[tuple[float, float, float]], now: float, elapsed: float, later: float
) -> None:
    learner = ProductionProfile(min_weight=1)
    learner.restore([LearnedCell((1, k + 1), ms, w, age) for k, (ms, w, age) in enumerate(cells)], now, elapsed)
    for when in (later, now):
        for cell in learner.export(when):
            assert FORGOTTEN_WEIGHT <= cell.weight <= MAX_WEIGHT and 0.0 <= cell.age_s <= MAX_AGE_S
            assert 0 < cell.latency_ms < math.inf
        learner.learned(when)
        learner.observe(1, 1, 5.0, when)
    assert isinstance(learner.samples, int)
