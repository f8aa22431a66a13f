"""The choice among splits (policies.colocation_choice): the collision model of shared cores, the burst
detector, and the choice with its hysteresis."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from packrat_daemon.wire.errors import ConfigError, ProfileError
from policies.colocation import JointPlan, ModelDemand, evaluate
from policies.colocation_choice import (
    RateHistory,
    Sharing,
    bursty,
    choose,
    collide,
    collisions,
    predicted_delay,
    proportional_split,
    shared_plan,
)
from policies.planning.distribution import BatchDistribution
from policies.testing import amdahl_profile

PROFILE = amdahl_profile(8, (1, 2, 4), serial_ms=1.0, parallel_ms=8.0)


def demand(name: str, rate: float) -> ModelDemand:
    return ModelDemand(name, PROFILE, BatchDistribution.single(1), rate)


def test_shared_cores_slow_a_model_only_while_the_others_run_beside_it() -> None:
    alone = [evaluate([demand(n, 10.0)], [8]).shares[0] for n in "ab"]
    machine = Sharing(8)
    assert collisions(alone, [0.0, 0.0], machine) == [1.0, 1.0]  # nobody else busy: its own plan's time
    both = collisions(alone, [1.0, 1.0], machine)
    expected = max(1.0, (alone[0].busy_threads + alone[1].busy_threads) / 8)
    assert both[0] == pytest.approx(expected) and both[0] > 1.0
    half = collisions(alone, [0.5, 0.5], machine)[0]
    assert 1.0 < half < both[0]
    # Interference: on disjoint halves a busy neighbour slows a model by f(8)/f(4), and only that.
    halves = evaluate([demand("a", 10.0), demand("b", 10.0)], [4, 4]).shares
    noisy = Sharing(8, 1.157)
    assert collisions(halves, [1.0, 1.0], noisy)[0] == pytest.approx(
        noisy.factor(halves[0].busy_threads + halves[1].busy_threads) / noisy.factor(halves[0].busy_threads)
    )
    plan = shared_plan([demand("a", 50.0), demand("b", 50.0)], 8)
    assert plan.shared and plan.split == (8, 8)
    assert all(share.busy_fraction > 50.0 / 1000.0 * share.service_ms for share in plan.shares)


def test_bursts_that_fall_back_are_told_from_a_shift_that_stays() -> None:
    assert bursty([10, 10, 40, 40, 10, 10, 10, 10, 40, 10, 10])
    assert not bursty([10, 10, 10, 10, 40, 40, 40, 40, 40, 40])  # a shift: it stays up
    assert not bursty([10, 12, 9, 11, 10, 13, 8, 10])  # Poisson noise
    assert collide([[10, 40, 10, 10, 10], [10, 10, 10, 40, 10]]) == 0.0
    assert collide([[10, 40, 10, 10, 10], [10, 40, 10, 10, 10]]) == 1.0


def test_with_one_model_at_rest_every_model_on_all_cores_is_chosen_and_then_held() -> None:
    demands = [demand("a", 0.0), demand("b", 150.0)]
    current = evaluate(demands, [4, 4])
    histories = [RateHistory.steady(demands)]
    choice = choose(demands, 8, histories, current, 0.1)
    assert choice.mode == "every" and choice.move and choice.plan.shared
    again = choose(demands, 8, histories, choice.plan, 0.1)
    assert again.mode == "every" and not again.move  # served already: no move
    assert "every model on all cores" in again.describe() and again.to_json()["mode"] == "every"


def test_a_move_must_pay_on_every_history_and_bursts_that_rarely_meet_are_served_on_all_cores() -> None:
    demands = [demand("a", 120.0), demand("b", 120.0)]
    current = evaluate(demands, [4, 4])
    steady = RateHistory.steady(demands)
    best = choose(demands, 8, [steady], current, 0.0)
    assert predicted_delay(best.plan, steady) <= predicted_delay(current, steady)
    held = choose(demands, 8, [steady], current, 0.99)  # no candidate gains 99%: the split served stays
    assert not held.move and held.plan.split == (4, 4)
    # Bursts that rarely meet: every model on all the cores, each burst on the whole machine, even where the
    # mean rates alone favour a split (the fluid reading of steady rates does not see that the bursts alternate).
    burst = choose(demands, 8, [steady], current, 0.1, collisions=0.0)
    assert burst.mode == "every" and burst.move and burst.bursty
    assert dict(burst.scores)["every"] > dict(burst.scores)["joint"]
    met = choose(demands, 8, [steady], current, 0.1, collisions=0.5)  # bursts that meet: judged as steady
    assert met.mode != "every" and met.bursty


def test_errors_say_what_to_do() -> None:
    with pytest.raises(ProfileError, match="at least one rate history"):
        choose([demand("a", 1.0)], 8, [], evaluate([demand("a", 1.0)], [8]), 0.1)
    with pytest.raises(ProfileError, match="full-load slow-down"):
        Sharing(8, 0.5)
    with pytest.raises(ProfileError, match="stretch"):
        RateHistory(0.0, ((1.0,),))
    with pytest.raises(ConfigError, match="the machine has 2"):
        proportional_split([1.0, 1.0, 1.0], 2)


def test_a_scorer_passed_in_replaces_the_closed_form_score() -> None:
    demands = [demand("a", 120.0), demand("b", 120.0)]
    current = shared_plan(demands, 8)
    steady = RateHistory.steady(demands)
    asked: list[tuple[tuple[int, ...], bool]] = []

    def score(plan: JointPlan, given: Sequence[ModelDemand], history: RateHistory) -> float:
        assert tuple(given) == tuple(demands) and history is steady
        asked.append((plan.split, plan.shared))
        return 1.0 if plan.split == (4, 4) and not plan.shared else 10.0  # only the even split is good

    choice = choose(demands, 8, [steady], current, 0.1, score=score)
    assert choice.mode in ("even", "proportional") and choice.plan.split == (4, 4) and choice.move
    assert dict(choice.scores)["every"] == 10.0 and ((8, 8), True) in asked
    # A move between every model on all cores and a split asks mode_gain: 90% here is more than it gains.
    held = choose(demands, 8, [steady], current, 0.1, score=lambda p, d, h: 1.0 if p.split == (4, 4) else 5.0,
                  mode_gain=0.9)  # fmt: skip
    assert not held.move and held.mode == "every"
    # Bursts that rarely meet are served on all the cores by rule, unless the scorer is asked to judge them.
    even_best = choose(demands, 8, [steady], current, 0.1, collisions=0.0, score=score)
    assert even_best.mode == "every" and not even_best.move
    judged = choose(demands, 8, [steady], current, 0.1, collisions=0.0, score=score, judge_bursts=True)
    assert judged.plan.split == (4, 4) and judged.move and judged.bursty
