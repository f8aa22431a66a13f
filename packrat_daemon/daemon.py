"""The daemon: start-up, one main loop, staged shutdown (after uvicorn's server and gunicorn's arbiter).

One thread runs everything: the frontend ROUTER, the internal backend ROUTER and a wake-up pipe
for signals are polled together. Signal handlers only enqueue the event SIGNALS names and wake the
loop; the loop acts on the queue between two polls. Start-up is in `startup`, the clients' side in
`frontend`, the workers' side in `supervisor`, adaptation in `adapt.online`.
"""

from __future__ import annotations

import contextlib
import logging
import math
import signal
import socket
import time
from collections import deque
from collections.abc import Callable, Iterator
from types import FrameType

import zmq

from packrat_daemon import reload
from packrat_daemon.adapt.online import OnlineAdaptation
from packrat_daemon.config import ServeConfig
from packrat_daemon.control.server import Control, control_endpoint
from packrat_daemon.control.status import live_status
from packrat_daemon.fleet.pool import Pool
from packrat_daemon.fleet.reconciler import Reconciler
from packrat_daemon.fleet.supervisor import Supervisor
from packrat_daemon.ops.metrics import Metrics
from packrat_daemon.ops.notify import READY, STOPPING, Watchdog, reloading, sd_notify
from packrat_daemon.requests.batcher import Batcher, plan_latency
from packrat_daemon.requests.dispatcher import Dispatcher, Splitter
from packrat_daemon.requests.frontend import Frontend
from packrat_daemon.startup import Started, replan, start_up
from packrat_daemon.wire.codec import ErrorCode
from packrat_daemon.wire.errors import PackratError
from policies.base import Plan
from policies.planning.profile import Profile

log = logging.getLogger("packrat.daemon")

# The signal table: what each handled signal asks the loop to do.
SIGNALS = {signal.SIGTERM: "stop", signal.SIGINT: "stop", signal.SIGHUP: "reload"}


class SignalQueue:
    """The events of the signals received, and the pipe that wakes the loop's poll for them."""

    def __init__(self) -> None:
        self.events: deque[str] = deque()
        self.wake_r, self.wake_w = socket.socketpair()
        self.wake_w.setblocking(False)  # a handler must never block; one unread wake-up byte is enough

    def _enqueue(self, signum: int, _frame: FrameType | None) -> None:
        self.events.append(SIGNALS[signal.Signals(signum)])
        with contextlib.suppress(OSError):
            self.wake_w.send(b"\0")

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        """Handle SIGNALS inside the block; after it the handlers from before are back, the pipe closed."""
        previous = {signum: signal.signal(signum, self._enqueue) for signum in SIGNALS}
        try:
            yield
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, signal.SIG_DFL if handler is None else handler)
            self.wake_r.close()
            self.wake_w.close()


class Daemon:
    def __init__(
        self,
        config: ServeConfig,
        started: Started,
        context: zmq.Context,
        metrics: Metrics,
        signals: SignalQueue,
        reload_config: Callable[[], ServeConfig] | None = None,
    ) -> None:
        self.config = config
        self.reload_config = reload_config  # SIGHUP re-reads the configuration through this
        self.topology = started.topology
        self.metrics = metrics
        self.signals = signals
        self.policy, self.profiles = started.policy, started.profiles
        self.backend, self.info = started.served.backend, started.served.info
        self.profile, self.plan = started.served.profile, started.served.plan
        self.reconciler = Reconciler(Pool(self.backend, warmup=(1,)), self.topology, metrics.reconfigured)
        self.reconciler.set_plan(self.plan)
        deadline = (config.job_timeout_s, config.slice_deadline_margin, config.slice_deadline_floor_ms / 1000.0)
        deadline += (config.slice_hedge_margin, config.slice_hedge_floor_ms / 1000.0)
        self.dispatcher = Dispatcher(self.reconciler.pool.run, self._splitter(self.profile, self.plan), *deadline)
        self.dispatcher.own_times = metrics.own_times
        self.batcher = Batcher(config.max_batch, config.max_delay_ms / 1000.0, config.max_queue)
        self.batcher.predict = plan_latency(lambda: self.dispatcher.splitter, lambda: self.supervisor.serving)
        self.frontend = Frontend(context, config, self.info, metrics, self.batcher, self.dispatcher, self.reconciler)
        self.frontend.status = lambda: live_status(self)
        self.adaptation = OnlineAdaptation(config, self.policy, self.profile, self.topology)
        self.state = started.state.attach(self.adaptation)  # production's estimates from --state-dir, if any
        self.supervisor = Supervisor(self.reconciler, self.dispatcher, self.frontend, metrics, self.adaptation)
        self.drain_deadline: float | None = None  # set by the first stop signal
        self.watchdog = Watchdog.from_environment(config.startup_timeout_s)  # systemd's WatchdogSec=, if set
        self.control = Control(self, context, control_endpoint(config.control, config.run_dir or self.backend.run_dir))

    def start(self) -> None:
        """Wait for the plan's workers, then open the frontend and tell systemd."""
        log.info("plan %s — %s", self.plan.describe(), self.plan.reason)
        self.supervisor.wait_converged(self.config.startup_timeout_s, lambda: bool(self.signals.events))
        self.metrics.plan_changed(self.plan, "start", self.reconciler.planned_workers)
        reserved = self.batcher.reserve_inbox(self.frontend.sample_bytes)
        if reserved:
            log.info("inbox: %.0f MiB of shared memory paged in for requests of up to %d inputs",
                     reserved / 2**20, self.batcher.max_batch)  # fmt: skip
        self.frontend.open()
        log.info("serving on %s with %d worker(s)", self.config.endpoint, len(self.reconciler.serving()))
        sd_notify(READY)

    # -- main loop ---------------------------------------------------------------------------
    def run(self) -> None:
        """Poll; act on signals; read requests; pump the workers' messages; tick; return once drained."""
        frontend, backend, wake = self.frontend.socket, self.backend.socket, self.signals.wake_r.fileno()
        events = self.signals.events
        # zmq_poll itself, not zmq.Poller: the loop wakes twice per request and Poller.poll adds a layer.
        control = self.control.socket  # `packrat reconfigure`: its requests are queued, acted on in _tick
        own = self.metrics.own_times  # where the loop's time goes, phase by phase (docs/metrics.md)
        items = [(frontend, zmq.POLLIN), (backend, zmq.POLLIN), (wake, zmq.POLLIN), (control, zmq.POLLIN)]
        while True:
            ready = {item for item, _ in zmq.zmq_poll(items, self._poll_timeout_ms())}
            if wake in ready:
                self.signals.wake_r.recv(4096)
            while events:
                if not self._on_signal(events.popleft()):
                    return
            if frontend in ready:
                started = time.perf_counter()
                messages = self.frontend.read()
                own.add("read", time.perf_counter() - started, messages)
            if backend in ready:
                started, busy = time.perf_counter(), self.dispatcher.busy
                self.supervisor.pump(0, waiting=True)
                own.add("answer" if busy and not self.dispatcher.busy else "workers", time.perf_counter() - started)
            if control in ready:
                self.control.read()
            self._tick()
            if self.drain_deadline is not None and self._drained():
                return

    def _on_signal(self, event: str) -> bool:
        """Act on one signal's event; False: exit at once."""
        if event == "reload":
            self._reload()
        elif self.drain_deadline is not None:
            log.warning("second stop signal: exiting without draining")
            return False
        else:
            self.frontend.accepting = False
            self.drain_deadline = time.monotonic() + self.config.drain_timeout_s
            sd_notify(STOPPING)
            log.info("draining: finishing queued requests (up to %.0f s)", self.config.drain_timeout_s)
        return True

    def _drained(self) -> bool:
        """Draining: True once nothing is queued or running, or the deadline passed (close() answers the rest)."""
        if not self.dispatcher.busy and not self.batcher.queue:
            return True
        if self.drain_deadline is not None and time.monotonic() > self.drain_deadline:
            log.warning("drain deadline passed; answering what is left with SHUTTING_DOWN")
            return True
        return False

    def _poll_timeout_ms(self) -> int:
        """Wake for the next batch that falls due, or the in-flight batch's next deadline (a slice's or a
        request's), else at least every 250 ms for the periodic work."""
        due = self.dispatcher.next_deadline if self.dispatcher.busy else self.batcher.next_due()
        if due is None or due == math.inf:
            return 250
        return min(250, max(0, math.ceil((due - time.monotonic()) * 1000)))

    def _tick(self) -> None:
        """Expire queued requests, check the workers when due, dispatch a batch when due, adapt when due."""
        now = time.monotonic()
        if self.batcher.queue:
            for request in self.batcher.expire(now):
                message = "the request's timeout passed while it was queued"
                self.frontend.reply_error(request, ErrorCode.TIMEOUT, message)
        supervisor = self.supervisor
        if now >= self.dispatcher.next_deadline:
            supervisor.on_deadline(now)
        if supervisor.changed or now >= supervisor.due:
            supervisor.check(now)
            self.metrics.queued.set(self.batcher.queued_inputs)
        if not self.dispatcher.busy and self.batcher.due(now) and supervisor.serving:
            started = time.perf_counter()
            batch = self.batcher.take()
            self.dispatcher.dispatch(batch, supervisor.serving)
            rows = sum(r.samples for r in batch)  # bookkeeping after the send: the workers start meanwhile
            self.adaptation.estimator.observe(rows, now)
            self.metrics.batch_size.observe(rows)
            self.metrics.own_times.add("dispatch", time.perf_counter() - started)
        self.watchdog.tick(now, self.reconciler.converged)
        self.control.tick()
        self.state.tick(self, now)
        if now >= self.adaptation.due:
            plan = self.adaptation.propose(self.plan, self.profile, now)
            if plan is not None:
                self._switch(plan, "adapt")

    # -- reconfiguration ---------------------------------------------------------------------
    def _switch(self, plan: Plan, reason: str) -> None:
        """Hand a new plan to the reconciler; the dispatcher splits by its layouts from now on."""
        self.plan = plan
        self.reconciler.set_plan(plan, reason, self.adaptation.predicted(self.reconciler.plan, plan, time.monotonic()))
        self.metrics.plan_changed(plan, reason, self.reconciler.planned_workers)
        self.dispatcher.splitter = self._splitter(self.adaptation.planning_profile(self.profile), plan)
        self.supervisor.changed = True
        self.state.save(self, reason)

    def _splitter(self, profile: Profile | None, plan: Plan) -> Splitter:
        """How each batch is divided under `plan`: its layouts as the reconciler keeps them warm."""
        return Splitter(profile, plan.split, self.reconciler.layouts, plan.oversubscribed, self.config.min_split_gain)

    def _reload(self) -> None:
        """SIGHUP: re-read the configuration and profile, re-plan, apply the live settings (packrat_daemon.reload);
        if the new configuration cannot be planned, keep serving as before."""
        sd_notify(reloading())
        try:
            fresh = self.reload_config() if self.reload_config else self.config
            new = replan(self.config, fresh, self.info.runtime, self.profile, self.topology)
        except PackratError as exc:
            log.error("reload failed, still serving the current plan: %s", exc)
            sd_notify(READY)
            return
        old, self.config, self.policy, self.profile = self.config, new.config, new.policy, new.profile
        owners = reload.Owners(self.batcher, self.dispatcher, self.watchdog, self.metrics, self.profiles)
        reload.apply(old, new.config, owners)  # each changed live setting to the object that uses it, logged
        log.info("reload: plan %s — %s", new.plan.describe(), new.plan.reason)
        self._switch(new.plan, "reload")
        self.adaptation.retune(new.config, new.policy, new.profile)
        sd_notify(READY)

    # -- shutdown ----------------------------------------------------------------------------
    def close(self) -> None:
        """Answer every request still here, close the frontend, keep what production taught us
        (--save-profile), stop the workers."""
        self.frontend.answer_all_and_close()  # first: no request waits unanswered on the slower steps below
        self.control.close()
        learned = self.adaptation.learned(self.profile, self.plan, self.config.model, self.info.runtime)
        if learned is not None and self.profiles.save(learned):
            log.info("profile with production timings saved to %s (%d cells)", self.profiles.path, len(learned))
        self.state.save(self, "stop")
        # The template stops its children in order (SIGTERM, then SIGKILL after a grace period).
        self.backend.close()


def serve(config: ServeConfig, reload_config: Callable[[], ServeConfig] | None = None) -> int:
    """Start up, serve until a stop signal, drain, shut down; the caller's signal handlers are back on return."""
    signals, context, metrics = SignalQueue(), zmq.Context(), Metrics(config.model)
    started: Started | None = None
    daemon: Daemon | None = None
    with signals.installed():
        try:
            started = start_up(config, context, metrics, lambda: bool(signals.events))
            daemon = Daemon(config, started, context, metrics, signals, reload_config)
            daemon.start()
            daemon.run()
        except KeyboardInterrupt:
            log.info("interrupted during start-up")
            return 130
        finally:
            metrics.close()
            if daemon is not None:
                daemon.close()
            elif started is not None:  # the daemon was never built: its template is still ours to stop
                started.served.backend.close()
            context.term()
            log.info("stopped")
    return 0
