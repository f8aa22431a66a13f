"""MLPerf Inference LoadGen (mlcommons-loadgen 6.0, its Python bindings) driving one server: a SUT that sends each
query sample over the server's own API (the Open Inference Protocol's REST API with binary data, TorchServe's REST
API, or Packrat's ZeroMQ client). Runs in bench/peers/.venv-loadgen (bash bench/peers/install_loadgen.sh):

    .venv-loadgen/bin/python bench/peers/loadgen.py --name packrat_oip \\
        --target '{"kind": "oip", "url": "http://127.0.0.1:P/v2/models/resnet50/infer"}' \\
        --scenario Server --bound-ms 100 --duration 20 --out bench/results/peers-loadgen-resnet50/packrat_oip

SingleStream: one query at a time, LoadGen's p90. Server: Poisson arrivals at a target QPS; the search doubles the
QPS from half SingleStream's rate while a trial's p99 stays under --bound-ms with no failed query, then bisects
between the last trial that held and the first that did not. Every trial's LoadGen summary and detail log are
kept under --out; one JSON object goes to stdout. Trials are far shorter than a submission's 10 minutes, so
LoadGen's own verdict ("Result is", which needs enough queries for its early-stopping estimate) is reported
beside the criterion used here: LoadGen's measured 99th percentile against the bound.
"""

from __future__ import annotations

import argparse
import http.client
import json
import re
import sys
import threading
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent.parent))

try:
    import mlperf_loadgen as lg
except ImportError as exc:
    raise SystemExit(
        f"mlcommons-loadgen is not installed here ({exc}); run: bash bench/peers/install_loadgen.sh"
    ) from exc

from payload import expected_output_bytes, make_input, oip_request  # noqa: E402

SAMPLES = 64  # the query sample library: distinct inputs, one sample each


class Sut:
    """Sends each query sample to the target from a pool of threads, each with its own connection."""

    def __init__(self, target: dict[str, Any], model: str, timeout_s: float, threads: int) -> None:
        self.target, self.timeout_s = target, timeout_s
        self.kind = target["kind"]
        self.expected = expected_output_bytes(model, 1)
        self.arrays = [make_input(model, 1, seed=index) for index in range(SAMPLES)]
        if self.kind == "oip":
            self.bodies = [oip_request(array) for array in self.arrays]
        else:
            headers = {"Content-Type": "application/octet-stream"}
            self.bodies = [(array.tobytes(), headers) for array in self.arrays]
        self.local = threading.local()
        self.pool = ThreadPoolExecutor(max_workers=threads)
        self.errors: dict[str, int] = {}
        self.lock = threading.Lock()

    def _send(self, index: int) -> str | None:
        if self.kind == "zmq":
            if not hasattr(self.local, "client"):
                from packrat_daemon.wire.client import Client

                self.local.client = Client(self.target["endpoint"], timeout=self.timeout_s)
            out = self.local.client.infer(self.arrays[index])
            return None if out.nbytes == self.expected else "WRONG_SIZE"
        url = urllib.parse.urlsplit(self.target["url"])
        if not hasattr(self.local, "conn"):
            self.local.conn = http.client.HTTPConnection(url.hostname, url.port, timeout=self.timeout_s)
        body, headers = self.bodies[index]
        try:
            self.local.conn.request("POST", url.path, body=body, headers=headers)
            reply = self.local.conn.getresponse()
            data = reply.read()
        except (OSError, http.client.HTTPException):
            self.local.conn.close()
            del self.local.conn
            raise
        if reply.status != 200:
            return f"HTTP_{reply.status}"
        header = reply.getheader("Inference-Header-Content-Length")
        size = len(data) - int(header) if header is not None else len(data)
        return None if size == self.expected else "WRONG_SIZE"

    def _one(self, query_id: int, index: int) -> None:
        try:
            error = self._send(index)
        except Exception as exc:  # noqa: BLE001 - every failure is counted, and the query still completes
            error = type(exc).__name__
        if error is not None:
            with self.lock:
                self.errors[error] = self.errors.get(error, 0) + 1
        lg.QuerySamplesComplete([lg.QuerySampleResponse(query_id, 0, 0)])

    def issue(self, samples: list[Any]) -> None:
        for sample in samples:
            self.pool.submit(self._one, sample.id, sample.index)

    def warm(self, seconds: float) -> None:
        until = time.monotonic() + seconds
        while time.monotonic() < until:
            self._send(0)


def _shown(path: Path) -> str:
    """`path` relative to the repository when it lies inside it."""
    path = path.resolve()
    return str(path.relative_to(HERE.parent.parent)) if path.is_relative_to(HERE.parent.parent) else str(path)


def read_summary(folder: Path) -> dict[str, str]:
    fields: dict[str, str] = {}
    for line in (folder / "mlperf_log_summary.txt").read_text(errors="replace").splitlines():
        match = re.match(r"^\s*([^:=]+?)\s*:\s*(.+?)\s*$", line)
        if match:
            fields.setdefault(match.group(1), match.group(2))
    return fields


def _ms(fields: dict[str, str], *keys: str) -> float | None:
    for key in keys:
        if key in fields:
            return round(int(fields[key]) / 1e6, 2)
    return None


def run_test(
    sut: Sut, scenario: str, folder: Path, duration_s: float, bound_ms: float, qps: float | None, expected_ms: float
) -> dict[str, Any]:
    folder.mkdir(parents=True, exist_ok=True)
    settings = lg.TestSettings()
    settings.mode = lg.TestMode.PerformanceOnly
    settings.min_duration_ms = int(duration_s * 1000)
    settings.min_query_count = 1
    if scenario == "SingleStream":
        settings.scenario = lg.TestScenario.SingleStream
        settings.single_stream_expected_latency_ns = int(expected_ms * 1e6)
    else:
        settings.scenario = lg.TestScenario.Server
        settings.server_target_qps = float(qps)
        settings.server_target_latency_ns = int(bound_ms * 1e6)
        settings.server_target_latency_percentile = 0.99
    output = lg.LogOutputSettings()
    output.outdir = str(folder)
    output.copy_summary_to_stdout = False
    log_settings = lg.LogSettings()
    log_settings.log_output = output
    log_settings.log_mode = lg.LoggingMode.AsyncPoll
    log_settings.enable_trace = False  # the trace is megabytes a test; the summary and the detail log are kept
    sut.errors = {}
    handle = lg.ConstructSUT(sut.issue, lambda: None)
    qsl = lg.ConstructQSL(SAMPLES, SAMPLES, lambda indices: None, lambda indices: None)
    try:
        lg.StartTestWithLogSettings(handle, qsl, settings, log_settings)
    finally:
        lg.DestroyQSL(qsl)
        lg.DestroySUT(handle)
    fields = read_summary(folder)
    entry: dict[str, Any] = {
        "scenario": scenario,
        "summary": _shown(folder / "mlperf_log_summary.txt"),
        "loadgen_result": fields.get("Result is"),
        "p50_ms": _ms(fields, "50.00 percentile latency (ns)"),
        "p90_ms": _ms(fields, "90.00 percentile latency (ns)", "90th percentile latency (ns)"),
        "p99_ms": _ms(fields, "99.00 percentile latency (ns)"),
        "errors": dict(sut.errors),
    }
    if scenario == "Server":
        entry["target_qps"] = qps
        entry["scheduled_qps"] = float(fields.get("Scheduled samples per second", "nan"))
        entry["completed_qps"] = float(fields.get("Completed samples per second", "nan"))
        entry["holds"] = entry["p99_ms"] is not None and entry["p99_ms"] <= bound_ms and not sut.errors
    else:
        entry["qps"] = float(fields.get("QPS w/o loadgen overhead", fields.get("QPS w/ loadgen overhead", "nan")))
    return entry


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--target", required=True, help='JSON: {"kind": "oip"|"torchserve", "url": …} or {"kind": "zmq", "endpoint": …}'
    )
    parser.add_argument("--name", required=True)
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--scenario", choices=("SingleStream", "Server"), required=True)
    parser.add_argument("--duration", type=float, default=20.0, help="seconds per LoadGen test (default 20)")
    parser.add_argument("--bound-ms", type=float, default=100.0, help="Server: the p99 bound (default 100 ms)")
    parser.add_argument("--max-trials", type=int, default=7, help="Server: most trials in the search (default 7)")
    parser.add_argument("--start-qps", type=float, help="Server: the first trial's QPS (default: from SingleStream)")
    parser.add_argument("--timeout", type=float, default=60.0)
    parser.add_argument("--threads", type=int, default=64, help="sending threads (default 64)")
    parser.add_argument("--out", required=True, help="folder for LoadGen's logs")
    args = parser.parse_args()
    sut = Sut(json.loads(args.target), args.model, args.timeout, args.threads)
    out = Path(args.out)
    sut.warm(2.0)
    began = time.monotonic()
    if args.scenario == "SingleStream":
        result = run_test(sut, "SingleStream", out / "SingleStream", args.duration, args.bound_ms, None, 50.0)
        result["search_s"] = round(time.monotonic() - began, 1)
        print(json.dumps({"name": args.name, **result}))
        return 0
    if args.start_qps:
        qps = args.start_qps
    else:
        probe = run_test(
            sut, "SingleStream", out / "server-probe-SingleStream", min(args.duration, 10.0), args.bound_ms, None, 50.0
        )
        qps = round(max(0.5, 500.0 / (probe["p50_ms"] or 1000.0)), 2)  # half of one-at-a-time's rate
        if probe["p90_ms"] is not None and probe["p90_ms"] > args.bound_ms:
            print(json.dumps({
                "name": args.name, "scenario": "Server", "bound_ms": args.bound_ms, "qps_at_bound": None,
                "first_failing_qps": None, "trials": [], "probe": probe, "search_s": round(time.monotonic() - began, 1),
                "why": f"one query at a time already takes {probe['p90_ms']} ms at p90, over the bound",
            }))  # fmt: skip
            return 0
    trials: list[dict[str, Any]] = []
    good: float | None = None
    bad: float | None = None
    while len(trials) < args.max_trials:
        trial = run_test(sut, "Server", out / f"Server-qps-{qps:g}", args.duration, args.bound_ms, qps, 50.0)
        trials.append(trial)
        print(f"[loadgen {args.name}] {qps:g} QPS: p99 {trial['p99_ms']} ms, holds {trial['holds']}", file=sys.stderr)
        if trial["holds"]:
            good = qps if good is None else max(good, qps)
        else:
            bad = qps if bad is None else min(bad, qps)
        if bad is None:
            qps = round(qps * 2, 2)
        elif good is None:
            qps = round(qps / 2, 2)
            if qps * args.duration < 10:  # fewer than 10 queries a trial: nothing holds
                break
        else:
            if bad - good <= max(0.05 * good, 0.1):
                break
            qps = round((good + bad) / 2, 2)
    print(
        json.dumps(
            {
                "name": args.name,
                "scenario": "Server",
                "bound_ms": args.bound_ms,
                "qps_at_bound": good,
                "first_failing_qps": bad,
                "trials": trials,
                "search_s": round(time.monotonic() - began, 1),
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
