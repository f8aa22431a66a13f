"""The co-location loop's core on made-up daemons: the order of a look's phases, what stops a look before it
plans, and what a move that fails leaves (the real daemons are test_loop's and test_colocated's, the
simulated ones simulate/test_colocated's)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from packrat_daemon.coordinate.core import Daemons, LookCore
from packrat_daemon.coordinate.readings import Reading, WatchSettings
from packrat_daemon.coordinate.strategies import STRATEGIES, Strategy, even_counts, proportional_split
from packrat_daemon.coordinate.watch import Decision
from packrat_daemon.wire.errors import ConfigError, ProfileError
from policies.colocation import ModelDemand
from policies.planning.distribution import BatchDistribution
from policies.testing import amdahl_profile

PROFILE = amdahl_profile(8, (1, 2, 4, 8), serial_ms=0.5, parallel_ms=8.0)
LOOK_S = 0.5


class Made:
    """Two daemons a and b on 8 cores, answering from a table: inputs arriving at `rates` per second."""

    def __init__(self) -> None:
        self.now = 0.0
        self.rates = {"a": 0.0, "b": 0.0}
        self.arrived = {"a": 0.0, "b": 0.0}
        self.split: tuple[int, ...] = (4, 4)
        self.down: list[str] = []
        self.profiles: dict[str, bool] = {"a": True, "b": True}
        self.takes = True  # each daemon takes the share it is told
        self.calls: list[str] = []
        self.why = ""

    @property
    def names(self) -> list[str]:
        return ["a", "b"]

    def clock(self) -> float:
        return self.now

    def look(self) -> dict[str, Reading | None]:
        self.calls.append("look")
        for name, rate in self.rates.items():
            self.arrived[name] += rate * LOOK_S
        return {
            name: None if name in self.down else Reading(self.now, round(self.arrived[name]), 0) for name in self.names
        }

    def away(self, down: Sequence[str]) -> None:
        self.calls.append(f"away {','.join(down)}")

    def bases(self) -> list[ModelDemand | None]:
        self.calls.append("bases")
        return [
            ModelDemand(name, PROFILE, BatchDistribution.single(1), 0.0) if self.profiles[name] else None
            for name in self.names
        ]

    def move(self, now: float, decision: Decision) -> bool:
        assert decision.proposed is not None
        self.calls.append(f"move {decision.rule} {list(decision.proposed.split)}")
        if self.takes:
            self.split = decision.proposed.split
        return self.takes

    def hold(self, now: float, decision: Decision) -> None:
        self.calls.append("hold")

    def decline(self, why: str) -> None:
        self.why = why


def run(made: Made, looks: int) -> LookCore:
    daemons: Daemons = made  # the protocol, checked by mypy
    core = LookCore(daemons, Strategy("joint", 8), WatchSettings(), made.clock)
    core.read()
    for _ in range(looks):
        made.now += LOOK_S
        core.tick()
    return core


def test_a_look_reads_then_plans_and_moves_cores_to_the_busy_model() -> None:
    made = Made()
    made.rates = {"a": 150.0, "b": 250.0}  # b past what 4 cores carry (222 a second), a busy too
    core = run(made, 4)
    assert made.calls[:3] == ["look", "look", "bases"]  # the start's reading, then each look's phases in order
    assert [call for call in made.calls if call.startswith("move")] == ["move gain [2, 6]"]
    assert made.split == (2, 6) and "not changed enough" in made.why  # the looks after it: steady traffic
    assert core.joint is not None and core.joint.split == made.split
    assert core.choice is not None and core.choice.mode == "joint"
    assert core.looks == 4 and 1 <= core.plans <= 4
    assert core.watch.last_move > 0


def test_with_one_model_at_rest_every_model_is_served_on_all_cores_and_the_status_says_so() -> None:
    made = Made()
    made.rates["b"] = 250.0  # a idle: no collision, so b is best served on the whole machine
    core = run(made, 4)
    assert [call for call in made.calls if call.startswith("move")] == ["move gain [8, 8]"]
    assert core.choice is not None and core.choice.mode == "every" and core.joint is not None and core.joint.shared
    assert "every model on all cores" in core.choice.describe()


def test_while_a_daemon_is_down_no_core_moves_and_its_share_is_kept() -> None:
    made = Made()
    made.rates["b"] = 250.0
    made.down = ["a"]
    core = run(made, 4)
    assert "bases" not in made.calls and not any(call.startswith("move") for call in made.calls)
    assert made.calls.count("away a") == 4 and made.why == "a down: no core moves until every model is up"
    assert core.plans == 0 and core.joint is None


def test_a_model_without_a_profile_keeps_the_split() -> None:
    made = Made()
    made.rates["b"] = 250.0
    made.profiles["a"] = False
    run(made, 4)
    assert made.split == (4, 4) and made.why == "a serve(s) without a profile: the split stays as it is"


def test_a_move_not_taken_leaves_the_split_and_the_watch_as_they_were() -> None:
    made = Made()
    made.rates = {"a": 150.0, "b": 250.0}
    made.takes = False
    core = run(made, 4)
    assert [call for call in made.calls if call.startswith("move")][0] == "move gain [2, 6]"
    assert made.split == (4, 4) and core.joint is not None and core.joint.split == (4, 4)
    assert core.watch.last_move == -float("inf")  # no cool-down started by a move that did not happen


def test_a_planner_that_fails_is_declined_not_raised() -> None:
    made = Made()

    def bases() -> list[ModelDemand | None]:
        raise ProfileError("a's profile is empty")

    made.bases = bases  # type: ignore[method-assign]
    run(made, 2)
    assert made.why == "no joint plan: a's profile is empty"


def test_the_strategies() -> None:
    assert even_counts(3, 16) == [6, 5, 5]
    assert proportional_split([3.0, 1.0], 16) == [12, 4]
    demands = [ModelDemand(name, PROFILE, BatchDistribution.single(1), 100.0) for name in ("a", "b")]
    assert Strategy("every", 8).propose(demands).split == (8, 8)
    assert Strategy("even", 8).propose(demands).split == (4, 4)
    assert Strategy("joint", 8).rescore(demands, (2, 6)).split == (2, 6)
    assert set(STRATEGIES) == {"joint", "every", "even", "proportional"}
    with pytest.raises(ConfigError, match="strategy"):
        Strategy("greedy", 8)
