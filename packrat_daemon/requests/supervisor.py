"""The workers' side of the daemon's loop: it pumps what the workers and the template send (results, failures,
exits) and the periodic look at the workers into the dispatcher, which owns the work in flight and answers each
event with `Actions` (answers, requests to queue again, workers to replace), and applies them (gunicorn's arbiter
calls these reap and murder; the reconciler then forks replacements). Of the dispatcher's state it reads only what
the loop core asks (`busy`, `serving`, `next_deadline`), and writes none.

`pump` is on the request path (each result is answered from here), so it stays flat; `look` runs
every RECONCILE_INTERVAL_S, or at once after the pool or the plan changed: it reads each overdue slice's worker from
/proc (`fleet.proc`) for the dispatcher's hang verdict, replaces workers whose heartbeats stopped, and steps the
reconciler. To the loop core the supervisor is the daemon's `loop.Workers`. Its answers go to `Replies` (the
frontend), and a batch that lost every worker goes back to the queue through `requeue` (the batcher's): both are
given at construction.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Protocol

from packrat_daemon.adapt.production import ProductionProfile
from packrat_daemon.fleet import proc
from packrat_daemon.fleet.pool import PoolEvent, WorkerHandle
from packrat_daemon.fleet.reconciler import Reconciler
from packrat_daemon.ops.metrics import Metrics
from packrat_daemon.requests.batcher import Request
from packrat_daemon.requests.dispatcher import Actions, Dispatcher
from packrat_daemon.requests.frontend import MAX_READS_PER_WAKE
from packrat_daemon.requests.jobs import Completed
from packrat_daemon.wire.codec import ErrorCode
from packrat_daemon.wire.errors import ConfigError
from workers.worker import HEARTBEAT_SECONDS

log = logging.getLogger("packrat.daemon")

RECONCILE_INTERVAL_S = 0.1  # job timeouts are seconds long, and the loop wakes twice per request
# An idle worker heartbeats every HEARTBEAT_SECONDS, even on a busy machine: three missed, it is hung. Longer,
# and a worker stopped while idle goes unnoticed until a second fault finds no healthy worker to take over.
HEARTBEAT_TIMEOUT_S = 3 * HEARTBEAT_SECONDS


class Replies(Protocol):
    """Where the supervisor's answers go: the frontend, which owns the clients' socket."""

    def reply_result(self, done: Completed) -> None: ...

    def reply_error(self, request: Request, code: ErrorCode, message: str) -> None: ...


class Supervisor:
    def __init__(
        self,
        reconciler: Reconciler,
        dispatcher: Dispatcher,
        metrics: Metrics,
        production: ProductionProfile,
        replies: Replies,
        requeue: Callable[[list[Request]], None],
        queued: Callable[[], int],
    ) -> None:
        self.pool = reconciler.pool
        self.reconciler = reconciler
        self.dispatcher = dispatcher
        self.metrics = metrics
        self.production = production  # learns from every computed slice
        self.replies = replies
        self.requeue = requeue  # a batch whose workers were all lost goes back to the head of the queue
        self.queued = queued  # the inputs waiting to be batched, for the gauge each look sets
        self.changed = True  # the pool changed since the last look: look on this wake
        self.due = 0.0  # time.monotonic() of the next periodic look
        self._generation = -1  # the reconciler's generation at the last look: a new plan is looked at at once
        self._next_template_check = 0.0

    def pump(self, timeout_ms: int, waiting: bool = False) -> None:
        """Handle what the workers and templates sent; `waiting`: a poll has just reported a message. Every
        template's socket is read (while a change of runtime is under way, the older one's workers still answer);
        only the one new workers fork from is waited on."""
        current, *older = self.pool.backends
        first = current.recv_waiting() if waiting else current.recv(timeout_ms)
        for backend in (current, *older):
            received = first if backend is current else backend.recv(0)
            reads = 0
            while received is not None and reads < MAX_READS_PER_WAKE:
                event = self.pool.handle(*received)
                if event is not None:
                    self._on_event(event)
                    self.changed = self.changed or event.kind != "result"
                reads += 1
                received = backend.recv(0)
        if time.monotonic() >= self._next_template_check:
            self._next_template_check = time.monotonic() + RECONCILE_INTERVAL_S
            self.pool.check_template()  # TemplateLost (fleet.backend), saying how the template ended

    def wait_converged(self, timeout_s: float, interrupted: Callable[[], bool]) -> None:
        """Start-up: step the reconciler until the plan's workers are all ready."""
        deadline = time.monotonic() + timeout_s
        while not self.reconciler.converged():
            if time.monotonic() > deadline:
                raise ConfigError(f"the workers did not become ready within {timeout_s:.0f} s")
            if interrupted():  # SIGTERM or Ctrl-C during start-up
                raise KeyboardInterrupt
            self.reconciler.step()
            self.pump(200)

    # -- the loop core's view (loop.Workers) ---------------------------------------------------------
    @property
    def busy(self) -> bool:
        return self.dispatcher.busy

    @property
    def serving(self) -> list[WorkerHandle]:
        return self.dispatcher.serving

    @property
    def next_deadline(self) -> float:
        return self.dispatcher.next_deadline

    def check(self, now: float) -> None:
        """The loop's check: the deadlines of work in flight, then a look at the workers every
        RECONCILE_INTERVAL_S, or at once when the pool or the plan changed; then the parked requests' turn."""
        if now >= self.dispatcher.next_deadline:
            self.on_deadline(now)
        if self.changed or now >= self.due or self.reconciler.generation != self._generation:
            self.look(now)
            self.metrics.queued.set(self.queued())
        self.dispatcher.start_parked()

    def start(self, batch: list[Request], now: float) -> None:
        """Send the loop's batch to the serving workers (Dispatcher.start: a request to run alone is parked)."""
        self.dispatcher.start(batch)

    # -- deadlines and looks ------------------------------------------------------------------------
    def on_deadline(self, now: float) -> None:
        """A deadline of work in flight passed (Dispatcher.on_deadline); a slice past its deadline makes the next
        look judge its worker."""
        self.apply(self.dispatcher.on_deadline(now))
        self.changed = self.changed or bool(self.dispatcher.overdue(now))

    def look(self, now: float) -> None:
        """Judge the workers of overdue slices, replace those whose heartbeats stopped, let the reconciler converge,
        and tell the dispatcher what serves now.

        Raises WorkerBootError (from the reconciler) when workers keep failing before they are ready.
        """
        self.changed = False
        self.due = now + RECONCILE_INTERVAL_S
        self._generation = self.reconciler.generation
        for job in self.dispatcher.overdue(now):
            self.apply(self.dispatcher.looked_at(job, proc.read(job.worker, now)))
        # An idle worker heartbeats every second. One busy with a slice cannot (it computes on its only
        # Python thread); the slice's deadline above covers that case.
        busy = self.dispatcher.busy_workers()
        for worker in self.pool.ready():
            if worker.id not in busy and now - worker.last_seen > HEARTBEAT_TIMEOUT_S:
                log.warning("worker %d sent no heartbeat for %.0f s; replacing it", worker.id, now - worker.last_seen)
                self.reconciler.replace(worker)
        self.reconciler.step()
        serving = self.reconciler.serving()
        self.metrics.workers_serving({worker.id: worker.pid for worker in serving})
        self.apply(self.dispatcher.pool_looked(serving, now))

    def apply(self, actions: Actions) -> None:
        """Do what the dispatcher answered an event with, in order (Actions)."""
        for request, code, message in actions.errors:
            self.replies.reply_error(request, code, message)
        for done in actions.results:
            self.replies.reply_result(done)
        if actions.requeue:
            self.requeue(actions.requeue)
        for worker in actions.replace:
            self.reconciler.replace(worker)
            self._on_lost(worker)

    def _on_event(self, event: PoolEvent) -> None:
        worker = event.worker
        assert worker is not None
        if event.kind == "result":
            # Answer first, learn after: the client's reply must not wait for bookkeeping.
            profile_rows = self.dispatcher.profile_rows(event.header)
            for done in self.dispatcher.on_result(worker, event.header, event.payload):
                self.replies.reply_result(done)
            self.dispatcher.retry_late(time.monotonic())  # a late slice waits for an idle worker: this one may be it
            compute_ms = float(event.header["compute_ms"])
            self.metrics.observe_compute(worker.threads, compute_ms)
            if profile_rows is not None:
                self.production.observe(worker.threads, profile_rows, compute_ms, time.monotonic())
        elif event.kind == "failed":
            self.apply(self.dispatcher.failed(worker, event.header))
        elif event.kind == "lost":
            self._on_lost(worker)
        elif event.kind == "reconfigured":
            log.info("worker %d now runs %d thread(s) on cores %s", worker.id, worker.threads, list(worker.cores))
        elif event.kind == "ready":
            log.info("worker %d ready: %d thread(s) on cores %s", worker.id, worker.threads, list(worker.cores))
            self.dispatcher.warmed_up(worker, event.header.get("warmup_ms"))

    def _on_lost(self, worker: WorkerHandle) -> None:
        self.apply(self.dispatcher.lost(worker, self.reconciler.serving()))
