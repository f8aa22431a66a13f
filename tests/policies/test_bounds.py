"""What a latency bound allows: a row's allowed batches, the algebra a bound needs, the even split, the search."""

from __future__ import annotations

import pytest

from policies.bounds import BitsetAlgebra, CapAlgebra, Row, algebra_for, balanced, first_feasible, smear

# Batches 1, 2, 4, 8 at 10, 30, 20, 50 ms: noisy (4 inputs are faster than 2).
NOISY = Row(1, [(1, 10.0), (2, 30.0), (4, 20.0), (8, 50.0)])
MONOTONE = Row(2, [(1, 5.0), (4, 12.0), (8, 25.0)])


def test_lhat_is_the_smallest_profiled_batch_that_holds_the_inputs() -> None:
    assert [NOISY.lhat(b) for b in (1, 2, 3, 4, 5, 8)] == [10.0, 30.0, 20.0, 20.0, 50.0, 50.0]


def test_a_noisy_row_allows_a_union_of_intervals_and_is_no_prefix() -> None:
    assert NOISY.intervals(25.0, 8) == [(1, 1), (3, 4)]
    assert NOISY.intervals(30.0, 3) == [(1, 3)]  # merged, and clipped at the limit
    assert NOISY.prefix_cap(25.0) == (1, False)  # 4 inputs at 20 ms lie beyond the gap
    assert NOISY.prefix_cap(30.0) == (4, True)
    assert NOISY.prefix_cap(5.0) == (0, True)


def test_the_bound_picks_caps_for_monotone_rows_and_bitsets_for_gaps() -> None:
    capped = algebra_for({2: MONOTONE}, 12.0, 6)
    assert isinstance(capped, CapAlgebra) and capped.caps == {2: 4}
    exact = algebra_for({1: NOISY, 2: MONOTONE}, 25.0, 8)
    assert isinstance(exact, BitsetAlgebra)
    reachable = exact.extend(exact.empty, 1)  # one 1-thread instance: totals 1, 3 and 4
    assert [total for total in range(9) if (reachable >> total) & 1] == [1, 3, 4]
    assert exact.serves(reachable, 1, 3) and not exact.serves(reachable, 1, 2)


def test_bitset_sizes_stay_in_each_instances_allowed_set() -> None:
    exact = algebra_for({1: NOISY}, 25.0, 8)
    sizes = exact.sizes([1, 1], 7)
    assert sum(sizes) == 7 and all(size in (1, 3, 4) for size in sizes)


def test_smear_adds_every_offset_below_the_width() -> None:
    assert smear(0b1, 5) == 0b11111
    assert smear(0b101, 2) == 0b1111


@pytest.mark.parametrize(
    ("caps", "batch", "sizes"), [([4, 4, 4], 7, [3, 2, 2]), ([1, 8], 6, [1, 5]), ([2, 2], 4, [2, 2])]
)
def test_balanced_splits_as_evenly_as_the_caps_allow(caps: list[int], batch: int, sizes: list[int]) -> None:
    assert balanced(caps, batch) == sizes


def test_first_feasible_finds_the_smallest_feasible_bound() -> None:
    values = [1.0, 2.0, 3.0, 5.0, 8.0]
    assert first_feasible(values, lambda bound: bound >= 3.0) == 2
    assert first_feasible(values, lambda bound: True) == 0
    assert first_feasible(values, lambda bound: bound >= 8.0) == 4
