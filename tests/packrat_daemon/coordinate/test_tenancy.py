"""The daemon's side of co-location: its share of the machine, an assign that moves it, and the demand it reports
(the daemon's parts as `wiring.assemble` builds them, no workers)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from packrat_daemon.control.board import Board
from packrat_daemon.coordinate.tenancy import Share, Tenancy
from packrat_daemon.wire.errors import PolicyError
from packrat_daemon.wiring import Parts
from policies.base import InstancePlan, Plan
from policies.planning.topology import Topology
from tests.packrat_daemon.control.test_board import PLAN, PROFILE, board_on


@pytest.fixture
def tenancy(tmp_path: Path) -> Iterator[tuple[Tenancy, Board, Parts]]:
    for board, parts in board_on(tmp_path, cores=4):
        yield Tenancy(board, parts.batcher), board, parts


def test_a_share_says_where_it_came_from_and_its_last_move() -> None:
    machine = Topology.synthetic(4)
    first = Share.initial(machine.restricted([0, 1]), "--cpus")
    assert first.to_json()["last_move"] is None and first.to_json()["cpus"] == "0-1"
    moved = Share.assigned(machine.restricted([0, 1, 2]), "coordinator: joint plan", 3, 0.25, first)
    shown = moved.to_json(moves=1)
    assert (shown["cpus"], shown["cores"], shown["assigned_by"], shown["moves"]) == (
        "0-2",
        3,
        "coordinator: joint plan",
        1,
    )
    assert shown["last_move"] == {"from": "0-1", "to": "0-2", "time": moved.wall, "generation": 3,
                                  "predicted_gain": 0.25, "reason": "coordinator: joint plan"}  # fmt: skip


def test_an_assign_moves_the_boards_cpus_and_switches(tenancy: tuple[Tenancy, Board, Parts]) -> None:
    side, board, parts = tenancy
    assert side.status()["assigned_by"] == "every usable CPU" and side.status()["moves"] == 0
    assert side.assign([0, 1, 2, 3], PLAN, "same") is None  # nothing changes: only who gave the CPUs
    assert side.share.by == "same" and side.moves == 0
    plan = Plan((InstancePlan(1, 4), InstancePlan(1, 4)), "coordinate", "two on two")
    generation = side.assign([0, 1], plan, "joint plan", 0.2)
    assert generation == parts.reconciler.generation and board.served.plan == plan
    assert board.served.topology.cpu_ids == (0, 1) and parts.reconciler.allocator.topology is board.served.topology
    shown = side.status()
    assert (shown["cpus"], shown["moves"], shown["last_move"]["predicted_gain"]) == ("0-1", 1, 0.2)
    assert side.vacated()  # no worker anywhere


def test_an_assign_that_does_not_fit_changes_nothing(tenancy: tuple[Tenancy, Board, Parts]) -> None:
    side, board, _ = tenancy
    before = board.served
    with pytest.raises(PolicyError, match="does not fit the 1 core"):
        side.assign([0], PLAN, "too small")
    assert board.served is before and side.moves == 0


def test_without_a_plan_the_policy_plans_inside_the_cpus(tenancy: tuple[Tenancy, Board, Parts]) -> None:
    side, board, _ = tenancy
    assert side.assign([0, 1], None, "policy's") is not None
    assert board.served.plan.policy == "fixed" and board.served.topology.cpu_ids == (0, 1)


def test_the_demand_is_what_the_board_serves(tenancy: tuple[Tenancy, Board, Parts]) -> None:
    side, board, _ = tenancy
    demand = side.demand()
    assert (demand["runtime"], demand["policy"], demand["plan"]) == ("torch", "fixed", PLAN.to_json())
    assert demand["profile"] == PROFILE.to_csv() and demand["machine_cpus"] == [0, 1, 2, 3]
    assert demand["share"]["cpus"] == "0-3" and demand["vacated"] is True and demand["batch_sizes"] == []
