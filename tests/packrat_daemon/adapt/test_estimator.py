"""The live batch-size distribution: decay, ranking, forgetting."""

from __future__ import annotations

import pytest

from packrat_daemon.adapt.estimator import BatchSizeEstimator


def test_nothing_observed_means_no_distribution() -> None:
    assert BatchSizeEstimator().distribution(now=1.0) is None


def test_recent_batch_sizes_weigh_more() -> None:
    estimator = BatchSizeEstimator(half_life_s=10.0)
    for _ in range(10):
        estimator.observe(1, now=1.0)
    for _ in range(10):
        estimator.observe(8, now=11.0)  # one half-life later: the old 1s count half
    weights = dict(estimator.distribution(now=11.0).weights)
    assert weights[8] == pytest.approx(2 / 3) and weights[1] == pytest.approx(1 / 3)
    assert estimator.observed == 20
    estimator.reset_count()
    assert estimator.observed == 0


def test_old_sizes_are_forgotten_and_only_the_top_ones_kept() -> None:
    estimator = BatchSizeEstimator(half_life_s=1.0, top=2)
    estimator.observe(3, now=1.0)
    for batch in (4, 4, 4, 5, 5, 6):
        estimator.observe(batch, now=20.0)  # 19 half-lives later, 3 has faded out
    assert estimator.distribution(now=20.0).batches == [4, 5]


def test_rates_follow_a_steady_stream_and_fade_after_it_stops() -> None:
    estimator = BatchSizeEstimator(half_life_s=10.0)
    for k in range(600):  # 5 batches of 4 inputs per second for two minutes
        estimator.observe(4, 1000.0 + k / 5)
    batches, inputs = estimator.rates(1000.0 + 599 / 5)
    assert batches == pytest.approx(5.0, rel=0.05) and inputs == pytest.approx(20.0, rel=0.05)
    assert estimator.rates(1000.0 + 599 / 5 + 10.0)[0] == pytest.approx(2.5, rel=0.05)  # one half-life later
    assert BatchSizeEstimator().rates(5.0) == (0.0, 0.0)


def test_rates_are_not_diluted_before_a_half_life_has_passed() -> None:
    estimator = BatchSizeEstimator(half_life_s=60.0)
    for k in range(50):  # 10 batches per second, for 5 s only
        estimator.observe(2, 100.0 + k / 10)
    assert estimator.rates(100.0 + 49 / 10)[0] == pytest.approx(10.0, rel=0.05)
