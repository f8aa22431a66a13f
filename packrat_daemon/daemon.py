"""The daemon: start-up, one main loop, staged shutdown (after uvicorn's server and gunicorn's arbiter).

One thread runs everything: the frontend ROUTER, the internal backend ROUTER, the control socket and a
wake-up pipe for signals are polled together. Signal handlers only enqueue an event and wake the loop
(`signals`); the loop acts on the queue between two polls, then reads what came and ticks the loop core
(`loop`: expire, check, dispatch, adapt), which `packrat simulate` runs too. Start-up is in `startup`, the
clients' side in `requests.frontend`, the workers' side in `requests.supervisor`, adaptation in `adapt.online`.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

import zmq

from packrat_daemon import reload
from packrat_daemon.config import ServeConfig
from packrat_daemon.control.board import Board, Served
from packrat_daemon.control.measured import MeasuredSwitch
from packrat_daemon.control.server import Control, control_endpoint
from packrat_daemon.control.status import live_status, snapshot
from packrat_daemon.coordinate.tenancy import Tenancy
from packrat_daemon.loop import LoopCore
from packrat_daemon.ops.metrics import Metrics
from packrat_daemon.ops.notify import READY, STOPPING, Watchdog, sd_notify
from packrat_daemon.protocol.launch import GatewayProcess
from packrat_daemon.signals import SignalQueue
from packrat_daemon.startup import Started
from packrat_daemon.wiring import assemble, splitter_for
from policies.base import Plan, Policy

if TYPE_CHECKING:
    from packrat_daemon.fleet.backend import Backend, ModelInfo
    from policies.planning.profile import Profile
    from policies.planning.topology import Topology

log = logging.getLogger("packrat.daemon")


class Daemon:
    """The running daemon: the parts `wiring.assemble` builds, those built on them, and the loop that drives them.
    What it serves (plan, profile, policy, runtime, CPUs) is the board's (`control.board`), which alone changes it."""

    def __init__(
        self,
        config: ServeConfig,
        started: Started,
        context: zmq.Context,
        metrics: Metrics,
        signals: SignalQueue,
        reload_config: Callable[[], ServeConfig] | None = None,
        gateway: GatewayProcess | None = None,
    ) -> None:
        # The OIP gateway beside this daemon (protocol.launch); where SIGHUP re-reads the configuration.
        self.gateway, self.reload_config = gateway, reload_config
        self.metrics, self.signals, self.profiles = metrics, signals, started.profiles
        (self.reconciler, self.dispatcher, self.batcher, self.frontend, self.adaptation, self.state,
         self.supervisor) = assemble(config, started, context, metrics, status=self.status)  # fmt: skip
        self.board = Board(config, Served.at_start(started), self.reconciler, self.dispatcher, self.adaptation,
                           self.state, metrics, splitter_for)  # fmt: skip
        self.tenancy = Tenancy(self.board, self.batcher)  # its share of the machine (`packrat coordinate`)
        self.drain_deadline: float | None = None  # set by the first stop signal
        self.measuring = started.measuring  # the candidates measured in the background (startup.Measuring)
        self.measured = MeasuredSwitch(self.board, self.frontend, started.measuring)  # the switch to their choice
        self.watchdog = Watchdog.from_environment(config.startup_timeout_s)  # systemd's WatchdogSec=, if set
        endpoint = control_endpoint(config.control, config.run_dir or started.served.backend.run_dir)
        self.control = Control(self.board, self.tenancy, context, endpoint)
        periodic = (
            lambda now: self.watchdog.tick(now, self.reconciler.converged),
            lambda _now: self.control.tick(),  # `packrat reconfigure`: the requests the loop read
            self.board.tick,  # the state file's periodic write
            lambda _now: self.frontend.forget_departed(),  # clients gone: their queued requests dropped
            self.batcher.inbox.trim,  # a burst's spare shared memory given back once idle
            self.measured.tick,  # the background measurement's outcome: a switch of runtime, precision or plan
        )
        self.core = LoopCore(self.batcher, self.supervisor, self.adaptation, self.frontend.reply_error,
                             self.board.switch, self.board.current, periodic, metrics.batch_started)  # fmt: skip

    @property  # what is served is the board's: these read it there for the reload, and set it through it
    def config(self) -> ServeConfig:
        return self.board.config

    @config.setter
    def config(self, config: ServeConfig) -> None:
        self.board.config = config

    @property
    def profile(self) -> Profile | None:
        return self.board.served.profile

    @profile.setter
    def profile(self, profile: Profile | None) -> None:
        self.board.reconfigured(self.board.config, self.board.served.policy, profile)

    @property
    def policy(self) -> Policy:
        return self.board.served.policy

    @policy.setter
    def policy(self, policy: Policy) -> None:
        self.board.reconfigured(self.board.config, policy, self.board.served.profile)

    @property
    def info(self) -> ModelInfo:
        return self.board.served.info

    @property
    def topology(self) -> Topology:
        return self.board.served.topology

    def switch(self, plan: Plan, reason: str, backend: Backend | None = None) -> int:
        return self.board.switch(plan, reason, backend)

    def start(self) -> None:
        """Wait for the plan's workers, then open the frontend and tell systemd."""
        log.info("plan %s — %s", self.board.plan.describe(), self.board.plan.reason)
        self.supervisor.wait_converged(self.config.startup_timeout_s, lambda: self.signals.interrupting)
        self.metrics.plan_changed(self.board.plan, "start", self.reconciler.planned_workers)
        reserved = self.batcher.reserve_inbox(self.frontend.sample_bytes)
        if reserved:
            log.info("inbox: %.0f MiB of shared memory paged in for requests of up to %d inputs",
                     reserved / 2**20, self.batcher.max_batch)  # fmt: skip
        self.frontend.open()
        log.info("serving on %s with %d worker(s)", self.config.endpoint, len(self.reconciler.serving()))
        while self.gateway is not None and not self.gateway.serving and not self.signals.interrupting:
            time.sleep(0.05)  # ready only with every frontend: a gateway that died meanwhile is starting again
        sd_notify(READY)
        if self.measuring is not None:  # only now: the first answer's workers warmed up on an unloaded machine
            self.measuring.start()

    # -- main loop ---------------------------------------------------------------------------
    def run(self) -> None:
        """Poll; act on signals; read requests; pump the workers' messages; tick; return once drained."""
        frontend, wake = self.frontend.socket, self.signals.wake_r.fileno()
        events = self.signals.events
        # zmq_poll itself, not zmq.Poller: the loop wakes twice per request and Poller.poll adds a layer.
        control = self.control.socket  # `packrat reconfigure`: its requests are queued, acted on in the tick
        own = self.metrics.own_times  # where the loop's time goes, phase by phase (docs/metrics.md)
        pool, polled = self.reconciler.pool, cast("tuple[Backend, ...]", ())
        while True:
            if pool.backends != polled:  # a change of runtime added a template, or an older one was closed
                polled = pool.backends
                sockets = {b.socket for b in polled}  # each template's workers answer on its own socket
                templates = {b.template_fd for b in polled} - {None}  # readable once one exited: TemplateLost
                items = [(frontend, zmq.POLLIN), (wake, zmq.POLLIN), (control, zmq.POLLIN)]
                items += [(item, zmq.POLLIN) for item in (*sockets, *templates)]
            ready = {item for item, _ in zmq.zmq_poll(items, self._poll_timeout_ms())}
            if templates & ready:
                pool.check_template()
            if wake in ready:
                self.signals.wake_r.recv(4096)
            while events:
                if not self._on_signal(events.popleft()):
                    return
            if frontend in ready:
                started = time.perf_counter()
                messages = self.frontend.read()
                own.add("read", time.perf_counter() - started, messages)
            if sockets & ready:
                started, busy = time.perf_counter(), self.dispatcher.busy
                self.supervisor.pump(0, waiting=polled[0].socket in ready)
                own.add("answer" if busy and not self.dispatcher.busy else "workers", time.perf_counter() - started)
            if control in ready:
                self.control.read()
            self.core.tick(time.monotonic())
            if self.drain_deadline is not None and self._drained():
                return

    def _on_signal(self, event: str) -> bool:
        """Act on one signal's event; False: exit at once."""
        if event == "reload":
            self._reload()
        elif event != "stop":  # status (SIGUSR1) or an ignored signal: a log line (signals' table)
            self.signals.note(event, self.status)
        elif self.drain_deadline is not None:
            log.warning("second stop signal: exiting without draining")
            return False
        else:  # the gateway drains first, through the frontend, which accepts until it has gone (`_drained`)
            if self.gateway is not None:
                self.gateway.begin_stop()
            self.drain_deadline = time.monotonic() + self.config.drain_timeout_s
            sd_notify(STOPPING)
            log.info("draining: finishing queued requests (up to %.0f s)", self.config.drain_timeout_s)
        return True

    def _drained(self) -> bool:
        """Draining: True once the gateway has gone and nothing is queued or running (aside too), or the deadline
        passed (close() answers the rest)."""
        if self.frontend.accepting and (self.gateway is None or self.gateway.gone()):
            self.frontend.accepting = False  # what the gateway took is queued or answered: refuse new work now
        if not self.frontend.accepting and not self.dispatcher.holds_work and not self.batcher.queue:
            return True
        if self.drain_deadline is not None and time.monotonic() > self.drain_deadline:
            log.warning("drain deadline passed; answering what is left with SHUTTING_DOWN")
            return True
        return False

    def _poll_timeout_ms(self) -> int:
        """Wake for the next batch that falls due, or the in-flight batch's next deadline (a slice's or a
        request's), else at least every 250 ms for the periodic work."""
        due = self.core.next_wake()
        if due is None or due == math.inf:
            return 250
        return min(250, max(0, math.ceil((due - time.monotonic()) * 1000)))

    def status(self) -> dict[str, Any]:
        """The `status` reply (control.status), read now; never on the request path."""
        gateway = None if self.gateway is None else self.gateway.status()
        override, choice, share = self.control.override, self.measured.status(), self.tenancy.status()
        return live_status(snapshot(self.board, self.batcher, self.frontend, override, choice, share, gateway))

    def _reload(self) -> None:
        """SIGHUP: re-read, re-check, re-plan and apply the live settings (packrat_daemon.reload); the outcome is
        handed back here. A configuration that cannot be planned changes nothing: the daemon serves on as before."""

        def hand_over(new: reload.Replanned) -> None:
            self.config, self.policy, self.profile = new.config, new.policy, new.profile
            self.switch(new.plan, "reload")
            self.adaptation.retune(new.config, new.policy, new.profile)

        read = self.reload_config or (lambda: self.config)
        serving = reload.Serving(self.config, self.info.runtime, self.profile, self.topology, read, hand_over)
        reload.reload(serving, reload.Owners(self.batcher, self.dispatcher, self.watchdog, self.metrics, self.profiles))

    # -- shutdown ----------------------------------------------------------------------------
    def close(self) -> None:
        """Answer every request still here, close the frontend, keep what production taught us
        (--save-profile), stop the workers."""
        # First: no request waits unanswered on the slower steps below.
        self.frontend.answer_all_and_close(self.batcher.drain() + self.dispatcher.abandon())
        self.control.close()
        learned = self.adaptation.learned(self.profile, self.board.plan, self.config.model, self.info.runtime)
        if learned is not None and self.profiles.save(learned):
            log.info("profile with production timings saved to %s (%d cells)", self.profiles.path, len(learned))
        self.board.save("stop")
        # Each template stops its children in order (SIGTERM, then SIGKILL after a grace period).
        self.reconciler.pool.close()
        if self.measuring is not None:  # after the pool: a template it serves from may be the measuring thread's
            self.measuring.close()
