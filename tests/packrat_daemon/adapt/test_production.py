"""Production profiles: robust running estimates, decay, merging into the offline profile."""

from __future__ import annotations

import pytest

from packrat_daemon.adapt.production import ProductionProfile
from policies.planning.profile import Cell, Profile


def test_a_cell_counts_only_with_enough_recent_evidence() -> None:
    learner = ProductionProfile(min_weight=3)
    learner.observe(1, 4, 10.0, now=0.0)
    learner.observe(1, 4, 10.0, now=0.1)
    assert learner.learned(now=0.1) == {}
    learner.observe(1, 4, 10.0, now=0.2)
    assert learner.learned(now=0.2)[(1, 4)].latency_ms == pytest.approx(10.0)


def test_one_stalled_call_cannot_drag_the_estimate() -> None:
    learner = ProductionProfile(smoothing=0.1, min_weight=1)
    for k in range(20):
        learner.observe(2, 8, 20.0, now=k)
    learner.observe(2, 8, 5000.0, now=21)  # a stall: clipped to twice the estimate first
    assert learner.learned(now=21)[(2, 8)].latency_ms == pytest.approx(20.0 * 2**0.1, rel=1e-6)


def test_stale_cells_fade_back_to_the_offline_measurement() -> None:
    learner = ProductionProfile(half_life_s=10.0, min_weight=3)
    for k in range(8):
        learner.observe(1, 4, 30.0, now=k * 0.01)
        learner.observe(2, 4, 10.0, now=k * 0.01)
        learner.observe(2, 8, 18.0, now=k * 0.01)
    base = Profile({(1, 4): Cell(20.0, samples=8), (2, 4): Cell(10.0, samples=8), (2, 8): Cell(18.0, samples=8)})
    assert learner.conditions_factor(base, now=0.1) == pytest.approx(1.0)  # the median cell agrees
    fresh = learner.merged_into(base, now=0.1)
    assert fresh.latency(1, 4) == pytest.approx(25.0, rel=0.01)  # 8 offline samples, 8 production ones
    assert learner.merged_into(base, now=100.0).latency(1, 4) == 20.0  # ten half-lives later: forgotten


def test_offline_cells_are_rescaled_to_the_conditions_production_runs_in() -> None:
    learner = ProductionProfile(min_weight=1)
    for k in range(5):
        learner.observe(2, 4, 110.0, now=k)
        learner.observe(2, 8, 220.0, now=k)
    base = Profile({(2, 4): Cell(100.0, 3), (2, 8): Cell(200.0, 3), (1, 2): Cell(90.0, 3, p90_ms=95.0)})
    assert learner.conditions_factor(base, now=5) == pytest.approx(1.1)
    merged = learner.merged_into(base, now=5)
    assert merged.latency(1, 2) == pytest.approx(99.0)  # known only offline: 10% slower, as the rest
    assert merged.cell(1, 2).p90_ms == pytest.approx(104.5)
    assert merged.latency(2, 4) == pytest.approx(110.0)


def test_a_layout_known_only_offline_does_not_look_faster_for_being_measured_on_a_quiet_machine() -> None:
    # Offline, two 1-thread instances with 2 inputs each are 3% faster than one 2-thread instance with 4;
    # production, busier, times the 2-thread instance 8% slower than offline.
    base = Profile({(2, 4): Cell(100.0, 3), (1, 2): Cell(97.0, 3)})
    learner = ProductionProfile(min_weight=1)
    for k in range(5):
        learner.observe(2, 4, 108.0, now=k)
    merged = learner.merged_into(base, now=5)
    assert merged.latency(1, 2) / merged.latency(2, 4) == pytest.approx(0.97)  # still 3%, not 10%


def test_the_factor_is_one_without_common_cells_and_clipped_to_a_factor_of_two() -> None:
    learner = ProductionProfile(min_weight=1)
    learner.observe(1, 3, 12.0, now=0.0)
    assert learner.conditions_factor(Profile({(1, 4): Cell(20.0)}), now=0.0) == 1.0
    assert learner.conditions_factor(None, now=0.0) == 1.0
    learner.observe(1, 4, 100.0, now=0.0)
    assert learner.conditions_factor(Profile({(1, 4): Cell(20.0)}), now=0.0) == 2.0


def test_new_batch_sizes_from_production_join_the_table() -> None:
    learner = ProductionProfile(min_weight=1)
    learner.observe(1, 3, 12.0, now=0.0)
    merged = learner.merged_into(Profile({(1, 4): Cell(20.0)}), now=0.0)
    assert sorted(merged) == [(1, 3), (1, 4)] and merged.lhat(1, 2) == pytest.approx(12.0)
