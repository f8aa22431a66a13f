"""The coordinator's demand estimate and move rule: rates from cumulative readings, the backlog that moves at
once, a clump that does not, and the slow rule that does not move back on the phase before."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from packrat_daemon.coordinate import choosing
from packrat_daemon.coordinate.readings import Reading, WatchSettings
from packrat_daemon.coordinate.watch import Watch
from packrat_daemon.wire.errors import ConfigError
from policies.colocation import JointPlan, ModelDemand, evaluate, plan_jointly
from policies.colocation_choice import Choice
from policies.planning.distribution import BatchDistribution
from policies.testing import amdahl_profile

# One input in 2.5 + 8/t ms: 4 cores carry 222 a second, 6 carry 261.
PROFILE = amdahl_profile(8, (1, 2, 4, 8), serial_ms=0.5, parallel_ms=8.0)
BASES = [ModelDemand(name, PROFILE, BatchDistribution.single(1), 0.0) for name in ("a", "b")]
LOOK_S = 0.5


class Run:
    """Two models on 8 cores, read every LOOK_S: each at its rate (inputs per second), with its queue."""

    def __init__(self, settings: WatchSettings | None = None) -> None:
        self.watch = Watch(["a", "b"], settings or WatchSettings())
        self.now = 0.0
        self.arrived = {"a": 0.0, "b": 0.0}
        self.split: tuple[int, ...] = (4, 4)
        self.watch.read("a", Reading(0.0, 0, 0))
        self.watch.read("b", Reading(0.0, 0, 0))

    def look(self, rates: dict[str, float], queued: dict[str, int] | None = None) -> str:
        """One look after LOOK_S more of traffic at `rates`: the rule it applied; a move is made."""
        self.now += LOOK_S
        for name, rate in rates.items():
            self.arrived[name] += rate * LOOK_S
            self.watch.read(name, Reading(self.now, round(self.arrived[name]), (queued or {}).get(name, 0)))
        decision = self.watch.decide(self.now, BASES, self.propose, self.rescore)
        if decision.move:
            assert decision.proposed is not None
            self.split = decision.proposed.split
            self.watch.moved(self.now, decision)
        return decision.rule

    def propose(self, demands: Sequence[ModelDemand]) -> JointPlan:
        return plan_jointly(demands, 8)

    def rescore(self, demands: Sequence[ModelDemand]) -> JointPlan:
        return evaluate(demands, self.split, total_cores=8)


def test_the_rate_is_the_inputs_counted_between_two_readings_over_the_window() -> None:
    watch = Watch(["a"], WatchSettings())
    for k in range(11):  # 100 inputs a second, then 300 over the last second
        watch.read("a", Reading(k * 0.5, 50 * k if k <= 8 else 400 + 150 * (k - 8), 0))
    assert watch.inputs_per_s("a", 5.0, 3.0) == pytest.approx((700 - 200) / 3.0)
    assert watch.inputs_per_s("a", 5.0, 1.0) == pytest.approx(300.0)
    watch.read("a", Reading(5.5, 10, 0))  # its daemon restarted: its count starts again
    assert watch.inputs_per_s("a", 5.5, 3.0) == 0.0


def test_steady_traffic_never_moves_and_a_single_clump_in_the_queue_does_not_either() -> None:
    run = Run()
    rules = [run.look({"a": 100.0, "b": 100.0}) for _ in range(20)]
    assert rules.count("gain") + rules.count("backlog") <= 1  # at most the first plan, from the even split
    split = run.split
    # A queue alone, with no rise in the rate and a share that carries it, is a clump: it is taken next batch.
    rules = [run.look({"a": 100.0, "b": 100.0}, {"a": 30} if k == 5 else None) for k in range(20)]
    assert "backlog" not in rules and "gain" not in rules and run.split == split


def test_a_backlog_moves_at_once_to_the_split_for_the_last_seconds_rates_and_the_slow_rule_keeps_it() -> None:
    run = Run()
    for _ in range(20):
        run.look({"a": 100.0, "b": 100.0})
    assert run.split == (4, 4)
    rules = []
    for k in range(4):  # a turns busy, past what its 4 cores carry: its queue grows past its batches' arrivals
        rules.append(run.look({"a": 240.0, "b": 100.0}, {"a": 20 * (k + 1)}))
    # Once the last second's rate has risen (far past 2σ) past what its 4 cores carry, with its queue long:
    # moved at once, to more cores.
    assert rules[0] in ("steady", "hold") and rules[1] == "backlog"
    assert run.split[0] > 4
    moved = run.split
    # The slow rule reads the rates since the change point, not the phase before, so it keeps the split.
    later = [run.look({"a": 240.0, "b": 100.0}) for _ in range(12)]
    assert "backlog" not in later and "gain" not in later and run.split == moved


def steady_run(settings: WatchSettings | None = None) -> Run:
    run = Run(settings)
    for _ in range(20):
        run.look({"a": 100.0, "b": 100.0})
    assert run.split == (4, 4)
    return run


def test_a_clump_the_other_model_does_not_mirror_waits_a_look_and_a_shift_between_them_moves_at_once() -> None:
    # Half a second of a at 400 a second: its last second (250) is past what its 4 cores carry (222), far above
    # its rate before (6.5σ), with 40 inputs queued: all three tests of the fast rule pass at that look.
    clump = ({"a": 400.0, "b": 100.0}, {"a": 40})
    unasked = steady_run(WatchSettings(fall_z=0.0))
    assert unasked.look(*clump) == "backlog"
    # b's requests did not fall: one look is not enough, and the clump is over by the next.
    run = steady_run()
    assert run.look(*clump) != "backlog"
    after = [run.look({"a": 100.0, "b": 100.0}) for _ in range(12)]
    assert "backlog" not in after and "gain" not in after and run.split == (4, 4)
    # The same rise while b's requests fall (60 in the last second against 100: 3.5σ) is a shift: at once.
    shifted = steady_run()
    assert shifted.look({"a": 400.0, "b": 20.0}, {"a": 40}) == "backlog" and shifted.split[0] > 4
    # A rise that lasts, with b's traffic unchanged, moves at the second look.
    lasting = steady_run()
    assert lasting.look(*clump) != "backlog"
    assert lasting.look({"a": 400.0, "b": 100.0}, {"a": 80}) == "backlog" and lasting.split[0] > 4


def test_with_the_fast_rule_off_the_same_backlog_waits_for_the_slow_rule() -> None:
    run = Run(WatchSettings(backlog_looks=0))
    for _ in range(20):
        run.look({"a": 100.0, "b": 100.0})
    rules = [run.look({"a": 240.0, "b": 100.0}, {"a": 20 * (k + 1)}) for k in range(2)]
    assert "backlog" not in rules


def test_the_settings_and_the_models_named_are_checked() -> None:
    with pytest.raises(ConfigError, match="positive"):
        WatchSettings(fast_s=0.0)
    with pytest.raises(ConfigError, match="fraction"):
        WatchSettings(min_gain=1.0)
    with pytest.raises(ConfigError, match="backlog"):
        WatchSettings(backlog_looks=-1)
    with pytest.raises(ConfigError, match="standard deviations"):
        WatchSettings(fall_z=-1.0)
    with pytest.raises(ConfigError, match="its own name"):
        Watch(["a", "a"], WatchSettings())
    run = Run()
    with pytest.raises(ConfigError, match="in order"):
        run.watch.decide(1.0, list(reversed(BASES)), run.propose, run.rescore)


def test_the_rise_is_the_last_seconds_requests_against_the_rate_before_them_in_standard_deviations() -> None:
    watch = Watch(["a"], WatchSettings())
    for k in range(9):  # 100 requests a second for 3 s, then 196 in the last second
        watch.read("a", Reading(k * 0.5, 0, 0, 50 * k if k <= 6 else 300 + 98 * (k - 6)))
    # Expected 100 ± √(100 · (1 + 1/3)): 96 more is 8.3 standard deviations.
    assert watch.rise("a", 4.0) == pytest.approx(96 / (100 * 4 / 3) ** 0.5)
    assert Watch(["a"], WatchSettings()).rise("a", 4.0) == 0.0  # no readings, no evidence


def test_the_slow_rules_gain_must_clear_the_noise_of_the_rates_it_is_read_from() -> None:
    def moves(noise_gain: float) -> int:
        run = Run(WatchSettings(noise_gain=noise_gain, backlog_looks=0))
        for _ in range(10):
            run.look({"a": 20.0, "b": 20.0})
        return sum(run.look({"a": 150.0, "b": 20.0}) == "gain" for _ in range(10))

    # b's 60 inputs over 3 s give its rate to ±13%: the predicted 25% of moving to 6/2 is under 2/√60 = 26%.
    assert moves(0.0) >= 1 and moves(2.0) == 0 and moves(20.0) == 0


def test_the_slow_rule_never_moves_to_a_split_that_leaves_more_models_saturated() -> None:
    watch = Watch(["a", "b"], WatchSettings())
    for k in range(21):  # 10 s of 100 inputs a second for each model
        for name in ("a", "b"):
            watch.read(name, Reading(k * LOOK_S, 50 * k, 0))
    demands = watch.demands(10.0, BASES, 3.0)
    served = evaluate(demands, [4, 4], total_cores=8)
    saturating = evaluate(demands, [7, 1], total_cores=8)  # b's one core carries 95 inputs a second
    assert saturating.saturated == ("b",) and not served.saturated

    def choose_split(split: JointPlan) -> choosing.Chooser:
        def choose(*_: object) -> Choice:  # the choice says move, and to `split`
            return Choice("joint", split, (("joint", 1.0),), 2.0, move=True)

        return choose

    assert not choosing.judge(watch, 10.0, demands, served, choose_split(saturating), burst=False).move
    carried = evaluate(demands, [5, 3], total_cores=8)
    assert choosing.judge(watch, 10.0, demands, served, choose_split(carried), burst=False).move
