"""The board: the one record of what is served, and each change of it handed to the parts it concerns (the
daemon's parts as `wiring.assemble` builds them, no workers)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq

from packrat_daemon.config import ServeConfig
from packrat_daemon.control.board import Board, Served
from packrat_daemon.control.measured import MeasuredSwitch
from packrat_daemon.fleet.backend import Backend, ModelInfo
from packrat_daemon.measure.profiling import ProfileFile
from packrat_daemon.ops.metrics import Metrics
from packrat_daemon.ops.state import Serving, StateKeeper
from packrat_daemon.startup import RuntimeCandidate, Started, policy_for
from packrat_daemon.wiring import Parts, assemble, splitter_for
from policies.base import InstancePlan, Plan
from policies.planning.profile import Profile
from policies.planning.topology import Topology

INFO = ModelInfo("builtin:tiny-mlp", "torch", "float32", (16,), None, 4242)
PROFILE = Profile.from_latencies({(t, b): 2.0 + b / t for t in (1, 2) for b in (1, 2, 4)})
PLAN = Plan((InstancePlan(2, 4),), "fixed", "a test plan")


def board_on(tmp_path: Path, cores: int = 2, **settings: object) -> Iterator[tuple[Board, Parts]]:
    """A board over real parts (no workers), serving PLAN on `cores` synthetic cores."""
    context = zmq.Context()
    backend = Backend(context, str(tmp_path / "run"))
    config = ServeConfig(model=INFO.model, endpoint=f"ipc://{tmp_path}/front.ipc", policy="fixed", plan="2x4",
                         **settings)  # fmt: skip
    topology = Topology.synthetic(cores)
    policy = policy_for(config)
    started = Started(topology, policy, RuntimeCandidate(backend, INFO, PROFILE, PLAN), ProfileFile(None),
                      StateKeeper(None))  # fmt: skip
    metrics = Metrics(INFO.model)
    parts = assemble(config, started, context, metrics, status=lambda: {})
    served = Served(PLAN, PROFILE, policy, INFO, topology)
    board = Board(config, served, parts.reconciler, parts.dispatcher, parts.adaptation, parts.state, metrics,
                  splitter_for)  # fmt: skip
    try:
        yield board, parts
    finally:
        parts.frontend.close()
        backend.close()
        context.term()


@pytest.fixture
def board(tmp_path: Path) -> Iterator[tuple[Board, Parts]]:
    yield from board_on(tmp_path)


def test_a_switch_replaces_the_record_and_hands_the_plan_to_the_reconciler_and_the_dispatcher(
    board: tuple[Board, Parts],
) -> None:
    serving, parts = board
    before = serving.served
    new = Plan((InstancePlan(1, 4), InstancePlan(1, 4)), "fixed", "two")
    generation = serving.switch(new, "a test")
    assert serving.served.plan == new and serving.plan == new
    assert (serving.served.profile, serving.served.info, serving.served.topology) == (
        before.profile,
        before.info,
        before.topology,
    )
    assert parts.reconciler.plan == new and generation == parts.reconciler.generation
    assert serving.reconfiguration(generation) is not None and serving.reconfiguration(generation + 1) is None
    assert parts.dispatcher.splitter.layouts == parts.reconciler.layouts


def test_a_policy_a_profile_and_cpus_change_only_through_the_board(board: tuple[Board, Parts]) -> None:
    serving, parts = board
    single = policy_for(ServeConfig(model=INFO.model, policy="single"))
    serving.set_policy(single)
    assert serving.served.policy is single and serving.served.plan == PLAN
    serving.set_profile(None)
    assert serving.served.profile is None and parts.adaptation.tuner is None
    share = Topology.synthetic(2).restricted([1])
    serving.restrict(share)
    assert serving.served.topology is share and parts.adaptation.topology is share
    assert parts.reconciler.allocator.topology is share
    planning = serving.planning()
    assert (planning.profile, planning.topology, planning.live) == (None, share, None)


def test_the_state_file_keeps_what_the_board_serves(board: tuple[Board, Parts]) -> None:
    serving, parts = board
    kept: Serving = serving.kept()
    assert (kept.plan, kept.profile, kept.adaptation) == (PLAN, PROFILE, parts.adaptation)


def test_without_a_background_measurement_nothing_switches_and_the_choice_is_the_states(
    board: tuple[Board, Parts],
) -> None:
    serving, parts = board
    measured = MeasuredSwitch(serving, parts.frontend, None)
    generation = parts.reconciler.generation
    measured.tick(0.0)
    assert parts.reconciler.generation == generation and measured.status() is None
