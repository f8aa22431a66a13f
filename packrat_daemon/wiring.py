"""How the daemon's parts are put together: each built once, in the order they need each other, and given
what it uses at construction (a part, or a named callback), never attached afterwards.

    reconciler ──▶ dispatcher ──▶ batcher ──▶ frontend ──▶ supervisor
    (the pool)     (splits by      (predicts   (queues into  (answers through the frontend,
                    the plan)       by the      the batcher)  requeues into the batcher)
                                    dispatcher)

What needs the running daemon itself (its plan and policy: the loop core, the control channel, the
`status` reply) is built by `daemon.Daemon` on top of these.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import zmq

from packrat_daemon.adapt.online import OnlineAdaptation
from packrat_daemon.config import ServeConfig
from packrat_daemon.fleet import proc
from packrat_daemon.fleet.pool import Pool
from packrat_daemon.fleet.reconciler import Reconciler, Slot
from packrat_daemon.ops.metrics import Metrics
from packrat_daemon.ops.state import StateKeeper
from packrat_daemon.requests.batcher import Batcher, plan_latency
from packrat_daemon.requests.dispatcher import Dispatcher
from packrat_daemon.requests.frontend import Frontend
from packrat_daemon.requests.ragged import Ragged
from packrat_daemon.requests.splitter import Splitter
from packrat_daemon.requests.supervisor import Supervisor
from packrat_daemon.requests.timing import Deadlines
from packrat_daemon.startup import Started
from policies.base import Plan
from policies.planning.profile import Profile


class Parts(NamedTuple):
    reconciler: Reconciler
    dispatcher: Dispatcher
    batcher: Batcher
    frontend: Frontend
    adaptation: OnlineAdaptation
    state: StateKeeper
    supervisor: Supervisor


def splitter_for(profile: Profile | None, plan: Plan, layouts: list[list[Slot]], config: ServeConfig) -> Splitter:
    """How each batch is divided under `plan`: its layouts as the reconciler keeps them warm."""
    return Splitter(profile, plan.split, layouts, plan.oversubscribed, config.min_split_gain)


def assemble(
    config: ServeConfig,
    started: Started,
    context: zmq.Context,
    metrics: Metrics,
    status: Callable[[], dict[str, Any]],
) -> Parts:
    """The parts that serve `started`'s plan; `status` builds the `status` reply the frontend sends."""
    served = started.served
    reconciler = Reconciler(Pool(served.backend, warmup=(1,)), started.topology, metrics.reconfigured)
    reconciler.set_plan(served.plan)
    # The one owner of work in flight. What it reads of the batcher, built next, it reads at each call.
    dispatcher = Dispatcher(
        reconciler.pool.run,
        splitter_for(served.profile, served.plan, reconciler.layouts, config),
        Deadlines.from_config(config),
        own_times=metrics.own_times,
        queued=lambda: batcher.queued_inputs,
        pool_size=lambda: len(reconciler.pool.live()),
        computing=proc.computing,
        ragged=Ragged(spec, config.length_batching) if (spec := served.info.input).ragged else None,
    )
    # L(b) under the plan in force: the dispatcher's splitter on its serving workers, both read at each call.
    predict = plan_latency(lambda: dispatcher.splitter, lambda: dispatcher.serving)
    batcher = Batcher(config.max_batch, config.max_delay_ms / 1000.0, config.max_queue, predict)
    if spec.ragged:  # batches under a token budget; a model without a mask batches one length at a time
        batcher.lengths(config.max_batch_tokens or config.max_batch * spec.max_length, spec.masked)
    frontend = Frontend(
        context, config, served.info, metrics, batcher, reconciler,
        busy=lambda: dispatcher.busy, served=batcher.served, status=status,
    )  # fmt: skip
    # A slice holds max_batch inputs at most (a reload only shrinks it): each worker's input arena is made
    # at that size and paged in once, so the daemon's resident size does not climb with each record slice.
    reconciler.pool.input_arena_bytes = config.max_batch * frontend.sample_bytes
    adaptation = OnlineAdaptation(config, started.policy, served.profile, started.topology)
    adaptation.costs(reconciler)  # a switch that forks must pay for the forks' warm-up (adapt.tuner)
    state = started.state.attach(adaptation)  # production's estimates from --state-dir, if any
    supervisor = Supervisor(
        reconciler, dispatcher, metrics, adaptation.production, replies=frontend,
        requeue=batcher.requeue, queued=lambda: batcher.queued_inputs,
    )  # fmt: skip
    return Parts(reconciler, dispatcher, batcher, frontend, adaptation, state, supervisor)
