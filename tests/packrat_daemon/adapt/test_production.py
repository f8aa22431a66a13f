"""Production profiles: robust running estimates, decay, merging into the offline profile."""

from __future__ import annotations

import pytest

from packrat_daemon.adapt.production import ProductionProfile, revert_plan, slow_splits
from policies.base import Plan
from policies.packrat import PackratPolicy
from policies.planning.distribution import BatchDistribution
from policies.planning.profile import Cell, Profile
from policies.planning.topology import Topology


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


def test_estimates_survive_an_export_and_a_restore_with_their_weights_and_ages() -> None:
    learner = ProductionProfile(min_weight=1, half_life_s=100.0)
    for k in range(4):
        learner.observe(1, 2, 10.0, now=float(k))
    exported = learner.export(now=13.0)
    assert [(c.key, round(c.latency_ms, 6), c.age_s) for c in exported] == [((1, 2), 10.0, 10.0)]
    again = ProductionProfile(min_weight=1, half_life_s=100.0)
    again.restore(exported, now=500.0)
    assert again.export(now=500.0)[0].weight == pytest.approx(exported[0].weight)
    assert again.learned(now=500.0)[(1, 2)].latency_ms == pytest.approx(10.0)


# Two cores. Offline, two 1-thread instances of 2 inputs (5 ms) beat one 2-thread instance of 4 (6 ms).
SPLITS = Profile.from_latencies({(1, 2): 5.0, (1, 4): 9.0, (2, 2): 3.5, (2, 4): 6.0})
FOURS = BatchDistribution.single(4)


def split_plan() -> Plan:
    plan = PackratPolicy(min_split_gain=0.05).plan(SPLITS, Topology.synthetic(2), FOURS)
    assert plan.thread_counts == [1, 1]
    return plan


def test_a_split_production_timed_slower_than_one_instance_is_found() -> None:
    learner = ProductionProfile(min_weight=1)
    for k in range(5):
        learner.observe(2, 4, 6.0, now=float(k))  # served before the switch to the split: as offline
        learner.observe(1, 2, 7.0, now=float(k))  # side by side in production: slower than 6 ms alone
    learned = learner.learned(5.0)
    merged = learner.merged_into(SPLITS, 5.0)
    slow = slow_splits(split_plan(), SPLITS, merged, learned, FOURS, 2, 0.05)
    assert [(s.batch, s.split, s.alone_threads) for s in slow] == [(4, ((1, 2), (1, 2)), 2)]
    assert slow[0].split_ms == pytest.approx(7.0) and slow[0].split_ms > slow[0].alone_ms
    reverted = revert_plan(
        PackratPolicy(min_split_gain=0.05), merged, learned, FOURS, Topology.synthetic(2), 0.05, slow
    )
    assert reverted.thread_counts == [2] and reverted.reason.startswith("production timings reverted the plan")


def test_only_production_timings_revert_a_split_never_offline_guesses() -> None:
    assert slow_splits(split_plan(), SPLITS, SPLITS, {}, FOURS, 2, 0.05) == []
    slower_everywhere = ProductionProfile(min_weight=1)
    for k in range(5):
        slower_everywhere.observe(1, 2, 7.0, now=float(k))
    # Only the split timed, 40% over offline: production runs slower, and one instance would too.
    learned, merged = slower_everywhere.learned(5.0), slower_everywhere.merged_into(SPLITS, 5.0)
    assert slow_splits(split_plan(), SPLITS, merged, learned, FOURS, 2, 0.05) == []
    learner = ProductionProfile(min_weight=1)
    learner.observe(1, 2, 4.0, now=0.0)  # measured, and faster than one instance: it stays
    assert (
        slow_splits(split_plan(), SPLITS, learner.merged_into(SPLITS, 0.0), learner.learned(0.0), FOURS, 2, 0.05) == []
    )


def test_a_restored_estimate_decays_for_the_downtime_as_it_would_have_while_serving() -> None:
    learner = ProductionProfile(min_weight=1, half_life_s=100.0)
    for k in range(4):
        learner.observe(1, 2, 10.0, now=float(k))
    exported = learner.export(now=13.0)
    again = ProductionProfile(min_weight=1, half_life_s=100.0)
    again.restore(exported, now=500.0, elapsed=100.0)
    assert again.export(now=500.0)[0].weight == pytest.approx(learner.export(now=113.0)[0].weight)
    assert again.export(now=500.0)[0].age_s == pytest.approx(110.0)


def test_the_daemon_reverts_a_split_timed_slower_at_once_past_the_hysteresis_and_the_cool_down(
    caplog: pytest.LogCaptureFixture,
) -> None:
    import logging

    from packrat_daemon.adapt.online import OnlineAdaptation
    from packrat_daemon.config import ServeConfig

    # A hysteresis no prediction passes, a long cool-down and many batches: only a measurement reverts.
    config = ServeConfig(adapt_min_gain=0.9, adapt_cooldown_s=3600.0, adapt_min_batches=10**6, min_split_gain=0.05)
    adaptation = OnlineAdaptation(config, PackratPolicy(min_split_gain=0.05), SPLITS, Topology.synthetic(2))
    plan = split_plan()
    for k in range(5):
        adaptation.estimator.observe(4, now=float(k))
        adaptation.production.observe(2, 4, 6.0, now=float(k))
        adaptation.production.observe(1, 2, 7.0, now=float(k))
    with caplog.at_level(logging.WARNING, logger="packrat.daemon"):
        reverted = adaptation.propose(plan, SPLITS, now=5.0)
    assert reverted is not None and reverted.thread_counts == [2]
    assert "production timings reverted the plan: batch 4: split 1t×2 + 1t×2 measured 7.0 ms" in caplog.text


def test_a_baseline_policy_whose_splits_are_not_checked_is_served_as_it_decides() -> None:
    # The paper's estimator is a baseline: reverting its splits would only make it flap against the guard.
    from packrat_daemon.adapt.online import OnlineAdaptation
    from packrat_daemon.config import ServeConfig
    from policies.paper_estimator import PaperEstimatorPolicy

    config = ServeConfig(adapt_min_gain=0.9, adapt_cooldown_s=3600.0, adapt_min_batches=10**6, min_split_gain=0.05)
    adaptation = OnlineAdaptation(config, PaperEstimatorPolicy(), SPLITS, Topology.synthetic(2))
    for k in range(5):
        adaptation.estimator.observe(4, now=float(k))
        adaptation.production.observe(2, 4, 6.0, now=float(k))
        adaptation.production.observe(1, 2, 7.0, now=float(k))
    proposed = adaptation.propose(split_plan(), SPLITS, now=5.0)
    assert proposed is None or not proposed.reason.startswith("production timings reverted")
