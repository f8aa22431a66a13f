"""Prometheus metrics from a real daemon, scraped over HTTP on loopback."""

from __future__ import annotations

import json
import os
import re
import socket
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from packrat_daemon.fleet.pool import WorkerHandle
from packrat_daemon.requests.batcher import Request
from packrat_daemon.requests.jobs import Completed, InFlightBatch, Job
from packrat_daemon.wire.client import BadRequest, Client
from tests.helpers.daemons import REPO, running_daemon


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def scrape(port: int) -> dict[tuple[str, tuple], float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


@pytest.mark.slow
def test_metrics_count_requests_batches_errors_and_describe_the_plan(tmp_path: Path) -> None:
    port = free_port()
    args = ["--model", "builtin:tiny-mlp", "--policy", "fixed", "--plan", "2*1x2", "--max-batch", "4"]
    with running_daemon(tmp_path, *args, "--metrics-port", str(port)) as (endpoint, _):
        with Client(endpoint, timeout=30) as client:
            for samples in (1, 2, 3, 4, 4):
                client.infer(np.ones((samples, 16), dtype=np.float32))
            with pytest.raises(BadRequest):
                client.infer(np.ones((1, 3), dtype=np.float32))
        metrics = scrape(port)
    assert metrics[("packrat_requests_total", (("outcome", "ok"),))] == 5
    assert metrics[("packrat_requests_total", (("outcome", "BAD_REQUEST"),))] == 1
    assert metrics[("packrat_request_latency_seconds_count", ())] == 5
    assert metrics[("packrat_queue_wait_seconds_count", ())] == 5
    assert metrics[("packrat_queue_wait_seconds_sum", ())] < metrics[("packrat_request_latency_seconds_sum", ())]
    assert metrics[("packrat_batch_size_sum", ())] == 14
    assert metrics[("packrat_worker_compute_seconds_count", (("threads", "1"),))] >= 5
    assert metrics[("packrat_workers_ready", ())] == 2
    assert metrics[("packrat_plan_changes_total", (("reason", "start"),))] == 1
    processes = {
        dict(labels)["process"] for (name, labels) in metrics if name == "packrat_process_resident_memory_bytes"
    }
    assert len(processes) == 3 and "daemon" in processes  # the daemon and both workers
    assert all(metrics[("packrat_process_resident_memory_bytes", (("process", p),))] > 1e6 for p in processes)
    assert metrics[("packrat_process_cpu_seconds_total", (("process", "daemon"),))] > 0
    plan = next(labels for (name, labels) in metrics if name == "packrat_plan_info")
    assert ("policy", "fixed") in plan and ("threads", "1+1") in plan
    # Every batch once under the layout that ran it (1 input: one worker; more: both).
    layouts = {dict(labels)["layout"]: value for (name, labels), value in metrics.items()
               if name == "packrat_layout_compute_seconds_count"}  # fmt: skip
    assert sum(layouts.values()) == metrics[("packrat_batch_size_count", ())] and set(layouts) <= {"1", "1+1"}
    # Where the daemon's own time went: every message read, every batch started and answered, every slice's trip.
    batches = metrics[("packrat_batch_size_count", ())]
    events = {dict(labels)["phase"]: value for (name, labels), value in metrics.items()
              if name == "packrat_loop_events_total"}  # fmt: skip
    assert events["read"] >= 6 and events["dispatch"] == events["answer"] == batches
    assert all(
        metrics[("packrat_loop_seconds_total", (("phase", phase),))] > 0 for phase in ("read", "dispatch", "answer")
    )
    assert metrics[("packrat_worker_hop_seconds_count", ())] == sum(
        count * (1 if layout == "1" else 2) for layout, count in layouts.items()
    )
    assert metrics[("packrat_worker_hop_seconds_sum", ())] > 0


@pytest.mark.slow
def test_metrics_port_in_use_is_a_clear_error(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with (
            pytest.raises(AssertionError, match="choose another --metrics-port"),
            running_daemon(
                tmp_path, "--model", "builtin:tiny-mlp", "--policy", "single", "--metrics-port", str(port), timeout=60
            ),
        ):
            pass


def test_tallies_export_what_prometheus_histograms_would() -> None:
    """The request path's lock-free tallies scrape exactly like prometheus_client's own Histogram."""
    from prometheus_client import CollectorRegistry, Histogram, generate_latest

    from packrat_daemon.ops.metrics import LATENCY_BUCKETS, Metrics

    values = [0.0005, 0.0004, 0.003, 0.25, 0.2500001, 7.0, 31.0, 0.0]  # on, under and over the bounds
    reference_registry = CollectorRegistry()
    reference = Histogram("packrat_request_latency_seconds", "x", buckets=LATENCY_BUCKETS, registry=reference_registry)
    metrics = Metrics("builtin:tiny-mlp")
    for value in values:
        reference.observe(value)
        metrics.answered_ok(value * 1000.0, 0.0)
    metrics.count("BAD_REQUEST")

    def samples(registry: CollectorRegistry) -> dict[tuple[str, tuple], float]:
        text = generate_latest(registry).decode()
        return {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
            if s.name.startswith("packrat_request_latency_seconds") and not s.name.endswith("_created")
        }

    ours, theirs = samples(metrics.registry), samples(reference_registry)
    assert ours.keys() == theirs.keys()
    for key, value in theirs.items():
        assert ours[key] == pytest.approx(value)
    everything = scrape_registry(metrics.registry)
    assert everything[("packrat_requests_total", (("outcome", "ok"),))] == len(values)
    assert everything[("packrat_requests_total", (("outcome", "BAD_REQUEST"),))] == 1


def scrape_registry(registry: CollectorRegistry) -> dict[tuple[str, tuple], float]:
    from prometheus_client import generate_latest

    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(generate_latest(registry).decode())
        for s in family.samples
    }


def test_the_precision_served_and_what_the_guard_measured_are_exported() -> None:
    from prometheus_client import generate_latest

    from packrat_daemon.ops.metrics import Metrics

    metrics = Metrics("builtin:tiny-cnn")
    metrics.guarded("torch", "bf16", 0.004, 1.0)
    metrics.guarded("openvino", "bf16", 0.002, None)  # not a classifier: no top-1 gauge
    metrics.served("torch", "bf16", "passed")
    samples = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(generate_latest(metrics.registry).decode())
        for sample in family.samples
    }
    labels = (("precision", "bf16"), ("runtime", "torch"))
    assert samples[("packrat_accuracy_guard_max_rel_error", labels)] == 0.004
    assert samples[("packrat_accuracy_guard_top1_agreement", labels)] == 1.0
    assert ("packrat_accuracy_guard_top1_agreement", (("precision", "bf16"), ("runtime", "openvino"))) not in samples
    served = (("accuracy_guard", "passed"), ("precision", "bf16"), ("runtime", "torch"))
    assert samples[("packrat_precision_info", served)] == 1.0


def http_status(port: int, path: str) -> int:
    try:
        return urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10).status
    except urllib.error.HTTPError as exc:
        return exc.code


def test_readyz_is_503_until_the_workers_serve_and_while_the_pool_is_below_its_plan() -> None:
    from packrat_daemon.ops.metrics import Metrics
    from policies.base import InstancePlan, Plan

    metrics = Metrics("m")
    port = free_port()
    metrics.serve(port)
    try:
        two = (InstancePlan(threads=1, batch=1), InstancePlan(threads=1, batch=1))
        metrics.plan_changed(Plan(instances=two, policy="fixed", reason="test"), "start", 2)
        assert (http_status(port, "/healthz"), http_status(port, "/readyz")) == (200, 503)
        metrics.workers_serving({1: None})  # one of the plan's two instances: below the plan
        assert http_status(port, "/readyz") == 503
        metrics.workers_serving({1: None, 2: None})
        assert http_status(port, "/readyz") == 200
        metrics.workers_serving({2: None})  # a worker died: not ready until it is replaced
        assert http_status(port, "/readyz") == 503
    finally:
        metrics.close()


@pytest.mark.slow
def test_a_real_daemon_answers_healthz_readyz_metrics_and_404_elsewhere(tmp_path: Path) -> None:
    port = free_port()
    args = ["--model", "builtin:tiny-mlp", "--policy", "fixed", "--plan", "2*1x2", "--max-batch", "4"]
    with running_daemon(tmp_path, *args, "--metrics-port", str(port)):
        statuses = {path: http_status(port, path) for path in ("/healthz", "/readyz", "/metrics", "/", "/nope")}
    assert statuses == {"/healthz": 200, "/readyz": 200, "/metrics": 200, "/": 404, "/nope": 404}


def test_latency_buckets_follow_the_predicted_latency_10_percent_apart() -> None:
    from packrat_daemon.ops.metrics import LATENCY_BUCKETS, latency_buckets

    assert latency_buckets(None) == LATENCY_BUCKETS
    buckets = latency_buckets(0.02)
    fine = [b for b in buckets if 0.002 <= b <= 0.2 * 1.1]
    assert fine[0] <= 0.002 * 1.0001 and fine[-1] >= 0.2 * 0.999
    assert all(high / low <= 1.1 + 1e-6 for low, high in zip(fine, fine[1:], strict=False))
    assert buckets[-1] == LATENCY_BUCKETS[-1] and list(buckets) == sorted(set(buckets))


def completed_batch(
    threads: list[int], rows: list[int], compute_ms: list[float], predicted_ms: list[float | None]
) -> list[Completed]:
    """The dispatcher's Completed records of one finished batch: one request per slice, its worker's
    threads, rows, measured and predicted milliseconds."""
    requests = [Request(b"client", None, f"r{k}", "float32", (n, 16), b"") for k, n in enumerate(rows)]
    batch = InFlightBatch(requests, np.dtype("float32"), (16,))
    jobs, offset = [], 0
    for k, (t, n, measured, predicted) in enumerate(zip(threads, rows, compute_ms, predicted_ms, strict=True)):
        worker = WorkerHandle(id=k + 1, threads=t, cores=tuple(range(t)), generation=1, pid=1000 + k)
        jobs.append(Job(k + 1, batch, offset, n, worker, 0.0, 0.0, predicted, compute_ms=measured))
        offset += n
    slowest = max(compute_ms)
    return [Completed(r, np.zeros((r.samples, 4), np.float32), 0.5, slowest, jobs) for r in requests]


def test_each_layout_exports_its_measured_and_predicted_compute_once_per_batch() -> None:
    from packrat_daemon.ops.metrics import Metrics
    from packrat_daemon.ops.tallies import MAX_LAYOUT_LABELS, OTHER_LAYOUT

    metrics = Metrics("m")
    for done in completed_batch([1, 2], [2, 3], [4.0, 6.0], [5.0, 5.5]):  # one batch, two requests
        metrics.answered(done, 7.0)
    for done in completed_batch([2, 1], [1, 1], [3.0, 2.0], [2.5, None]):  # a slice without a prediction
        metrics.answered(done, 4.0)
    samples = scrape_registry(metrics.registry)
    layout = (("layout", "2+1"),)  # largest first, whichever worker holds which count
    assert samples[("packrat_request_latency_seconds_count", ())] == 4  # every request
    assert samples[("packrat_layout_compute_seconds_count", layout)] == 2  # every batch, once
    assert samples[("packrat_layout_compute_seconds_sum", layout)] == pytest.approx((6.0 + 3.0) / 1000)
    assert samples[("packrat_layout_predicted_batches_total", layout)] == 1  # only the batch with a prediction
    assert samples[("packrat_layout_predicted_seconds_total", layout)] == pytest.approx(5.5 / 1000)
    for threads in range(1, MAX_LAYOUT_LABELS + 5):  # many distinct layouts: the labels stay bounded
        (done,) = completed_batch([threads], [1], [1.0], [1.0])
        metrics.answered(done, 1.0)
    labels = {dict(labels)["layout"] for (name, labels) in scrape_registry(metrics.registry)
              if name == "packrat_layout_compute_seconds_count"}  # fmt: skip
    assert len(labels) == MAX_LAYOUT_LABELS + 1 and OTHER_LAYOUT in labels


def test_a_request_answered_timeout_in_flight_does_not_lose_its_batch() -> None:
    from packrat_daemon.ops.metrics import Metrics

    metrics = Metrics("m")
    first, second = completed_batch([1, 1], [1, 1], [2.0, 2.0], [2.0, 2.0])
    first.request.answered = True  # TIMEOUT while in flight: only the second request gets a result
    metrics.answered(second, 3.0)
    assert scrape_registry(metrics.registry)[("packrat_layout_compute_seconds_count", (("layout", "1+1"),))] == 1


def test_the_grafana_dashboard_queries_only_metrics_the_daemon_exports() -> None:
    from packrat_daemon.ops.metrics import Metrics
    from policies.base import InstancePlan, Plan

    metrics = Metrics("m")
    metrics.plan_changed(Plan((InstancePlan(1, 1), InstancePlan(1, 1)), "fixed", "test", 2.0), "start", 2)
    metrics.workers_serving({1: os.getpid()})
    for done in completed_batch([1, 1], [1, 1], [2.0, 2.0], [2.0, 2.0]):
        metrics.answered(done, 3.0)
    metrics.count("OVERLOADED")
    metrics.batch_size.observe(2)
    metrics.observe_compute(1, 2.0)
    exported = {name for name, _ in scrape_registry(metrics.registry)}
    dashboard = json.loads((REPO / "docs" / "grafana" / "packrat-dashboard.json").read_text())
    queried = {
        name
        for panel in dashboard["panels"]
        for target in panel["targets"]
        for name in re.findall(r"\bpackrat_\w+", target["expr"])
    }
    assert queried and queried <= exported, queried - exported
    assert {"packrat_layout_compute_seconds_sum", "packrat_layout_predicted_seconds_total"} <= queried


def test_compute_histograms_take_the_plans_buckets_too() -> None:
    """A compute time between coarse bounds (25 and 50 ms) would read up to 2x off as a quantile."""
    from packrat_daemon.ops.metrics import Metrics, latency_buckets
    from policies.base import InstancePlan, Plan

    metrics = Metrics("m")
    metrics.plan_changed(Plan((InstancePlan(1, 1),), "fixed", "test", 26.0), "start", 1)
    metrics.observe_compute(1, 26.0)
    assert metrics.compute[1].bounds == latency_buckets(0.026) == metrics.latency.bounds
