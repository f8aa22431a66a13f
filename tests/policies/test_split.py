"""The exact per-batch split against brute force over every split of a batch across a small pool."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packrat_daemon.wire.errors import InfeasibleError, ProfileError
from policies.planning.profile import Profile
from policies.split import split_batch
from tests.helpers.profile_tables import tables


def brute_force_split(profile: Profile, pool: list[int], batch: int) -> tuple[float, int, int] | None:
    ranges = [range(0, profile.max_batch(t) + 1) for t in pool]
    best = None
    for sizes in itertools.product(*ranges):
        if sum(sizes) != batch:
            continue
        busy = [(t, b) for t, b in zip(pool, sizes, strict=True) if b]
        key = (max(profile.lhat(t, b) for t, b in busy), len(busy), sum(t for t, _ in busy))
        if best is None or key < best:
            best = key
    return best


@settings(max_examples=200, deadline=None)
@given(
    profile=tables(),
    pool=st.lists(st.integers(1, 4), min_size=1, max_size=4),
    batch=st.integers(1, 12),
)
def test_split_matches_brute_force(profile: Profile, pool: list[int], batch: int) -> None:
    expected = brute_force_split(profile, pool, batch)
    if expected is None:
        with pytest.raises(InfeasibleError):
            split_batch(profile, pool, batch)
        return
    latency, sizes = split_batch(profile, pool, batch)
    assert sum(sizes) == batch and len(sizes) == len(pool)
    busy = [(t, b) for t, b in zip(pool, sizes, strict=True) if b]
    assert all(b <= profile.max_batch(t) for t, b in busy)
    actual = max(profile.lhat(t, b) for t, b in busy)
    assert actual == latency
    assert (actual, len(busy), sum(t for t, _ in busy)) == expected


@settings(max_examples=200, deadline=None)
@given(
    profile=tables(),
    pool=st.lists(st.integers(1, 4), min_size=1, max_size=6),
    batch=st.integers(1, 12),
)
def test_split_keeps_the_earliest_of_interchangeable_instances_busy(profile: Profile, pool: list[int], batch: int):
    # Ties go to earlier instances in pool order: of the instances with one thread count, those busy come first.
    try:
        _, sizes = split_batch(profile, pool, batch)
    except InfeasibleError:
        return
    for threads in set(pool):
        busy = [sizes[k] > 0 for k, t in enumerate(pool) if t == threads]
        assert busy == sorted(busy, reverse=True)


def test_split_leaves_slow_instance_idle_and_balances() -> None:
    profile = Profile.from_latencies({(1, 1): 10.0, (1, 2): 20.0, (1, 4): 40.0, (2, 4): 15.0, (2, 8): 44.0})
    latency, sizes = split_batch(profile, [2, 1, 1], 4)
    assert latency == 15.0 and sizes == [4, 0, 0]
    latency, sizes = split_batch(profile, [2, 1, 1], 6)
    assert latency == 15.0 and sizes == [4, 1, 1]
    latency, sizes = split_batch(profile, [1, 1], 3)
    assert latency == 20.0 and sorted(sizes) == [1, 2]


def test_a_single_member_takes_the_whole_batch_and_unprofiled_members_stay_idle() -> None:
    profile = Profile.from_latencies({(1, 1): 10.0, (1, 4): 30.0})
    assert split_batch(profile, [3, 1, 3], 3) == (30.0, [0, 3, 0])


def test_an_empty_batch_is_refused() -> None:
    with pytest.raises(ProfileError, match="batch must be >= 1"):
        split_batch(Profile.from_latencies({(1, 1): 10.0}), [1], 0)


def test_a_batch_too_large_for_the_pool_names_what_it_can_carry() -> None:
    with pytest.raises(InfeasibleError, match="can carry at most 2 inputs") as info:
        split_batch(Profile.from_latencies({(1, 1): 10.0}), [1, 1], 3)
    assert info.value.largest_servable_batch == 2
