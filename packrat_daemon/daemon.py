"""The daemon: start-up, one main loop, staged shutdown (after uvicorn's server and gunicorn's arbiter).

One thread runs everything: the frontend ROUTER, the internal backend ROUTER, the control socket and a
wake-up pipe for signals are polled together. Signal handlers only enqueue an event and wake the loop
(`signals`); the loop acts on the queue between two polls, then reads what came and ticks the loop core
(`loop`: expire, check, dispatch, adapt), which `packrat simulate` runs too. Start-up is in `startup`, the
clients' side in `requests.frontend`, the workers' side in `fleet.supervisor`, adaptation in `adapt.online`.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, cast

import zmq

from packrat_daemon import reload
from packrat_daemon.config import ServeConfig
from packrat_daemon.control.server import Control, Planning, Share, control_endpoint
from packrat_daemon.control.status import Snapshot, live_status
from packrat_daemon.fleet.pool import WorkerState
from packrat_daemon.loop import LoopCore
from packrat_daemon.measure import emulation
from packrat_daemon.ops.metrics import Metrics
from packrat_daemon.ops.notify import READY, STOPPING, Watchdog, sd_notify
from packrat_daemon.protocol.launch import GatewayProcess
from packrat_daemon.signals import SignalQueue
from packrat_daemon.startup import Started, distribution_for
from packrat_daemon.wire.errors import PolicyError
from packrat_daemon.wiring import assemble, splitter_for
from policies.base import Plan, Policy
from policies.planning.cores import CoreAllocator

if TYPE_CHECKING:
    from packrat_daemon.fleet.backend import Backend, ModelInfo
    from packrat_daemon.fleet.reconciler import Reconfiguration

log = logging.getLogger("packrat.daemon")


class Daemon:
    """The running daemon: the parts `wiring.assemble` builds, those that need the daemon itself (the loop
    core, the control channel, the `status` reply), and the loop that drives them. It is the control
    channel's `Switchboard`: the plan, the policy and the profile it serves change through `switch`,
    `set_policy` and a reload only."""

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
        self.config, self.gateway = config, gateway  # the OIP gateway beside this daemon (protocol.launch)
        self.reload_config = reload_config  # SIGHUP re-reads the configuration through this
        self.topology, self.metrics, self.signals = started.topology, metrics, signals
        # The whole machine, which a share (--cpus, `packrat coordinate`'s assign) is a part of.
        self.machine = emulation.topology(config) if config.cpus else started.topology
        self.share = Share.initial(self.topology, "--cpus" if config.cpus else "every usable CPU")
        self.moves = 0
        metrics.share_assigned(self.topology.usable_cores, moved=False)
        self.policy, self.profiles = started.policy, started.profiles
        self.backend, self.info = started.served.backend, started.served.info
        self.profile, self.plan = started.served.profile, started.served.plan
        (self.reconciler, self.dispatcher, self.batcher, self.frontend, self.adaptation, self.state,
         self.supervisor) = assemble(config, started, context, metrics, status=self.status)  # fmt: skip
        self.drain_deadline: float | None = None  # set by the first stop signal
        self.measuring = started.measuring  # the candidates measured in the background (startup.Measuring)
        self.next_info: ModelInfo | None = None  # the runtime switched to, said in `info` once it alone serves
        self.watchdog = Watchdog.from_environment(config.startup_timeout_s)  # systemd's WatchdogSec=, if set
        self.control = Control(self, context, control_endpoint(config.control, config.run_dir or self.backend.run_dir))
        periodic = (
            lambda now: self.watchdog.tick(now, self.reconciler.converged),
            lambda _now: self.control.tick(),  # `packrat reconfigure`: the requests the loop read
            lambda now: self.state.tick(self, now),
            lambda _now: self.frontend.forget_departed(),  # clients gone: their queued requests dropped
            self.batcher.inbox.trim,  # a burst's spare shared memory given back once idle
            self._measured,  # the background measurement's outcome: a switch of runtime, precision or plan
        )
        self.core = LoopCore(self.batcher, self.supervisor, self.adaptation, self.frontend.reply_error, self.switch,
                             lambda: (self.plan, self.profile), periodic, metrics.batch_started)  # fmt: skip

    def start(self) -> None:
        """Wait for the plan's workers, then open the frontend and tell systemd."""
        log.info("plan %s — %s", self.plan.describe(), self.plan.reason)
        self.supervisor.wait_converged(self.config.startup_timeout_s, lambda: self.signals.interrupting)
        self.metrics.plan_changed(self.plan, "start", self.reconciler.planned_workers)
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

    # -- reconfiguration (the control channel's Switchboard) ---------------------------------------
    def switch(self, plan: Plan, reason: str, backend: Backend | None = None) -> int:
        """Hand a new plan to the reconciler (the supervisor looks at the new generation on the next check);
        the dispatcher splits by its layouts from now on. `backend`: another runtime's template to fork it from.
        Returns the generation that will serve it."""
        self.plan = plan
        predicted = self.adaptation.predicted(self.reconciler.plan, plan, time.monotonic())
        self.reconciler.set_plan(plan, reason, predicted, backend=backend)
        self.metrics.plan_changed(plan, reason, self.reconciler.planned_workers)
        profile = self.adaptation.planning_profile(self.profile)
        self.dispatcher.splitter = splitter_for(profile, plan, self.reconciler.layouts, self.config)
        self.state.save(self, reason)
        return self.reconciler.generation

    def set_policy(self, policy: Policy) -> None:
        self.policy = policy
        self.adaptation.retune(self.config, policy, self.profile)

    def planning(self) -> Planning:
        return Planning(self.profile, self.topology, self.adaptation.estimator.distribution(time.monotonic()))

    def reconfiguration(self, generation: int) -> Reconfiguration | None:
        return next((record for record in self.reconciler.history if record.generation == generation), None)

    # -- the share of the machine (`packrat coordinate`, docs/colocation.md) -------------------------
    def assign(self, cpus: Sequence[int], plan: Plan | None, reason: str, gain: float | None = None) -> int | None:
        """Serve on `cpus` only from now on, with `plan`, else the policy's plan inside them: the allocator and
        adaptation get the restricted topology and the reconciler switches (no request fails). Returns the
        generation that will serve it, None when nothing changes. Raises (TopologyError, PolicyError) before
        anything changed when the CPUs are not this machine's usable ones or the plan does not fit them."""
        share = self.machine.restricted(cpus)
        if plan is None:
            profile = self.adaptation.tuner.profile if self.adaptation.tuner is not None else self.profile
            distribution = self.adaptation.estimator.distribution(time.monotonic()) or distribution_for(self.config)
            plan = self.policy.plan(profile, share, distribution)
        why = plan.misfit(share, self.config.max_batch)
        if why is not None:
            raise PolicyError(
                f"the plan {plan.describe()} does not fit the {share.usable_cores} core(s) assigned: {why}; "
                "assign more CPUs or a plan of fewer threads (leave the plan out to have this daemon's policy plan)"
            )
        moved = share.cpu_ids != self.topology.cpu_ids
        if not moved and plan == self.plan:
            self.share = dataclasses.replace(self.share, by=reason)  # the same CPUs, now the coordinator's
            return None
        self.topology = share
        self.reconciler.allocator = CoreAllocator(share)
        self.adaptation.restrict(share, time.monotonic())
        generation = self.switch(plan, f"assign: {reason}")
        if moved:
            self.moves += 1
            self.metrics.share_assigned(share.usable_cores, moved=True)
            self.share = Share.assigned(share, reason, generation, gain, self.share)
            log.info("share: %s (%s); plan %s", self.share.describe(), reason, plan.describe())
        return generation

    def vacated(self) -> bool:
        """No worker of this daemon, serving, parked, switching or still stopping, holds a CPU outside its share:
        the cores given away are free for the model they go to."""
        share = set(self.topology.cpu_ids)
        return all(
            set(w.cores) <= share and (w.pending is None or set(w.pending[1]) <= share)
            for w in self.reconciler.pool.workers.values()
            if w.state is not WorkerState.DEAD
        )

    def demand(self) -> dict[str, Any]:
        """What a coordinator plans this model from: its profile, the live batch sizes and their rate, its share."""
        now = time.monotonic()
        estimator = self.adaptation.estimator
        profile = self.adaptation.tuner.profile if self.adaptation.tuner is not None else self.profile
        distribution = estimator.distribution(now)
        batches_per_s, inputs_per_s = estimator.rates(now)
        return {
            "model": self.config.model,
            "runtime": self.info.runtime,
            "profile": None if profile is None else profile.to_csv(),
            "batch_sizes": [] if distribution is None else [[b, w] for b, w in distribution.weights],
            "batches_per_s": batches_per_s,
            "inputs_per_s": inputs_per_s,
            # Cumulative counts at `now_s` (this daemon's monotonic clock) and the queue at that instant: the
            # coordinator's own estimate of the offered rate (packrat_daemon.coordinate.watch) reads these.
            "now_s": now,
            "arrived_requests": self.batcher.arrived_requests,
            "arrived_inputs": self.batcher.arrived_inputs,
            "queued_inputs": self.batcher.queued_inputs,
            "max_batch": self.config.max_batch,
            "policy": self.policy.name,
            "plan": self.plan.to_json(),
            "share": self.share.to_json(),
            "machine_cpus": list(self.machine.cpu_ids),
            "vacated": self.vacated(),
        }

    def status(self) -> dict[str, Any]:
        """The `status` reply (control.status), read now; never on the request path."""
        now = time.monotonic()
        reconciler, estimator, batcher = self.reconciler, self.adaptation.estimator, self.batcher
        batches_per_s, inputs_per_s = estimator.rates(now)
        snapshot = Snapshot(
            info=self.frontend.describe(), runtime=self.info.runtime,
            workers=reconciler.pool.live(), serving=frozenset(w.id for w in reconciler.serving()),
            generation=reconciler.generation, history=list(reconciler.history),
            policy=self.policy.name, adapting=self.adaptation.tuner is not None,
            adapt_interval_s=self.adaptation.interval_s, override=self.control.override,
            distribution=estimator.distribution(now), batches_per_s=batches_per_s, inputs_per_s=inputs_per_s,
            half_life_s=estimator.half_life_s, queued_requests=len(batcher.queue), queued_inputs=batcher.queued_inputs,
            max_queued_inputs=batcher.max_queued_inputs, batch_in_flight=self.dispatcher.busy,
            accepting=self.frontend.accepting, profile=self.state.provenance(self, now),
            runtime_choice=self._choice_status(),
            share=self.share.to_json(moves=self.moves),
            gateway=None if self.gateway is None else self.gateway.status(),
        )  # fmt: skip
        return live_status(snapshot)

    def _measured(self, _now: float) -> None:
        """Switch to what the background measurement chose (startup.Measuring): the state file keeps what it
        measured and its choice; the plan (on the new runtime's template, if it won) goes to the reconciler. The
        `info` reply says the new runtime once no worker of the old one serves."""
        pool = self.reconciler.pool
        if self.next_info is not None:
            serving = self.reconciler.serving()
            if serving and all(pool.via(worker) is pool.backend for worker in serving):
                self.info = self.frontend.info = self.next_info
                self.next_info = None
                guard = "not needed" if self.info.guard is None else "passed"
                self.metrics.served(self.info.runtime, self.info.precision, guard)
                log.info("serving %s at %s (accuracy guard: %s)", self.info.runtime, self.info.precision, guard)
            return
        done = None if self.measuring is None else self.measuring.take()
        if done is None:
            return
        chosen = done.candidate
        for key, entry in done.entries.items():
            self.state.record(key, entry)
        self.state.choice, self.state.served_key = done.choice, chosen.key
        self.profile = chosen.profile
        self.adaptation.retune(self.config, self.policy, chosen.profile)
        backend = None if done.same_template else chosen.backend
        log.info("switching to %s on %s: measured fastest while %s served (%s)",
                 chosen.key, chosen.plan.describe(), self.info.runtime, done.reason)  # fmt: skip
        self.switch(chosen.plan, f"runtime: {chosen.key}", backend)
        if backend is not None:
            self.next_info = chosen.info

    def _choice_status(self) -> dict[str, Any] | None:
        """`packrat status`'s runtime choice: the background measurement's while it runs, then the state's."""
        if self.measuring is not None and not self.measuring.done:
            return self.measuring.status()
        choice = self.state.choice_status()
        if choice is not None and self.measuring is not None:
            choice["still_measuring"] = []
            choice["switching"] = self.next_info is not None
        return choice

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
        learned = self.adaptation.learned(self.profile, self.plan, self.config.model, self.info.runtime)
        if learned is not None and self.profiles.save(learned):
            log.info("profile with production timings saved to %s (%d cells)", self.profiles.path, len(learned))
        self.state.save(self, "stop")
        # Each template stops its children in order (SIGTERM, then SIGKILL after a grace period).
        self.reconciler.pool.close()
        if self.measuring is not None:  # after the pool: a template it serves from may be the measuring thread's
            self.measuring.close()
