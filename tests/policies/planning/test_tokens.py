"""Planning by tokens: a slice's predicted cost from its padded length, and a batch cut by cost, not count."""

from __future__ import annotations

import pytest

from packrat_daemon.wire.length_cost import FLOOR, equivalent_batch, interpolate
from policies.planning.profile import Profile
from policies.planning.tokens import cut_by_cost, split_by_cost, token_latency

ROW = [(1, 10.0), (2, 14.0), (4, 22.0), (8, 38.0)]  # a fixed cost of 6 ms and 4 ms an input, at 128 tokens


def test_a_fractional_batch_is_read_off_the_row_between_its_points_and_below_along_its_first_line() -> None:
    assert interpolate(ROW, 3.0) == pytest.approx(18.0)
    assert interpolate(ROW, 0.25) == pytest.approx(7.0)  # 10 - 4 * 0.75: a batch's fixed cost stays
    assert interpolate(ROW, 0.0) == pytest.approx(6.0)
    assert interpolate([(1, 10.0), (2, 100.0)], 0.0) == pytest.approx(FLOOR * 10.0)  # never below the floor
    assert interpolate(ROW, 9.0) is None and interpolate([], 1.0) is None


def test_sequences_padded_to_a_quarter_of_the_profile_length_cost_a_quarter_of_the_batch() -> None:
    assert equivalent_batch(4, 32, 128) == 1.0
    assert equivalent_batch(3, 0, 128) == 3.0  # no free axis: the batch itself
    profile = Profile.from_latencies({(1, b): ms for b, ms in ROW})
    assert token_latency(profile, 1, 4, 32, 128) == pytest.approx(10.0)
    assert token_latency(profile, 1, 8, 128, 128) == pytest.approx(38.0)
    assert token_latency(profile, 2, 1, 32, 128) is None  # no row for two threads


def cost(threads: int, rows: int, length: int) -> float:
    """Padded tokens over threads, and a fixed cost per slice."""
    return 1.0 + rows * length / threads


def slowest(lengths: list[int], threads: list[int], sizes: list[int]) -> float:
    order = sorted(range(len(threads)), key=lambda k: threads[k])
    start, worst = 0, 0.0
    for k in order:
        if sizes[k]:
            worst = max(worst, cost(threads[k], sizes[k], lengths[start + sizes[k] - 1]))
        start += sizes[k]
    return worst


def test_one_long_sequence_and_four_short_ones_are_not_five_samples() -> None:
    lengths = [8, 8, 8, 8, 128]  # sorted, as the dispatcher sorts a batch
    sizes = cut_by_cost(lengths, [1, 1], cost)
    assert sizes == [4, 1]  # the long one alone; by count it would be 3 and 2, the second padded to 128
    assert slowest(lengths, [1, 1], sizes) < slowest(lengths, [1, 1], [3, 2])


def test_the_longest_rows_go_to_the_instance_of_most_threads_and_every_row_is_taken() -> None:
    lengths = sorted([5, 9, 12, 12, 14, 20, 31, 64, 64, 100])
    threads = [4, 1, 2]
    sizes = cut_by_cost(lengths, threads, cost)
    assert sum(sizes) == len(lengths)
    best = min(
        slowest(lengths, threads, [c, a, b])
        for a in range(11) for b in range(11 - a) for c in [10 - a - b]
    )  # fmt: skip
    assert slowest(lengths, threads, sizes) <= best * 1.01  # the least slowest slice of every contiguous cut


def test_without_a_prediction_rows_are_cut_by_threads_and_one_instance_takes_all() -> None:
    assert cut_by_cost([1, 2, 3, 4], [2, 2], lambda t, r, n: None) == [2, 2]
    assert cut_by_cost([1, 2, 3], [4], cost) == [3]
    assert cut_by_cost([], [1, 1], cost) == [0, 0]


def test_a_cut_is_predicted_at_its_slowest_slice_and_unpredictable_costs_give_none() -> None:
    lengths = [8, 8, 8, 8, 128]
    split = split_by_cost(lengths, [1, 1], cost)
    assert split is not None and split.rows == [4, 1]
    assert split.latency_ms == pytest.approx(slowest(lengths, [1, 1], [4, 1])) and split.busy == 2
    assert split_by_cost(lengths, [1, 1], lambda t, r, n: None) is None
