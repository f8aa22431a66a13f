"""The live batch-size distribution: decay, ranking, forgetting."""

from __future__ import annotations

import random

import pytest

from packrat_daemon.adapt.estimator import RECENT, SHIFT_SHARE, BatchSizeEstimator


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


def test_a_change_of_the_batch_sizes_restarts_the_counts_from_the_recent_batches() -> None:
    estimator = BatchSizeEstimator(half_life_s=60.0)
    now = 0.0
    for _ in range(1200):  # a minute of batches of 1 at 20/s
        now += 0.05
        estimator.observe(1, now)
    assert dict(estimator.distribution(now).weights) == {1: 1.0}
    for k in range(RECENT):  # then batches of 32 at 3/s: a decayed minute would still weigh them ~5%
        now += 1 / 3
        estimator.observe(32, now)
        if k < RECENT * SHIFT_SHARE - 1:
            assert dict(estimator.distribution(now).weights)[32] < 0.2
    assert dict(estimator.distribution(now).weights) == {32: 1.0} and estimator.restarts == 1
    assert estimator.rates(now)[0] > 10  # the rates are not restarted: they are what the window saw
    for _ in range(300):  # the new traffic goes on: it is not new any more, nothing restarts again
        now += 1 / 3
        estimator.observe(32, now)
        estimator.distribution(now)
    assert estimator.restarts == 1


def test_steady_traffic_with_a_rare_size_never_restarts() -> None:
    rng = random.Random(3)
    estimator = BatchSizeEstimator(half_life_s=60.0)
    now = 0.0
    for _ in range(50_000):  # Poisson arrivals, batches of 1 (90%) or 32 (10%), looked at every 5 s
        now += rng.expovariate(10.0)
        estimator.observe(32 if rng.random() < 0.1 else 1, now)
        if int(now) % 5 == 0:
            estimator.distribution(now)
    assert estimator.restarts == 0
    assert dict(estimator.distribution(now).weights)[32] == pytest.approx(0.1, abs=0.03)


def test_a_move_to_a_busier_traffic_is_caught_between_two_looks() -> None:
    # At 20 batches/s the new size holds a tenth of the counts within a second: the move is judged as the
    # batches come, not at the next look five seconds later, when the last 16 batches are no longer new.
    estimator = BatchSizeEstimator(half_life_s=60.0)
    now = 0.0
    for _ in range(180):  # a minute of batches of 32 at 3/s
        now += 1 / 3
        estimator.observe(32, now)
    estimator.distribution(now)
    for _ in range(100):  # five seconds of batches of 1 at 20/s, then a look
        now += 0.05
        estimator.observe(1, now)
    assert estimator.restarts == 1 and dict(estimator.distribution(now).weights) == {1: 1.0}


def test_the_traffic_has_lasted_since_its_first_batch_or_since_it_last_moved() -> None:
    estimator = BatchSizeEstimator()
    assert estimator.lasted_s(10.0) == 0.0
    for k in range(200):
        estimator.observe(1, 10.0 + k * 0.05)
    assert estimator.lasted_s(20.0) == pytest.approx(10.0)
    for k in range(16):  # batches of 8 from 20 s: the counts restart, and so does the traffic's age
        estimator.observe(8, 20.0 + k * 0.05)
    assert estimator.restarts == 1
    assert 0.0 < estimator.lasted_s(22.0) < 2.0
