"""Prometheus metrics. The daemon alone holds the registry; workers only report raw timings.

Served over HTTP on loopback by default (`--metrics-port`), from prometheus_client's own thread; the
registry is thread-safe, and the daemon's loop only increments and observes (about a microsecond each).
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, start_http_server

from packrat_daemon.errors import ConfigError
from policies.base import Plan

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


class Metrics:
    def __init__(self, model: str) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "packrat_requests", "Requests answered, by outcome (ok or the error code)", ["outcome"], registry=r
        )
        self.latency = Histogram(
            "packrat_request_latency_seconds", "From receipt to reply, for answered infer requests",
            buckets=LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self.batch_size = Histogram(
            "packrat_batch_size", "Inputs per batch formed by the batcher", buckets=BATCH_BUCKETS, registry=r
        )
        self.compute = Histogram(
            "packrat_worker_compute_seconds", "A worker's compute time for its slice, by its thread count",
            ["threads"], buckets=LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self.queued = Gauge("packrat_queued_inputs", "Inputs waiting to be batched", registry=r)
        self.workers = Gauge("packrat_workers_ready", "Worker processes ready to serve", registry=r)
        self.switches = Counter(
            "packrat_plan_changes", "Plans handed to the reconciler, by reason", ["reason"], registry=r
        )
        self.predicted = Gauge(
            "packrat_plan_predicted_latency_seconds", "The current plan's predicted (expected) latency", registry=r
        )
        self.plan = Info("packrat_plan", "The plan being served", registry=r)
        Info("packrat_model", "The model being served", registry=r).info({"model": model})
        self.server: Any = None
        # Labelled children looked up once: labels() takes a lock and hashes on every call.
        self._ok = self.requests.labels("ok")
        self._compute_by_threads: dict[int, Any] = {}

    def answered_ok(self, total_ms: float) -> None:
        self._ok.inc()
        self.latency.observe(total_ms / 1000.0)

    def observe_compute(self, threads: int, compute_ms: float) -> None:
        child = self._compute_by_threads.get(threads)
        if child is None:
            child = self._compute_by_threads[threads] = self.compute.labels(threads)
        child.observe(compute_ms / 1000.0)

    def serve(self, port: int, address: str = "127.0.0.1") -> None:
        try:
            self.server, _ = start_http_server(port, addr=address, registry=self.registry)
        except OSError as exc:
            raise ConfigError(
                f"cannot serve metrics on {address}:{port}: {exc.strerror}; choose another --metrics-port"
            ) from None

    def plan_changed(self, plan: Plan, reason: str) -> None:
        self.switches.labels(reason).inc()
        if plan.predicted_latency_ms is not None:
            self.predicted.set(plan.predicted_latency_ms / 1000.0)
        layouts = ["+".join(str(i.threads) for i in layout) for layout in plan.layouts]
        self.plan.info({"policy": plan.policy, "threads": " | ".join(layouts), "split": plan.split})

    def close(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
