"""The `status` reply: what the daemon is doing now, read-only (`packrat status`, docs/status.md).

It is `info`'s description plus the live state: the plan and why, every live worker, the batch sizes
and the arrival rate the batcher sees, the queue, where the profile's cells come from, and the history
of plan changes with their measured durations. Built on request only, never on the request path.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from packrat_daemon.daemon import Daemon


def live_status(daemon: Daemon) -> dict[str, Any]:
    now = time.monotonic()
    reconciler, adaptation, batcher = daemon.reconciler, daemon.adaptation, daemon.batcher
    distribution = adaptation.estimator.distribution(now)
    batches_per_s, inputs_per_s = adaptation.estimator.rates(now)
    serving = {w.id for w in reconciler.serving()}
    reply = daemon.frontend.describe()
    reply["workers"] = [
        {
            "id": w.id,
            "pid": w.pid,
            "runtime": daemon.info.runtime,
            "threads": w.threads,
            "cores": list(w.cores),
            "state": "switching" if w.pending is not None else w.state.value if w.parked_since is None else "parked",
            "serving": w.id in serving,
            "generation": w.generation,
            "batches_served": w.served,
        }
        for w in sorted(reconciler.pool.live(), key=lambda w: w.id)
    ]
    reply["generation"] = reconciler.generation
    reply["planning"] = {
        "policy": daemon.policy.name,
        "adapting": adaptation.tuner is not None,
        "adapt_interval_s": adaptation.interval_s,
        "override": daemon.control.override,
    }
    reply["traffic"] = {
        "batch_sizes": [] if distribution is None else [[b, w] for b, w in distribution.weights],
        "batches_per_s": batches_per_s,
        "inputs_per_s": inputs_per_s,
        "half_life_s": adaptation.estimator.half_life_s,
    }
    reply["queue"] = {
        "requests": len(batcher.queue),
        "inputs": batcher.queued_inputs,
        "max_inputs": batcher.max_queued_inputs,
        "batch_in_flight": daemon.dispatcher.busy,
        "accepting": daemon.frontend.accepting,
    }
    reply["profile"] = daemon.state.provenance(daemon, now)  # the state keeper's account, with or without a file
    reply["history"] = [record.to_json() for record in reconciler.history]
    return reply
