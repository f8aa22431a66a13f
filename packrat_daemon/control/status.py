"""The `status` reply: what the daemon is doing now, read-only (`packrat status`, docs/status.md).

It is `info`'s description plus the live state: the plan and why, every live worker, the batch sizes
and the arrival rate the batcher sees, the queue, where the profile's cells come from, which runtime and
precision candidate is served and why each other one lost, and the history
of plan changes with their measured durations. `snapshot` reads all of it into one `Snapshot` when a client
asks (`Daemon.status`), never on the request path; `live_status` only lays it out.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from packrat_daemon.control.board import Board
    from packrat_daemon.fleet.pool import WorkerHandle
    from packrat_daemon.fleet.reconciler import Reconfiguration
    from packrat_daemon.requests.batcher import Batcher
    from packrat_daemon.requests.frontend import Frontend
    from policies.planning.distribution import BatchDistribution


@dataclass(frozen=True)
class Snapshot:
    """The daemon's state at one instant, as the `status` reply shows it."""

    info: dict[str, Any]  # the `info` reply (Frontend.describe)
    runtime: str
    workers: Sequence[WorkerHandle]  # every live worker, serving or not
    serving: frozenset[int]  # the ids of those that take batches
    generation: int
    history: Sequence[Reconfiguration]
    policy: str
    adapting: bool  # online adaptation has a tuner (a policy that adapts, with a profile, adaptation on)
    adapt_interval_s: float
    override: str | None  # what `packrat reconfigure` asked for, until `--auto`
    distribution: BatchDistribution | None  # the live batch sizes
    batches_per_s: float
    inputs_per_s: float
    half_life_s: float
    queued_requests: int
    queued_inputs: int
    max_queued_inputs: int
    batch_in_flight: bool
    accepting: bool
    profile: dict[str, Any]  # the state keeper's account of the profile's cells (StateKeeper.provenance)
    # This model's share of the machine (coordinate.tenancy.Share.to_json): its CPUs, who assigned them, the last move.
    share: dict[str, Any] | None = None
    # The choice between the runtime and precision candidates (control.measured): None before one is made.
    runtime_choice: dict[str, Any] | None = None
    # The Open Inference Protocol gateway beside the daemon (protocol.launch.GatewayProcess.status): None without.
    gateway: dict[str, Any] | None = None
    # Predicted against measured compute per layout served, and the profile's noise they are judged by.
    predictions: dict[str, Any] | None = None
    # A model of a free axis: its sequences' lengths and the padding waste since start (ops.tallies.Tokens).
    tokens: dict[str, Any] | None = None


def snapshot(
    board: Board,
    batcher: Batcher,
    frontend: Frontend,
    override: str | None,
    runtime_choice: dict[str, Any] | None,
    share: dict[str, Any],
    gateway: dict[str, Any] | None,
) -> Snapshot:
    """The running daemon's state now: what `board` serves and its parts, and the rest as the callers say it."""
    now = time.monotonic()
    reconciler, estimator, served = board.reconciler, board.adaptation.estimator, board.served
    batches_per_s, inputs_per_s = estimator.rates(now)
    return Snapshot(
        info=frontend.describe(), runtime=served.info.runtime,
        workers=reconciler.pool.live(), serving=frozenset(w.id for w in reconciler.serving()),
        generation=reconciler.generation, history=list(reconciler.history),
        policy=served.policy.name, adapting=board.adaptation.tuner is not None,
        adapt_interval_s=board.adaptation.interval_s, override=override,
        distribution=estimator.distribution(now), batches_per_s=batches_per_s, inputs_per_s=inputs_per_s,
        half_life_s=estimator.half_life_s, queued_requests=len(batcher.queue), queued_inputs=batcher.queued_inputs,
        max_queued_inputs=batcher.max_queued_inputs, batch_in_flight=board.dispatcher.busy,
        accepting=frontend.accepting, profile=board.state.provenance(board.kept(), now),
        runtime_choice=runtime_choice, share=share, gateway=gateway, predictions=_predictions(board),
        tokens=board.metrics.tokens.to_json(),
    )  # fmt: skip


def _predictions(board: Board) -> dict[str, Any]:
    """Per layout served: the profile's predicted compute against the measured (ops.tallies.compared)."""
    from packrat_daemon.ops.tallies import compared, profile_noise

    noise = profile_noise(board.served.profile)
    return {"noise": round(noise, 4), "layouts": compared(board.metrics.layouts, noise)}


def live_status(s: Snapshot) -> dict[str, Any]:
    reply = dict(s.info)
    reply["workers"] = [
        {
            "id": w.id,
            "pid": w.pid,
            "runtime": s.runtime,
            "threads": w.threads,
            "cores": list(w.cores),
            "state": "switching" if w.pending is not None else w.state.value if w.parked_since is None else "parked",
            "serving": w.id in s.serving,
            "generation": w.generation,
            "batches_served": w.served,
        }
        for w in sorted(s.workers, key=lambda w: w.id)
    ]
    reply["generation"] = s.generation
    reply["planning"] = {
        "policy": s.policy,
        "adapting": s.adapting,
        "adapt_interval_s": s.adapt_interval_s,
        "override": s.override,
    }
    reply["traffic"] = {
        "batch_sizes": [] if s.distribution is None else [[b, w] for b, w in s.distribution.weights],
        "batches_per_s": s.batches_per_s,
        "inputs_per_s": s.inputs_per_s,
        "half_life_s": s.half_life_s,
        "tokens": s.tokens,
    }
    reply["queue"] = {
        "requests": s.queued_requests,
        "inputs": s.queued_inputs,
        "max_inputs": s.max_queued_inputs,
        "batch_in_flight": s.batch_in_flight,
        "accepting": s.accepting,
    }
    reply["profile"] = s.profile
    reply["share"] = s.share
    reply["runtime_choice"] = s.runtime_choice
    reply["gateway"] = s.gateway
    reply["predictions"] = s.predictions
    reply["history"] = [record.to_json() for record in s.history]
    return reply
