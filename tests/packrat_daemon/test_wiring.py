"""The daemon's parts as `wiring.assemble` puts them together: each uses the very parts it was given (no workers)."""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import zmq

from packrat_daemon.config import ServeConfig
from packrat_daemon.fleet.backend import Backend, ModelInfo
from packrat_daemon.fleet.pool import WorkerHandle, WorkerState
from packrat_daemon.measure.profiling import ProfileFile
from packrat_daemon.ops.metrics import Metrics
from packrat_daemon.ops.state import StateKeeper
from packrat_daemon.requests.batcher import Request
from packrat_daemon.requests.jobs import Completed
from packrat_daemon.startup import RuntimeCandidate, Started, policy_for
from packrat_daemon.wiring import Parts, assemble
from policies.base import InstancePlan, Plan
from policies.planning.profile import Profile
from policies.planning.topology import Topology

INFO = ModelInfo("builtin:tiny-mlp", "torch", "float32", (16,), None, 4242)
PROFILE = Profile.from_latencies({(t, b): 2.0 + b / t for t in (1, 2) for b in (1, 2, 4)})
PLAN = Plan((InstancePlan(2, 4),), "fixed", "a test plan")


@pytest.fixture
def parts(tmp_path: Path) -> Iterator[tuple[Parts, Metrics]]:
    context = zmq.Context()
    backend = Backend(context, str(tmp_path / "run"))
    config = ServeConfig(model=INFO.model, endpoint=f"ipc://{tmp_path}/front.ipc", policy="fixed", plan="2x4")
    started = Started(
        Topology.synthetic(2),
        policy_for(config),
        RuntimeCandidate(backend, INFO, PROFILE, PLAN),
        ProfileFile(None),
        StateKeeper(None),
    )
    metrics = Metrics(INFO.model)
    built = assemble(config, started, context, metrics, status=lambda: {"status": True})
    try:
        yield built, metrics
    finally:
        built.frontend.close()
        backend.close()
        context.term()


def request(samples: int) -> Request:
    return Request(b"id", None, 1, "float32", (samples, 16), b"\0" * (64 * samples), 0.0)


def test_the_batcher_predicts_by_the_dispatchers_splitter_on_its_serving_workers(parts: tuple[Parts, Metrics]) -> None:
    built, metrics = parts
    assert built.batcher.predict is not None and built.batcher.predict(4) is None  # no worker serves yet
    built.dispatcher.serving = [WorkerHandle(1, 2, (0, 1), 1, WorkerState.READY)]
    assert built.batcher.predict(4) == pytest.approx(PROFILE.latency(2, 4) / 1000.0)
    assert built.dispatcher.own_times is metrics.own_times
    assert built.reconciler.plan == PLAN and built.adaptation.splitting is PROFILE


def test_the_frontend_sees_the_dispatchers_batch_and_feeds_the_batchers_cost_model(
    parts: tuple[Parts, Metrics],
) -> None:
    built, _ = parts
    assert built.frontend.busy() is False
    built.dispatcher.dispatch([request(2)], [WorkerHandle(1, 2, (0, 1), 1, WorkerState.READY)])
    assert built.dispatcher.busy and built.frontend.busy() is True
    built.frontend.served(0.004)
    assert built.batcher.overhead_s > 0.0
    assert built.frontend.status is not None and built.frontend.status() == {"status": True}


def test_the_supervisor_answers_through_the_frontend_and_requeues_into_the_batcher(
    parts: tuple[Parts, Metrics],
) -> None:
    built, _ = parts
    assert built.supervisor.replies is built.frontend
    built.supervisor.requeue([request(3)])
    assert built.batcher.queued_inputs == 3 and built.supervisor.queued() == 3


def test_each_answer_tells_the_batcher_whose_clients_may_come_back(parts: tuple[Parts, Metrics]) -> None:
    # The daemon's reply path feeds the batcher's hold for closed-loop clients (requests.waiting, issue 43): the first
    # request after an answer times the clients' return.
    built, _ = parts
    answered = request(2)
    answered.arrived = time.monotonic()
    built.frontend.reply_result(Completed(answered, np.zeros((2, 4), np.float32), 0.1, 1.0, []))
    assert built.batcher.return_s == math.inf  # no request since
    back = request(2)
    back.arrived = time.monotonic()
    assert built.batcher.offer(back)
    assert 0.0 <= built.batcher.return_s < 1.0
