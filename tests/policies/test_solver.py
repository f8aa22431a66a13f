"""The exact solver against a brute-force enumerator, plus hand-checked cases."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from packrat_daemon.wire.errors import InfeasibleError
from policies.planning.profile import Profile
from policies.solver import Solver, solve
from tests.helpers.profile_tables import tables


def brute_force(profile: Profile, cores: int, batch: int) -> tuple[float, int, int] | None:
    """Best (latency, instances, threads) over every multiset of instances; None if infeasible."""
    options = [
        (t, b, profile.lhat(t, b))
        for t in profile.threads()
        if t <= cores
        for b in range(1, min(batch, profile.max_batch(t)) + 1)
    ]
    best: tuple[float, int, int] | None = None

    def walk(start: int, threads_left: int, inputs_left: int, worst: float, count: int, used: int) -> None:
        nonlocal best
        if inputs_left == 0:
            key = (worst, count, used)
            if best is None or key < best:
                best = key
            return
        for k in range(start, len(options)):
            t, b, lat = options[k]
            if t <= threads_left and b <= inputs_left:
                walk(k, threads_left - t, inputs_left - b, max(worst, lat), count + 1, used + t)

    walk(0, cores, batch, 0.0, 0, 0)
    return best


def check_solution(profile: Profile, cores: int, batch: int) -> None:
    expected = brute_force(profile, cores, batch)
    if expected is None:
        with pytest.raises(InfeasibleError) as info:
            solve(profile, cores, batch)
        assert info.value.largest_servable_batch < batch
        return
    solution = solve(profile, cores, batch)
    assert sum(b for _, b in solution.instances) == batch
    threads_used = sum(t for t, _ in solution.instances)
    assert threads_used <= cores
    assert all(b >= 1 for _, b in solution.instances)
    latency = max(profile.lhat(t, b) for t, b in solution.instances)
    assert latency == solution.latency_ms
    assert (latency, len(solution.instances), threads_used) == expected


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(profile=tables(), cores=st.integers(1, 5), batch=st.integers(1, 10))
def test_solver_matches_brute_force(profile: Profile, cores: int, batch: int) -> None:
    check_solution(profile, cores, batch)


def amdahl(threads: int, batch: int, serial: float = 0.1, per_input: float = 10.0, fixed: float = 2.0) -> float:
    return fixed + per_input * batch * (serial + (1 - serial) / threads)


def test_hand_checked_two_cores_prefers_two_single_thread_instances() -> None:
    # 1 thread: 4 inputs take 40 ms; 2 threads: 4 inputs take 30 ms, 2 inputs take 16 ms.
    profile = Profile.from_latencies({(1, 2): 20.0, (1, 4): 40.0, (2, 2): 16.0, (2, 4): 30.0})
    solution = solve(profile, cores=2, batch=4)
    assert solution.latency_ms == 20.0
    assert solution.instances == ((1, 2), (1, 2))


def test_idle_cores_allowed_when_more_threads_are_slower() -> None:
    # Four threads are slower than three here (contention): the optimum leaves a core idle.
    profile = Profile.from_latencies({(3, 1): 10.0, (4, 1): 12.0, (1, 1): 25.0})
    solution = solve(profile, cores=4, batch=1)
    assert solution.instances == ((3, 1),)
    assert solution.latency_ms == 10.0


def test_sparse_batch_uses_next_profiled_batch() -> None:
    profile = Profile.from_latencies({(1, 8): 80.0, (1, 1): 10.0})
    solution = solve(profile, cores=1, batch=3)
    assert solution.latency_ms == 80.0 and solution.instances == ((1, 3),)


def test_ties_prefer_fewer_instances_then_fewer_threads() -> None:
    profile = Profile.from_latencies({(1, 1): 10.0, (1, 2): 10.0, (2, 2): 10.0})
    solution = solve(profile, cores=4, batch=2)
    assert solution.instances == ((1, 2),)


def test_infeasible_batch_names_largest_servable() -> None:
    profile = Profile.from_latencies({(1, 4): 10.0, (2, 8): 12.0})
    with pytest.raises(InfeasibleError, match="at most 12") as info:
        solve(profile, cores=3, batch=13)
    assert info.value.largest_servable_batch == 12


def test_no_row_within_cores_is_a_clear_error() -> None:
    with pytest.raises(InfeasibleError, match="no row for 2 or fewer threads"):
        Solver(Profile.from_latencies({(4, 1): 1.0}), cores=2)


def test_amdahl_table_at_scale_splits_across_many_instances() -> None:
    batches = [1, 2, 4, 8, 16, 32, 64]
    profile = Profile.from_latencies({(t, b): amdahl(t, b) for t in range(1, 17) for b in batches})
    solution = solve(profile, cores=16, batch=64)
    # With a 10% serial fraction, sixteen 1-thread instances of 4 inputs beat one 16-thread instance.
    assert solution.latency_ms < amdahl(16, 64)
    assert len(solution.instances) > 1
    assert sum(b for _, b in solution.instances) == 64
    assert math.isclose(solution.latency_ms, max(profile.lhat(t, b) for t, b in solution.instances))
