"""Prometheus metrics. The daemon alone holds the registry; workers only report raw timings.

Served over HTTP on loopback by default (`--metrics-port`), by one thread of its own (`metrics_http`). What
changes per request (outcomes, latency, batch sizes, compute times) is kept in plain tallies that a
custom collector turns into counters and histograms at scrape time; the rest are prometheus_client's
own metrics, set a few times a second at most.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import psutil
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
)
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    SummaryMetricFamily,
)
from prometheus_client.registry import Collector

from packrat_daemon.ops import metrics_http
from packrat_daemon.ops.tallies import HOP, LOOP_PHASES, LayoutTimes, OwnTimes, Tally, Tokens, first_of_batch
from policies.base import Plan

if TYPE_CHECKING:
    from packrat_daemon.ops.records import Answer, Reconfigured

log = logging.getLogger("packrat.security")
debug = logging.getLogger("packrat.metrics")

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
# Profile-derived latency buckets: Prometheus interpolates linearly inside a bucket, so a quantile can be off
# by up to a bucket's width; bounds 10% apart keep it within 10% of what clients measure. They span a decade
# either side of the plan's predicted latency, and the coarse bounds cover the rest.
BUCKET_RATIO = 1.1
BUCKET_SPAN = 10.0


def latency_buckets(predicted_s: float | None) -> tuple[float, ...]:
    """Latency bucket bounds for a daemon whose plan predicts `predicted_s` (None: the coarse bounds alone)."""
    if predicted_s is None or predicted_s <= 0:
        return LATENCY_BUCKETS
    low, high = predicted_s / BUCKET_SPAN, predicted_s * BUCKET_SPAN
    fine = [low]
    while fine[-1] < high:
        fine.append(fine[-1] * BUCKET_RATIO)
    coarse = [b for b in LATENCY_BUCKETS if b < low or b > fine[-1]]
    return tuple(sorted({round(b, 9) for b in fine + coarse}))


BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


class _RequestPathCollector(Collector):
    """Exports the request path's tallies at scrape time, as ordinary counters and histograms."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Any]:
        m = self.metrics
        requests = CounterMetricFamily(
            "packrat_requests", "Requests answered, by outcome (ok or the error code)", labels=["outcome"]
        )
        for outcome, count in list(m.outcomes.items()):
            requests.add_metric([outcome], count)
        yield requests
        latency = HistogramMetricFamily(
            "packrat_request_latency_seconds", "From receipt to reply, for answered infer requests"
        )
        latency.add_metric([], m.latency.cumulative(), m.latency.sum)
        yield latency
        queue_wait = HistogramMetricFamily(
            "packrat_queue_wait_seconds", "From receipt until a worker was handed the request's batch"
        )
        queue_wait.add_metric([], m.queue_wait.cumulative(), m.queue_wait.sum)
        yield queue_wait
        batch = HistogramMetricFamily("packrat_batch_size", "Inputs per batch formed by the batcher")
        batch.add_metric([], m.batch_size.cumulative(), m.batch_size.sum)
        yield batch
        compute = HistogramMetricFamily(
            "packrat_worker_compute_seconds", "A worker's compute time for its slice, by its thread count",
            labels=["threads"],
        )  # fmt: skip
        for threads, tally in sorted(m.compute.items()):
            compute.add_metric([str(threads)], tally.cumulative(), tally.sum)
        yield compute
        yield from _layout_families(m.layouts)
        yield from _own_time_families(m.own_times)
        if m.tokens.real:
            yield from _token_families(m.tokens)


def _token_families(tokens: Tokens) -> Iterator[Any]:
    lengths = HistogramMetricFamily(
        "packrat_sequence_length_tokens", "Tokens per answered sequence, along the model's free axis"
    )
    lengths.add_metric([], tokens.lengths.cumulative(), tokens.lengths.sum)
    yield lengths
    yield CounterMetricFamily("packrat_tokens_real", "Tokens the answered batches' requests held", value=tokens.real)
    yield CounterMetricFamily(
        "packrat_tokens_padded", "Tokens the answered batches' slices computed, each padded to its longest",
        value=tokens.padded,
    )  # fmt: skip


def _layout_families(layouts: LayoutTimes) -> Iterator[Any]:
    observed = HistogramMetricFamily(
        "packrat_layout_compute_seconds",
        "A batch's measured compute (its slowest slice), by layout (the workers' thread counts)",
        labels=["layout"],
    )
    predicted = CounterMetricFamily(
        "packrat_layout_predicted_seconds",
        "The profile's predicted compute, summed over the batches of each layout that had a prediction",
        labels=["layout"],
    )
    predicted_batches = CounterMetricFamily(
        "packrat_layout_predicted_batches", "Batches of each layout that had a prediction", labels=["layout"]
    )
    for label, tally in sorted(list(layouts.observed.items())):
        observed.add_metric([label], tally.cumulative(), tally.sum)
        if label in layouts.predicted_batches:
            predicted.add_metric([label], layouts.predicted_s[label])
            predicted_batches.add_metric([label], layouts.predicted_batches[label])
    yield observed
    yield predicted
    yield predicted_batches


def _own_time_families(own: OwnTimes) -> Iterator[Any]:
    seconds = CounterMetricFamily(
        "packrat_loop_seconds", "Time the daemon's one loop spent in each phase (docs/metrics.md)", labels=["phase"]
    )
    events = CounterMetricFamily(
        "packrat_loop_events", "What the loop's phases handled: messages read, batches, wakes", labels=["phase"]
    )
    for phase in LOOP_PHASES:
        seconds.add_metric([phase], own.seconds[phase])
        events.add_metric([phase], own.events[phase])
    yield seconds
    yield events
    hop = SummaryMetricFamily(
        "packrat_worker_hop_seconds", "A slice's trip to its worker and back, beyond the worker's compute"
    )
    hop.add_metric([], own.events[HOP], own.seconds[HOP])
    yield hop


class Metrics:
    def __init__(self, model: str) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        # Updated on every request: plain tallies, exported by _RequestPathCollector.
        self.outcomes: dict[str, int] = {}
        self.latency = Tally(LATENCY_BUCKETS)
        self.queue_wait = Tally(LATENCY_BUCKETS)
        self.batch_size = Tally(BATCH_BUCKETS)
        self.compute: dict[int, Tally] = {}
        # The latency histograms' bounds: from the start plan's prediction.
        self.buckets: tuple[float, ...] = LATENCY_BUCKETS
        self.layouts = LayoutTimes(LATENCY_BUCKETS)
        self.own_times = OwnTimes()
        self.tokens = Tokens()  # a model of a free axis: lengths and padding
        r.register(_RequestPathCollector(self))
        # Updated rarely: prometheus_client's own metrics.
        self.queued = Gauge("packrat_queued_inputs", "Inputs waiting to be batched", registry=r)
        self.workers = Gauge("packrat_workers_ready", "Worker processes ready to serve", registry=r)
        self.switches = Counter(
            "packrat_plan_changes", "Plans handed to the reconciler, by reason", ["reason"], registry=r
        )
        self.predicted = Gauge(
            "packrat_plan_predicted_latency_seconds", "The current plan's predicted (expected) latency", registry=r
        )
        self.plan = Info("packrat_plan", "The plan being served", registry=r)
        self.reconfiguration = Histogram(
            "packrat_reconfiguration_seconds",
            "Seconds from a plan change's decision to its first re-threaded or forked worker serving "
            "(first_worker), every worker of the new plan serving (new_pool), the last old one retired (old_retired)",
            ["stage"],
            buckets=(0.01, 0.025, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0),
            registry=r,
        )
        Info("packrat_model", "The model being served", registry=r).info({"model": model})
        self.precision = Info(
            "packrat_precision", "The runtime and precision served, and the guard's verdict", registry=r
        )
        self.guard_error = Gauge(
            "packrat_accuracy_guard_max_rel_error",
            "The accuracy guard's measured max relative error against fp32, by runtime and precision checked",
            ["runtime", "precision"],
            registry=r,
        )
        self.guard_top1 = Gauge(
            "packrat_accuracy_guard_top1_agreement",
            "The accuracy guard's measured top-1 agreement with fp32 (classifiers only)",
            ["runtime", "precision"],
            registry=r,
        )
        # Co-location (docs/colocation.md): this model's share of the machine, and the moves of it.
        self.assigned_cores = Gauge(
            "packrat_assigned_cores", "Physical cores this model may plan and pin on (its share)", registry=r
        )
        self.share_moves = Counter(
            "packrat_share_moves", "Assignments that changed this model's CPU set (`packrat coordinate`)", registry=r
        )
        # How far the plan's predictions may be trusted (docs/status.md, "predicted against measured").
        self.profile_on_cpu = Gauge(
            "packrat_profile_on_cpu_ratio",
            "Of the time the served profile's measuring workers were ready to run, the least share a cell's ran; "
            "under 0.9 it was measured while other work ran on its cores",
            registry=r,
        )
        self.profile_noise = Gauge(
            "packrat_profile_noise_ratio",
            "The served profile's noise (median p90/median - 1 of its cells, at least 0.05): a layout whose "
            "measured compute strays from the predicted by more disagrees with the profile",
            registry=r,
        )
        self.server: metrics_http.MetricsServer | None = None
        # Readiness (/readyz): workers serving now against the workers the plan asks for; plain ints read
        # by the HTTP thread, written by the daemon's loop.
        self.serving_workers = 0
        self.planned_workers = 0
        self.frontends_serving: Callable[[], bool] = lambda: True  # the OIP gateway, where one runs (service.serve)
        self.worker_pids: dict[int, int] = {}
        r.register(_ProcessCollector(self))

    def ready(self) -> bool:
        """True while the workers serve and the pool is not below its plan."""
        # planned_workers stays 0 until the daemon announces its start plan, just before its frontend opens.
        workers = self.planned_workers > 0 and self.serving_workers >= self.planned_workers
        return workers and self.frontends_serving()

    def workers_serving(self, pids: dict[int, int | None]) -> None:
        """The workers serving now, worker id -> process id (None until the worker has said it)."""
        self.serving_workers = len(pids)
        self.worker_pids = {worker: pid for worker, pid in pids.items() if pid is not None}
        self.workers.set(len(pids))

    def count(self, outcome: str) -> None:
        """One request answered with `outcome`: "ok" or an error code."""
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1

    def answered_ok(self, total_ms: float, queue_ms: float) -> None:
        """One answered request: its whole time in the daemon, and the part it waited before a worker took it
        (kept apart from compute so that a slow answer says whether batching/queueing or the model cost it)."""
        self.count("ok")
        self.latency.observe(total_ms / 1000.0)
        self.queue_wait.observe(queue_ms / 1000.0)

    def answered(self, done: Answer, total_ms: float) -> None:
        """A request answered with its result; once per batch, the batch's layout and times as well."""
        self.answered_ok(total_ms, done.queue_ms)
        length = done.request.length
        if length:
            self.tokens.answered(length, done.request.samples)
        if first_of_batch(done):
            self.layouts.observe(done)
            if length:
                self.tokens.batch(done.jobs)

    def batch_started(self, inputs: int, seconds: float) -> None:
        """A batch of `inputs` went to the workers; starting it held the loop `seconds` (the "dispatch" phase)."""
        self.batch_size.observe(inputs)
        self.own_times.add("dispatch", seconds)

    def observe_compute(self, threads: int, compute_ms: float) -> None:
        tally = self.compute.get(threads)
        if tally is None:
            tally = self.compute[threads] = Tally(self.buckets)
        tally.observe(compute_ms / 1000.0)

    def serve(self, port: int, address: str = "127.0.0.1") -> None:
        """Serve /metrics, /healthz and /readyz on `address`:`port`; ConfigError naming it if it is taken."""
        self.server = metrics_http.serve(self, port, address)

    def rebind(self, port: int, address: str) -> None:
        """A reload: serve on `address`:`port` from now on (port 0: not at all). ConfigError when that cannot be
        bound; the endpoint from before then serves on."""
        metrics_http.rebind(self, port, address)

    def plan_changed(self, plan: Plan, reason: str, workers: int) -> None:
        """A new plan, served by `workers` processes (the reconciler's count: layouts may share a worker)."""
        if reason == "start" and plan.predicted_latency_ms is not None and not any(self.latency.counts):
            # Before the first answer only, so no observation is lost and no series changes its buckets later
            # (compute tallies are made at a worker's first answer, after this).
            self.buckets = buckets = latency_buckets(plan.predicted_latency_ms / 1000.0)
            self.latency, self.queue_wait, self.layouts = Tally(buckets), Tally(buckets), LayoutTimes(buckets)
            debug.debug(
                "latency buckets: %d bounds, %.3g s to %.3g s, 10%% apart around the predicted %.3g s",
                len(buckets), buckets[0], buckets[-1], plan.predicted_latency_ms / 1000.0,
            )  # fmt: skip
        self.switches.labels(reason).inc()
        self.planned_workers = workers
        if plan.predicted_latency_ms is not None:
            self.predicted.set(plan.predicted_latency_ms / 1000.0)
        layouts = ["+".join(str(i.threads) for i in layout) for layout in plan.layouts]
        self.plan.info({"policy": plan.policy, "threads": " | ".join(layouts), "split": plan.split})

    def share_assigned(self, cores: int, moved: bool) -> None:
        """This model's share: `cores` usable cores; `moved` when its CPU set changed (not at start)."""
        self.assigned_cores.set(cores)
        if moved:
            self.share_moves.inc()

    def reconfigured(self, record: Reconfigured) -> None:
        """A plan change has finished: how long each stage took after the decision."""
        stages = (("first_worker", record.first_serving), ("new_pool", record.serving), ("old_retired", record.retired))
        for stage, stamp in stages:
            seconds = record.seconds(stamp)
            if seconds is not None:
                self.reconfiguration.labels(stage).observe(seconds)

    def guarded(self, runtime: str, precision: str, max_rel_error: float, top1_agreement: float | None) -> None:
        """What the accuracy guard measured for one candidate (served or not)."""
        self.guard_error.labels(runtime, precision).set(max_rel_error)
        if top1_agreement is not None:
            self.guard_top1.labels(runtime, precision).set(top1_agreement)

    def served(self, runtime: str, precision: str, guard: str) -> None:
        """The runtime and precision being served; `guard`: "passed", or "not needed" for fp32."""
        self.precision.info({"runtime": runtime, "precision": precision, "accuracy_guard": guard})

    def profile_measured(self, on_cpu: float | None, noise: float) -> None:
        """The served profile's measurement: its least on-CPU share (None: not known) and its noise."""
        if on_cpu is not None:
            self.profile_on_cpu.set(on_cpu)
        self.profile_noise.set(noise)

    def close(self) -> None:
        if self.server is not None:
            self.server.close()


class _ProcessCollector(Collector):
    """Memory and CPU of the daemon and of each serving worker, read with psutil at scrape time: a worker's
    RSS is where a leak or an oversized runtime shows, and its CPU time tells a stalled worker from a busy one."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Any]:
        rss = GaugeMetricFamily("packrat_process_resident_memory_bytes", "Resident memory", labels=["process"])
        cpu = CounterMetricFamily("packrat_process_cpu_seconds", "User and system CPU time", labels=["process"])
        processes = {"daemon": os.getpid(), **{f"worker-{w}": pid for w, pid in self.metrics.worker_pids.items()}}
        for name, pid in processes.items():
            try:
                process = psutil.Process(pid)
                with process.oneshot():
                    memory, times = process.memory_info(), process.cpu_times()
            except psutil.Error:  # a worker that exited since the supervisor's last look: the next scrape drops it
                continue
            rss.add_metric([name], memory.rss)
            cpu.add_metric([name], times.user + times.system)
        yield rss
        yield cpu
