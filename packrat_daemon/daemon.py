"""The daemon: start-up, one main loop, staged shutdown (after uvicorn's server and gunicorn's arbiter).

One thread runs everything: the frontend ROUTER, the internal backend ROUTER and a wake-up pipe
for signals are polled together. Signal handlers only enqueue; the loop acts on the queue.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import signal
import socket as pysocket
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import zmq

from packrat_daemon.adapt.estimator import BatchSizeEstimator
from packrat_daemon.adapt.production import ProductionProfile
from packrat_daemon.adapt.tuner import Tuner, TunerSettings
from packrat_daemon.backend import Backend, ModelInfo
from packrat_daemon.batcher import Batcher, Request
from packrat_daemon.config import ServeConfig
from packrat_daemon.dispatcher import Completed, Dispatcher, Splitter
from packrat_daemon.measure.confirm import PlanTiming, SideBySide
from packrat_daemon.measure.profiler import CellProfiler, default_grid
from packrat_daemon.measure.split_check import SplitDecision, measured_profile, split_decisions
from packrat_daemon.metrics import Metrics
from packrat_daemon.pool import Pool, PoolEvent
from packrat_daemon.progress import Progress
from packrat_daemon.reconciler import Reconciler
from packrat_daemon.runtime_choice import RuntimeOption, choose_runtime
from packrat_daemon.wire import protocol
from packrat_daemon.wire.errors import ConfigError, PackratError
from packrat_daemon.wire.zmqio import NOBLOCK, ZERO_COPY_MIN_BYTES, readable, recv_frames, send_frames
from policies.base import Plan
from policies.packrat import plan_batch_latencies
from policies.planning.distribution import BatchDistribution
from policies.planning.profile import Profile, write_profiles
from policies.planning.topology import Topology
from policies.registry import get_policy, policy_options
from workers.messages import numpy_name

log = logging.getLogger("packrat.daemon")

MAX_READS_PER_WAKE = 256
HARD_MESSAGE_SLACK_BYTES = 64 << 20
RECONCILE_INTERVAL_S = 0.1
HEARTBEAT_TIMEOUT_S = 10.0  # bound how long one socket can starve the others


class Daemon:
    def __init__(
        self,
        config: ServeConfig,
        topology: Topology | None = None,
        reload_config: Callable[[], ServeConfig] | None = None,
    ) -> None:
        self.config = config
        self.reload_config = reload_config  # SIGHUP re-reads the configuration through this
        self.topology = topology or Topology.detect()
        self.context = zmq.Context()
        self.backend: Backend | None = None
        self.frontend: zmq.Socket | None = None
        self.info: ModelInfo | None = None
        self.plan: Plan | None = None
        self.profile: Profile | None = None
        self.events: deque[str] = deque()  # filled by signal handlers, drained by the loop
        self._wake_r, self._wake_w = pysocket.socketpair()
        self.state = "starting"
        self.metrics = Metrics(config.model)
        self._saved_profiles: list[Profile] = []
        self._pool_changed = True
        self._serving: list[Any] = []  # the reconciler's serving workers, refreshed in _tick
        self._next_reconcile = 0.0
        self._next_tune = 0.0
        self._next_template_check = 0.0

    # -- start-up ----------------------------------------------------------------------------
    def start(self) -> None:
        config = self.config
        self._install_signals()
        if config.metrics_port:  # first: a port clash should fail before minutes of profiling
            self.metrics.serve(config.metrics_port, config.metrics_address)
            log.info("metrics on http://%s:%d/metrics", config.metrics_address, config.metrics_port)
        log.info("machine: %s", self.topology.describe())
        policy = _policy_for(config)
        runtimes = available_runtimes() if config.runtime == "auto" else [config.runtime]
        measure = policy.needs_profile or len(runtimes) > 1
        candidates: list[tuple[Backend, ModelInfo, Profile | None, Plan]] = []
        try:
            for runtime in runtimes:
                candidates.append(self._prepare_runtime(runtime, policy, measure))
        except BaseException:
            for candidate in candidates:
                candidate[0].close()
            raise
        # --runtime auto: serve with the runtime whose plan predicts the lowest latency (runtime_choice).
        choice = choose_runtime([_runtime_option(c[1].runtime, c[3], c[2], config) for c in candidates])
        best = next(c for c in candidates if c[1].runtime == choice.runtime)
        for candidate in candidates:
            if candidate is not best:
                candidate[0].close()
        self.backend, self.info, self.profile, self.plan = best
        if len(candidates) > 1:
            log.info("runtime auto: chose %s (%s)", self.info.runtime, choice.reason)
        if policy.name == "packrat" and config.split_check_rounds > 0 and self.profile is not None:
            self._check_splits(policy)
        self.sample_bytes = _sample_bytes(self.info)
        log.info("plan %s — %s", self.plan.describe(), self.plan.reason)
        self.pool = Pool(self.backend, warmup=(1,))
        self.reconciler = Reconciler(self.pool, self.topology)
        self.reconciler.set_plan(self.plan)
        self.dispatcher = Dispatcher(self.backend.send, self._splitter(self.profile, self.plan), config.job_timeout_s)
        self.batcher = Batcher(config.max_batch, config.max_delay_ms / 1000.0, config.max_queue)
        self.estimator = BatchSizeEstimator()
        self.production = ProductionProfile()
        self.tuner = self._make_tuner(policy, config)
        self._wait_converged()
        self.frontend = self.context.socket(zmq.ROUTER)
        self.frontend.setsockopt(zmq.LINGER, 0)
        self.frontend.setsockopt(zmq.ROUTER_MANDATORY, 0)  # a vanished client must not stall the daemon
        # Messages a little over the limit get a TOO_LARGE answer from the parser; ZeroMQ itself cuts
        # off a peer that sends far more, so a hostile client can never make the daemon buffer gigabytes.
        limit = self._max_message_bytes()
        self.frontend.setsockopt(zmq.MAXMSGSIZE, max(4 * limit, limit + HARD_MESSAGE_SLACK_BYTES))
        self.metrics.plan_changed(self.plan, "start")
        self.frontend.bind(config.endpoint)
        self.state = "serving"
        log.info("serving on %s with %d worker(s)", config.endpoint, len(self.reconciler.serving()))
        _sd_notify("READY=1\nSTATUS=serving")

    def _prepare_runtime(
        self, runtime: str, policy: Any, measure: bool
    ) -> tuple[Backend, ModelInfo, Profile | None, Plan]:
        """Start a template for `runtime`, get its profile (file or measured) and the policy's plan."""
        config = self.config
        run_dir = None if config.run_dir is None else os.path.join(config.run_dir, runtime)
        backend = Backend(self.context, run_dir)
        try:
            log.info("loading %s in the %s template process", config.model, runtime)
            backend.start_template(
                config.model, input_override=config.input, runtime=runtime, allocator=config.allocator
            )
            info = backend.wait_template(config.startup_timeout_s)
            log.info("model %s: input %s %s per sample", config.model, info.dtype, list(info.shape))
            profile = self._load_or_measure_profile(backend, info, measure)
            plan = policy.plan(profile, self.topology, _distribution_for(config))
        except BaseException:
            backend.close()
            raise
        return backend, info, profile, plan

    def _load_or_measure_profile(self, backend: Backend, info: ModelInfo, needed: bool) -> Profile | None:
        config = self.config
        if config.profile:
            profile = Profile.read_csv(config.profile, runtime=info.runtime)
            log.info("profile %s: %d cells for %s", config.profile, len(profile), info.runtime)
            return profile
        if not needed:
            return None
        threads, batches = default_grid(self.topology.usable_cores, max(config.batches or [config.max_batch]))
        cells = [(t, b) for t in threads for b in batches]
        progress = Progress(len(cells), f"profiling {info.runtime}")
        profiler = CellProfiler(backend, self.topology, info)
        measured = {}
        try:
            for t, b in cells:
                if self.events:  # SIGTERM or Ctrl-C during start-up: stop between cells
                    raise KeyboardInterrupt
                measured[(t, b)] = profiler.measure(t, b)
                progress.advance(f"t={t} b={b}: {measured[(t, b)].latency_ms:.1f} ms")
        finally:
            profiler.close()
            progress.close()
        profile = Profile(measured, model=config.model, runtime=info.runtime)
        self._save_profile(profile)
        return profile

    def _save_profile(self, profile: Profile) -> None:
        """With --save-profile, write `profile` in place of its runtime's rows (one file, every runtime)."""
        if not self.config.save_profile:
            return
        self._saved_profiles = [p for p in self._saved_profiles if p.runtime != profile.runtime] + [profile]
        write_profiles(self.config.save_profile, self._saved_profiles)
        log.info("profile saved to %s", self.config.save_profile)

    def _check_splits(self, policy: Any) -> None:
        """Run each batch size the plan would split both ways side by side; plan again on what was measured."""
        assert self.backend is not None and self.info is not None and self.profile is not None
        assert self.plan is not None
        config = self.config
        distribution = _distribution_for(config)
        cores = self.topology.usable_cores
        decisions = split_decisions(self.profile, self.plan, distribution, cores, config.min_split_gain)
        if not decisions:
            return
        bench = SideBySide(self.backend, self.topology, self.info)
        progress = Progress(len(decisions), "checking splits side by side")

        def measured(decision: SplitDecision, split: PlanTiming, alone: PlanTiming) -> None:
            log.info(
                "split check at %s: split %.1f ms, one instance %.1f ms (medians of %d interleaved rounds)",
                decision.describe(), split.latency_ms, alone.latency_ms, split.rounds,
            )  # fmt: skip
            progress.advance(
                f"batch {decision.batch}: split {split.latency_ms:.1f} ms, alone {alone.latency_ms:.1f} ms"
            )
            if self.events:  # SIGTERM or Ctrl-C during start-up: stop between checks
                raise KeyboardInterrupt

        try:
            profile = measured_profile(self.profile, decisions, bench.compare, config.split_check_rounds, measured)
        finally:
            bench.close()
            progress.close()
        plan = policy.plan(profile, self.topology, distribution)
        if plan.layouts != self.plan.layouts:
            log.info("split check changed the plan: %s → %s", self.plan.describe(), plan.describe())
        self.profile, self.plan = profile, plan
        self._save_profile(profile)

    def _wait_converged(self) -> None:
        deadline = time.monotonic() + self.config.startup_timeout_s
        while not self.reconciler.converged():
            if time.monotonic() > deadline:
                raise ConfigError(f"the workers did not become ready within {self.config.startup_timeout_s:.0f} s")
            if self.events:
                raise KeyboardInterrupt
            self.reconciler.step()
            self._pump_backend(200)

    # -- main loop ---------------------------------------------------------------------------
    def run(self) -> None:
        assert self.frontend is not None and self.backend is not None
        frontend, backend, wake = self.frontend, self.backend.socket, self._wake_r.fileno()
        # zmq_poll itself, not zmq.Poller: the loop wakes twice per request and Poller.poll adds a layer.
        items = [(frontend, zmq.POLLIN), (backend, zmq.POLLIN), (wake, zmq.POLLIN)]
        drain_deadline: float | None = None
        while True:
            ready = {item for item, _ in zmq.zmq_poll(items, self._poll_timeout_ms())}
            if wake in ready:
                self._wake_r.recv(4096)
            while self.events:
                event = self.events.popleft()
                if event == "reload":
                    self._reload()
                elif event == "stop":
                    if self.state == "draining":
                        log.warning("second stop signal: exiting without draining")
                        return
                    self.state = "draining"
                    drain_deadline = time.monotonic() + self.config.drain_timeout_s
                    _sd_notify("STOPPING=1")
                    log.info("draining: finishing queued requests (up to %.0f s)", self.config.drain_timeout_s)
            if frontend in ready:
                self._read_frontend()
            if backend in ready:
                self._pump_backend(0, waiting=True)
            self._tick()
            if self.state == "draining" and not self.dispatcher.busy and not self.batcher.queue:
                return
            if drain_deadline is not None and time.monotonic() > drain_deadline:
                log.warning("drain deadline passed; answering what is left with SHUTTING_DOWN")
                for request in self.batcher.drain() + self.dispatcher.abandon():
                    self._reply_error(request, protocol.ErrorCode.SHUTTING_DOWN, "the server is shutting down")
                return

    def _poll_timeout_ms(self) -> int:
        """Wake for the next batch that falls due, else at least every 250 ms for the periodic work."""
        due = None if self.dispatcher.busy else self.batcher.next_due()
        if due is None:
            return 250
        return min(250, max(0, int((due - time.monotonic()) * 1000)))

    def _tick(self) -> None:
        now = time.monotonic()
        if self.batcher.queue:
            for request in self.batcher.expire(now):
                message = "the request's timeout passed while it was queued"
                self._reply_error(request, protocol.ErrorCode.TIMEOUT, message)
        if self._pool_changed or now >= self._next_reconcile:
            # Walking the pool and the jobs runs every RECONCILE_INTERVAL_S, or at once when the pool
            # changed: job timeouts are seconds long, and this loop wakes twice per request.
            self._pool_changed = False
            self._next_reconcile = now + RECONCILE_INTERVAL_S
            for worker in self.dispatcher.overdue(now):
                log.warning("worker %d (%d threads) did not answer in time; replacing it", worker.id, worker.threads)
                self.pool.kill(worker)
                self._on_lost(worker)
            self._reap_silent_workers(now)
            self.reconciler.step()
            # Every change to the pool passes through this block (events set _pool_changed), so the list
            # of serving workers is refreshed here rather than rebuilt for every batch.
            self._serving = self.reconciler.serving()
            self.metrics.queued.set(self.batcher.queued_inputs)
            self.metrics.workers.set(len(self._serving))
        if not self.dispatcher.busy and self.batcher.due(now):
            workers = self._serving
            if workers:
                batch = self.batcher.take()
                self.dispatcher.dispatch(batch, workers)
                # Bookkeeping after the send: the workers start meanwhile.
                rows = sum(r.samples for r in batch)
                self.estimator.observe(rows, now)
                self.metrics.batch_size.observe(rows)
        if self.tuner is not None and now >= self._next_tune:
            self._next_tune = now + self.config.adapt_interval_s
            self._adapt(now)

    def _reap_silent_workers(self, now: float) -> None:
        """An idle worker heartbeats every second; one silent for HEARTBEAT_TIMEOUT_S is hung: replace it.

        A worker busy with a slice cannot heartbeat (it computes on its only Python thread); the job
        timeout covers that case.
        """
        busy = {job.worker.id for job in self.dispatcher.jobs.values()}
        for worker in self.pool.ready():
            if worker.id not in busy and now - worker.last_seen > HEARTBEAT_TIMEOUT_S:
                log.warning("worker %d sent no heartbeat for %.0f s; replacing it", worker.id, now - worker.last_seen)
                self.pool.kill(worker)

    # -- frontend ----------------------------------------------------------------------------
    def _read_frontend(self) -> None:
        assert self.frontend is not None and self.info is not None
        limit = self._max_message_bytes()  # max_batch changes only on reload, between wakes
        for reads in range(MAX_READS_PER_WAKE):
            # The poll reported the first message; after it, EVENTS is far cheaper than a receive that
            # raises zmq.Again once the queue is empty.
            if reads and not readable(self.frontend):
                return
            try:
                frames = recv_frames(self.frontend, NOBLOCK)
            except zmq.Again:
                return
            identity = frames[0].bytes
            try:
                delimiter, request = protocol.parse_request(frames[1:], max_message_bytes=limit)
            except protocol.ProtocolError as exc:
                self.metrics.count(exc.code)
                reply = protocol.encode_error(exc.request_id, exc.code, exc.message)
                self._send_frontend(identity, exc.delimiter, reply)
                continue
            if isinstance(request, protocol.InfoRequest):
                self._send_frontend(identity, delimiter, protocol.encode_info(request.request_id, self._info()))
                continue
            if self.state != "serving":
                self.metrics.count(protocol.ErrorCode.SHUTTING_DOWN)
                reply = protocol.encode_error(
                    request.request_id, protocol.ErrorCode.SHUTTING_DOWN, "the server is shutting down; retry elsewhere"
                )
                self._send_frontend(identity, delimiter, reply)
                continue
            try:
                protocol.check_against_model(request, self.info.dtype, self.info.shape, self.config.max_batch)
            except protocol.ProtocolError as exc:
                self.metrics.count(exc.code)
                self._send_frontend(identity, delimiter, protocol.encode_error(request.request_id, exc.code, str(exc)))
                continue
            now = time.monotonic()
            deadline = None if request.timeout_ms is None else now + request.timeout_ms / 1000.0
            queued = Request(
                identity, delimiter, request.request_id, request.dtype, request.shape, request.payload, now, deadline
            )
            if not self.batcher.offer(queued):
                message = f"the queue is full ({self.batcher.queued_inputs} inputs waiting); retry later"
                self._reply_error(queued, protocol.ErrorCode.OVERLOADED, message)
            elif self.batcher.queued_inputs >= self.batcher.max_batch and not self.dispatcher.busy:
                return  # a full batch can start now; the loop reads the rest right after dispatching it

    def _info(self) -> dict[str, Any]:
        assert self.info is not None and self.plan is not None
        return {
            "versions": list(protocol.SUPPORTED_VERSIONS),
            "model": self.config.model,
            "input": {"dtype": self.info.dtype, "shape": list(self.info.shape), "high": self.info.high},
            "runtime": self.info.runtime,
            "max_batch": self.config.max_batch,
            "plan": self.plan.to_json(),
            "template_pid": self.info.template_pid,
            "workers": [
                {"id": w.id, "pid": w.pid, "threads": w.threads, "cores": list(w.cores)}
                for w in self.reconciler.serving()
            ],
        }

    def _send_frontend(self, identity: bytes, delimiter: bytes | None, frames: list[Any], large: bool = False) -> None:
        """Answer a client; `large`: the last frame is a result tensor big enough for zero-copy to pay."""
        assert self.frontend is not None
        try:
            send_frames(self.frontend, [identity, *frames] if delimiter is None else [identity, delimiter, *frames],
                        copy=not large)  # fmt: skip
        except zmq.ZMQError as exc:
            log.debug("could not answer a client: %s", exc)

    def _reply_error(self, request: Request, code: protocol.ErrorCode, message: str) -> None:
        self.metrics.count(code)
        self._send_frontend(
            request.identity, request.delimiter, protocol.encode_error(request.request_id, code, message)
        )

    def _reply_result(self, done: Completed) -> None:
        request = done.request
        total_ms = (time.monotonic() - request.arrived) * 1000.0
        output = done.output
        header, payload = protocol.encode_timed_result(
            request.request_id, numpy_name(output.dtype), output.shape, output,
            done.queue_ms, done.compute_ms, total_ms, done.instances,
        )  # fmt: skip
        large = output.nbytes >= ZERO_COPY_MIN_BYTES
        self._send_frontend(request.identity, request.delimiter, [header, payload], large)
        self.metrics.answered_ok(total_ms)

    # -- backend -----------------------------------------------------------------------------
    def _pump_backend(self, timeout_ms: int, waiting: bool = False) -> None:
        """Handle what the workers and template sent; `waiting`: a poll has just reported a message."""
        assert self.backend is not None
        received = self.backend.recv_waiting() if waiting else self.backend.recv(timeout_ms)
        reads = 0
        while received is not None and reads < MAX_READS_PER_WAKE:
            event = self.pool.handle(*received)
            if event is not None:
                self._on_pool_event(event)
                self._pool_changed = self._pool_changed or event.kind != "result"
            reads += 1
            received = self.backend.recv(0)
        if time.monotonic() >= self._next_template_check:
            self._next_template_check = time.monotonic() + RECONCILE_INTERVAL_S
            if not self.pool.template_alive():
                raise TemplateLost("the template process died; the daemon cannot start workers any more")

    def _on_pool_event(self, event: PoolEvent) -> None:
        worker = event.worker
        assert worker is not None
        if event.kind == "result":
            # Answer first, learn after: the client's reply must not wait for bookkeeping.
            for done in self.dispatcher.on_result(worker, event.header, event.payload):
                self._reply_result(done)
            compute_ms = float(event.header["compute_ms"])
            self.metrics.observe_compute(worker.threads, compute_ms)
            self.production.observe(worker.threads, int(event.header["batch"]), compute_ms, time.monotonic())
        elif event.kind == "failed":
            message = event.header.get("message", "the model failed")
            log.error("worker %d failed a batch: %s", worker.id, message)
            for request in self.dispatcher.abandon():
                self._reply_error(request, protocol.ErrorCode.INTERNAL, f"the model failed on this batch: {message}")
        elif event.kind == "lost":
            log.warning("worker %d (pid %s, %d threads) exited unexpectedly", worker.id, worker.pid, worker.threads)
            self._on_lost(worker)
        elif event.kind == "reconfigured":
            log.info("worker %d now runs %d thread(s) on cores %s", worker.id, worker.threads, list(worker.cores))
        elif event.kind == "ready":
            log.info("worker %d ready: %d thread(s) on cores %s", worker.id, worker.threads, list(worker.cores))

    def _on_lost(self, worker: Any) -> None:
        if self.dispatcher.busy and not self.dispatcher.reassign(worker, self.reconciler.serving()):
            for request in self.dispatcher.abandon():
                self._reply_error(request, protocol.ErrorCode.INTERNAL, "every worker died while serving this batch")

    # -- reconfiguration ---------------------------------------------------------------------
    def _make_tuner(self, policy: Any, config: ServeConfig) -> Tuner | None:
        if not (config.adapt and policy.name == "packrat" and self.profile is not None):
            return None
        return Tuner(policy, self.profile, self.topology, TunerSettings.of(config))

    def _adapt(self, now: float) -> None:
        """Re-plan for the batch sizes clients actually send, if that is predicted to pay."""
        assert self.tuner is not None and self.plan is not None
        distribution = self.estimator.distribution(now)
        if distribution is None:
            return
        # Plan on what production has measured, interference included, over the offline profile.
        self.tuner.profile = self.production.merged_into(self.profile, now) or self.tuner.profile
        try:
            decision = self.tuner.consider(self.plan, distribution, self.estimator.observed, now)
        except PackratError as exc:
            log.warning("adaptation skipped: %s", exc)
            return
        if decision is None:
            return
        sizes = ", ".join(f"{b}: {w:.0%}" for b, w in distribution.weights)
        log.info(
            "adapting to the live batch sizes (%s): predicted %.1f → %.1f ms (offline cells ×%.2f for "
            "production's conditions); plan %s",
            sizes, decision.current_ms, decision.proposed_ms, self.production.conditions_factor(self.profile, now),
            decision.plan.describe(),
        )  # fmt: skip
        self._switch(decision.plan, "adapt")
        self.estimator.reset_count()

    def _switch(self, plan: Plan, reason: str) -> None:
        """Hand a new plan to the reconciler; the dispatcher splits by its layouts from now on."""
        self.metrics.plan_changed(plan, reason)
        self.plan = plan
        self.reconciler.set_plan(plan)
        profile = self.tuner.profile if self.tuner is not None else self.profile
        self.dispatcher.splitter = self._splitter(profile, plan)
        self._pool_changed = True

    def _splitter(self, profile: Profile | None, plan: Plan) -> Splitter:
        """How each batch is divided under `plan`: its layouts as the reconciler keeps them warm."""
        return Splitter(profile, plan.split, self.reconciler.layouts, plan.oversubscribed, self.config.min_split_gain)

    def _reload(self) -> None:
        """SIGHUP: re-read the configuration and profile, re-plan, and let the reconciler converge.

        A bad new configuration is logged and ignored: the daemon keeps serving the current plan.
        """
        try:
            config = self.reload_config() if self.reload_config else self.config
            for name in ("model", "input", "endpoint", "runtime", "allocator", "run_dir"):
                if getattr(config, name) != getattr(self.config, name):
                    log.warning("reload: %s changed; that takes a restart, the running value stays", name)
                    setattr(config, name, getattr(self.config, name))
            if config.max_batch > self.config.max_batch:
                log.warning("reload: max_batch can only shrink without a restart; keeping %d", self.config.max_batch)
                config.max_batch = self.config.max_batch
            policy = _policy_for(config)
            profile = Profile.read_csv(config.profile, runtime=self.info.runtime) if config.profile else self.profile
            plan = policy.plan(profile, self.topology, _distribution_for(config))
        except PackratError as exc:
            log.error("reload failed, still serving the current plan: %s", exc)
            return
        self.config, self.profile, self.plan = config, profile, plan
        self.batcher.max_batch = config.max_batch
        self.batcher.max_delay_s = config.max_delay_ms / 1000.0
        self.batcher.max_queued_inputs = config.max_queue
        log.info("reload: plan %s — %s", plan.describe(), plan.reason)
        self._switch(plan, "reload")
        self.tuner = self._make_tuner(policy, config)

    # -- shutdown ----------------------------------------------------------------------------
    def _save_learned_profile(self) -> None:
        """With --save-profile, keep what production taught us for the next start."""
        if not self.config.save_profile or not hasattr(self, "production") or not self.production.samples:
            return
        if self.plan is not None and self.plan.oversubscribed:
            return  # timings from oversubscribed workers describe the contention, not the cells
        learned = self.production.merged_into(self.profile, time.monotonic())
        if learned is None or learned is self.profile:
            return
        runtime = self.info.runtime if self.info else ""
        learned = Profile(dict(learned.items()), model=self.config.model, runtime=runtime)
        write_profiles(self.config.save_profile, [learned])
        log.info("profile with production timings saved to %s (%d cells)", self.config.save_profile, len(learned))

    def close(self) -> None:
        self.metrics.close()
        self._save_learned_profile()
        if self.frontend is not None:
            self.frontend.close(linger=0)
        if self.backend is not None:
            # The template stops its children in order (SIGTERM, then SIGKILL after a grace period).
            self.backend.close()
        self._wake_r.close()
        self._wake_w.close()
        self.context.term()
        log.info("stopped")

    def _install_signals(self) -> None:
        def enqueue(signum: int, _frame: object) -> None:
            self.events.append("stop")
            with contextlib.suppress(OSError):
                self._wake_w.send(b"\0")

        def enqueue_reload(signum: int, _frame: object) -> None:
            self.events.append("reload")
            with contextlib.suppress(OSError):
                self._wake_w.send(b"\0")

        signal.signal(signal.SIGTERM, enqueue)
        signal.signal(signal.SIGINT, enqueue)
        signal.signal(signal.SIGHUP, enqueue_reload)

    def _max_message_bytes(self) -> int:
        return self.config.max_batch * self.sample_bytes + protocol.MAX_HEADER_BYTES + 1024


def available_runtimes() -> list[str]:
    """Runtimes whose packages are installed, found without importing them (the daemon stays light)."""
    packages = {"torch": "torch", "onnxruntime": "onnxruntime", "openvino": "openvino"}
    return [name for name, package in packages.items() if importlib.util.find_spec(package) is not None]


def _predicted(plan: Plan, profile: Profile | None) -> float:
    """A plan's predicted latency, for choosing between runtimes (unknown sorts last)."""
    if plan.predicted_latency_ms is not None:
        return plan.predicted_latency_ms
    if profile is not None and not plan.oversubscribed:
        lhats = [profile.lhat(i.threads, max(i.batch, 1)) for i in plan.instances]
        if None not in lhats:
            return max(x for x in lhats if x is not None)
    return float("inf")


def _runtime_option(runtime: str, plan: Plan, profile: Profile | None, config: ServeConfig) -> RuntimeOption:
    batch_ms: dict[int, float | None] = {}
    if profile is not None and not plan.oversubscribed and plan.split == "exact":
        batch_ms = dict(plan_batch_latencies(profile, plan, _distribution_for(config)))
    return RuntimeOption(runtime, _predicted(plan, profile), batch_ms)


def _policy_for(config: ServeConfig):  # noqa: ANN202
    return get_policy(config.policy, **policy_options(config.policy, config.plan, config.min_split_gain))


def _distribution_for(config: ServeConfig) -> BatchDistribution:
    return BatchDistribution.from_counts({b: 1.0 for b in (config.batches or [config.max_batch])})


class TemplateLost(ConfigError):
    """The template died; without it no worker can be (re)started."""


def _sample_bytes(info: ModelInfo) -> int:
    count = 1
    for dim in info.shape:
        count *= dim
    return count * protocol.DTYPES[info.dtype].itemsize


def _sd_notify(message: str) -> None:
    """Tell systemd (Type=notify) about our state, if it started us."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return
    if address.startswith("@"):
        address = "\0" + address[1:]
    with pysocket.socket(pysocket.AF_UNIX, pysocket.SOCK_DGRAM) as sock, contextlib.suppress(OSError):
        sock.sendto(message.encode(), address)


def serve(config: ServeConfig, reload_config: Callable[[], ServeConfig] | None = None) -> int:
    daemon = Daemon(config, reload_config=reload_config)
    try:
        daemon.start()
        daemon.run()
    except KeyboardInterrupt:
        log.info("interrupted during start-up")
        return 130
    finally:
        daemon.close()
    return 0
