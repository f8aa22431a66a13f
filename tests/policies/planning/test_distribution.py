"""The batch-size distribution: normalised and sorted from counts, refused when empty or below one, and the
most likely sizes a policy plans for."""

from __future__ import annotations

import dataclasses

import pytest

from packrat_daemon.wire.errors import ConfigError
from policies.planning.distribution import BatchDistribution


def test_counts_become_probabilities_sorted_by_batch() -> None:
    distribution = BatchDistribution.from_counts({16: 2, 1: 5, 8: 3})
    assert distribution.weights == ((1, 0.5), (8, 0.3), (16, 0.2))
    assert distribution.batches == [1, 8, 16] and distribution.max_batch == 16


def test_sizes_without_weight_are_dropped() -> None:
    assert BatchDistribution.from_counts({1: 0, 4: 2.0, 8: -1}).weights == ((4, 1.0),)


def test_one_batch_size_has_all_the_weight() -> None:
    assert BatchDistribution.single(32).weights == ((32, 1.0),)


@pytest.mark.parametrize("counts", [{}, {4: 0}, {4: -1.0}])
def test_a_distribution_needs_a_size_with_positive_weight(counts: dict[int, float]) -> None:
    with pytest.raises(ConfigError, match="at least one batch size with positive weight"):
        BatchDistribution.from_counts(counts)


def test_batch_sizes_below_one_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"batch sizes must be >= 1, got \[0, 4\]"):
        BatchDistribution.from_counts({4: 1, 0: 1})


def test_the_most_likely_sizes_come_back_sorted_and_a_tie_goes_to_the_larger() -> None:
    distribution = BatchDistribution.from_counts({1: 4, 2: 1, 8: 2, 16: 2})
    assert distribution.most_likely(1) == [1]
    assert distribution.most_likely(2) == [1, 16]  # 8 and 16 tie: the larger carries the smaller
    assert distribution.most_likely(3) == [1, 8, 16]
    assert distribution.most_likely(10) == [1, 2, 8, 16]


def test_a_distribution_cannot_be_changed() -> None:
    distribution = BatchDistribution.single(4)
    with pytest.raises(dataclasses.FrozenInstanceError):
        distribution.weights = ((8, 1.0),)  # type: ignore[misc]
