"""The one rule for the layout a batch runs on, and the tables the packrat policy weighs layouts with."""

from __future__ import annotations

import math

import pytest

from policies.planning.distribution import BatchDistribution
from policies.planning.layouts import LayoutTable, Split, best_one_instance, fastest, split_on, split_pays
from policies.planning.profile import Profile

# Two cores. Batch 1: one 2-thread instance (60) beats one 1-thread instance (100).
# Batch 16: two 1-thread instances of 8 (600) beat one 2-thread instance (1300).
TWO_CORES = Profile.from_latencies(
    {(1, 1): 100.0, (1, 8): 600.0, (1, 16): 1250.0, (2, 1): 60.0, (2, 8): 700.0, (2, 16): 1300.0}
)
ONES_AND_SIXTEENS = BatchDistribution.from_counts({1: 1.0, 16: 1.0})


def test_the_fastest_split_wins_and_a_tie_goes_to_fewer_busy_instances() -> None:
    assert fastest([Split(10.0, [4]), Split(8.0, [2, 2])]) == 1
    assert fastest([Split(8.0, [2, 2]), Split(8.0, [4, 0])]) == 1


def test_a_batch_stays_on_one_instance_unless_the_split_clears_the_margin() -> None:
    alone, split = Split(1000.0, [16]), Split(970.0, [8, 8])  # the split is 3% faster
    assert fastest([alone, split], min_split_gain=0.05) == 0
    assert fastest([alone, split], min_split_gain=0.02) == 1
    assert fastest([alone, split], min_split_gain=0.0) == 1


def test_a_split_is_taken_when_no_layout_runs_the_batch_on_one_instance() -> None:
    assert fastest([Split(970.0, [8, 8]), Split(990.0, [8, 4, 4])], min_split_gain=0.5) == 0


def test_the_margin_is_inclusive() -> None:
    assert split_pays(95.0, 100.0, 0.05)
    assert not split_pays(95.5, 100.0, 0.05)


def test_split_on_says_none_when_the_layout_cannot_carry_the_batch() -> None:
    assert split_on(TWO_CORES, (1, 1), 16) == Split(600.0, [8, 8])
    assert split_on(TWO_CORES, (2,), 17) is None


def test_each_batch_size_runs_on_its_fastest_layout() -> None:
    table = LayoutTable(TWO_CORES, [(2,), (1, 1), (2,)], ONES_AND_SIXTEENS)
    assert list(table.splits) == [(2,), (1, 1)]  # a layout given twice is split once
    assert table.batch_latencies() == {1: 60.0, 16: 600.0}
    assert table.batch_latencies([(2,)]) == {1: 60.0, 16: 1300.0}
    assert table.expected() == pytest.approx((60.0 + 600.0) / 2)


def test_a_batch_size_no_layout_carries_makes_the_expectation_infinite() -> None:
    table = LayoutTable(TWO_CORES, [(2,)], BatchDistribution.from_counts({1: 1.0, 32: 1.0}))
    assert not table.carries((2,))
    assert table.batch_latencies() == {1: 60.0, 32: None}
    assert table.expected() == math.inf


def test_the_best_one_instance_pool_over_a_distribution() -> None:
    # One 1-thread instance: (100 + 1250) / 2 = 675; one 2-thread instance: (60 + 1300) / 2 = 680.
    assert best_one_instance(TWO_CORES, 2, ONES_AND_SIXTEENS) == (1, pytest.approx(675.0))
    assert best_one_instance(TWO_CORES, 1, BatchDistribution.single(1)) == (1, 100.0)
    assert best_one_instance(TWO_CORES, 2, BatchDistribution.single(32)) is None
