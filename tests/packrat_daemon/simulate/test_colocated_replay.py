"""A candidate split scored by a replay of the traffic (packrat_daemon.simulate.colocated_replay): what it
sends, what it scores, and what it costs."""

from __future__ import annotations

import pytest

from packrat_daemon.config import ServeConfig
from packrat_daemon.coordinate.strategies import Strategy
from packrat_daemon.load.arrivals import BatchMix
from packrat_daemon.measure.emulation import Interference
from packrat_daemon.simulate.colocated_replay import Replay, ReplayModel, ReplaySettings
from packrat_daemon.wire.errors import ConfigError
from policies.colocation import ModelDemand, evaluate
from policies.colocation_choice import RateHistory, shared_plan
from policies.planning.distribution import BatchDistribution
from policies.testing import amdahl_profile

PROFILE = amdahl_profile(8, (1, 2, 4, 8, 16, 32), serial_ms=0.5, parallel_ms=8.0)
CONFIG = ServeConfig(max_batch=32, adapt=False, batches=[1, 2], max_delay_ms=0.0)
MIX = BatchMix.parse("1:0.5,2:0.5")


def replay(settings: ReplaySettings | None = None) -> Replay:
    models = [ReplayModel(name, CONFIG, PROFILE, MIX) for name in "ab"]
    return Replay(models, 8, settings, Interference.named("default"))


def demands(a: float, b: float) -> list[ModelDemand]:
    """Batch rates as the coordinator reads them: inputs per second over the live mean batch (here 2)."""
    live = BatchDistribution.from_counts({2: 1.0})
    return [ModelDemand("a", PROFILE, live, a), ModelDemand("b", PROFILE, live, b)]


def test_a_split_that_cannot_carry_the_traffic_scores_worse_and_a_repeat_is_not_replayed() -> None:
    scorer = replay(ReplaySettings(horizon_s=2.0, requests=300))
    busy = demands(60.0, 5.0)  # a busy (120 inputs/s, 80 requests/s), b light
    history = RateHistory.steady(busy)
    assert scorer.request_rates(busy, history) == ((80.0, pytest.approx(6.667, abs=1e-3)),)
    starved = scorer(evaluate(busy, [1, 7]), busy, history)
    fed = scorer(evaluate(busy, [6, 2]), busy, history)
    every = scorer(shared_plan(busy, 8), busy, history)
    assert fed < starved and every < starved
    assert len(scorer.spent_s) == 3
    assert scorer(evaluate(busy, [6, 2]), busy, history) == fed  # the same split on the same rates: remembered
    assert len(scorer.spent_s) == 3 and scorer.cost_s == sum(scorer.spent_s)


def test_the_replay_is_bounded_by_its_requests_and_the_same_requests_meet_every_candidate() -> None:
    scorer = replay(ReplaySettings(horizon_s=10.0, requests=50))
    busy = demands(60.0, 60.0)
    history = RateHistory.steady(busy)
    once = scorer.replay(evaluate(busy, [4, 4]), history.bin_s, scorer.request_rates(busy, history))
    again = replay(ReplaySettings(horizon_s=10.0, requests=50)).replay(
        evaluate(busy, [4, 4]), history.bin_s, scorer.request_rates(busy, history)
    )
    assert once == again  # the requests are drawn from the settings' seed: each candidate meets the same ones
    # 160 requests per second over both models, at most 50: a replay of 50/160 s, not 10 s.
    assert scorer.replay(evaluate(busy, [4, 4]), 1.0, ((0.0, 0.0),)) == 0.0  # no traffic: nothing to wait for


def test_bursty_histories_keep_the_closed_form_score_unless_asked() -> None:
    busy = demands(30.0, 5.0)
    bursts = RateHistory(1.0, ((30.0, 5.0), (90.0, 5.0), (30.0, 5.0)))
    plan = evaluate(busy, [4, 4])
    scorer = replay()
    scorer(plan, busy, bursts)
    assert scorer.spent_s == []  # the closed-form score: no replay
    asked = replay(ReplaySettings(bursts=True, requests=200))
    assert asked(plan, busy, bursts) > 0 and len(asked.spent_s) == 1


def test_the_strategy_passes_the_scorer_to_its_choice() -> None:
    scorer = replay(ReplaySettings(horizon_s=2.0, requests=200))
    strategy = Strategy("joint", 8, score=scorer, mode_gain=0.1)
    busy = demands(60.0, 5.0)
    choice = strategy.choose(busy, [RateHistory.steady(busy)], evaluate(busy, [1, 7]), 0.1, None)
    assert scorer.spent_s and choice.move and choice.plan.share("a").cores > 1


def test_the_settings_are_checked() -> None:
    with pytest.raises(ConfigError, match="positive horizon"):
        ReplaySettings(horizon_s=0.0)
    with pytest.raises(ConfigError, match="mean or pNN"):
        ReplaySettings(statistic="median")
