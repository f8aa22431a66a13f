"""Triton's perf_analyzer against `packrat serve --repository`: three models behind one endpoint, each by name.

    .venv/bin/python bench/repository_perf.py [--concurrency 1:2] [--requests 300] [--stability 20] [--retries 1]
                                              [--max-trials 20] [--protocols http,grpc]
                                              [--out bench/results/repository-perf.json]

The repository is the one tests/packrat_daemon/repository/test_repository_served.py serves (built by
tests/helpers/repository_models.py): `linear`, an ONNX file in Triton's layout with a config.pbtxt; `bert`, a
Hugging Face folder; `doubler`, a .pt2 listed in repository.toml. One `packrat serve --repository` serves all
three (torch at fp32 pinned, as the tests pin it, so that the start measures no candidate), on one HTTP port and
one gRPC port. perf_analyzer then runs against each model by name on each of the two ports, one request of one
sample at a time per client, a concurrency sweep in `count_windows` mode (windows of `--requests` requests:
docs/oip.md says why time windows do not settle on a few busy cores). Each request's data is the tests' own
(`--input-data`, a JSON file per model): token ids within the BERT's vocabulary, where perf_analyzer's random
data need not be.

perf_analyzer is installed by bench/peers/install_perf_analyzer.sh into an environment of its own (run here if it
is missing). `--stability` is its --stability-percentage: on a machine others load, windows of a few ms requests
swing by a factor 2 and a run settles on the first three windows that agree, the quieter ones; the JSON keeps the
load average before and after each try. A sweep that does not settle within `--max-trials` windows runs again
with windows `--retry-factor` times longer and `--retry-stability` (perf_analyzer's advice and docs/oip.md's);
every try is kept, with perf_analyzer's message. JSON on stdout and in `--out`; exit 1 if a sweep never settled.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import shlex
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.helpers import repository_models  # noqa: E402
from tests.helpers.daemons import PINNED_ARGS, daemon_env, stop_process  # noqa: E402

ANALYZER = REPO / "bench" / "peers" / ".perf_analyzer" / "perf_analyzer"
READY_TIMEOUT_S = 300.0
RUN_TIMEOUT_S = 600.0
# perf_analyzer's CSV columns, in microseconds except the throughput.
LATENCIES = {"p50 latency": "p50_ms", "p90 latency": "p90_ms", "p95 latency": "p95_ms", "p99 latency": "p99_ms"}
PARTS = {
    "Client Send": "client_send_ms",
    "Network+Server Send/Recv": "network_ms",
    "Server Queue": "server_queue_ms",
    "Server Compute Input": "server_input_ms",
    "Server Compute Infer": "server_infer_ms",
    "Server Compute Output": "server_output_ms",
    "Client Recv": "client_recv_ms",
}
SUMMARY = re.compile(r"Concurrency: (\d+), throughput: ([\d.]+) infer/sec, latency (\d+) usec")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def load_average() -> list[float]:
    return [round(value, 2) for value in os.getloadavg()]


def input_data(name: str, folder: Path) -> Path:
    """perf_analyzer's --input-data for one sample of `name` (its batch axis left out: max_batch_size > 0)."""
    sample = {
        tensor: {"content": array[0].ravel().tolist(), "shape": list(array.shape[1:])}
        for tensor, array in repository_models.inputs(name, 1).items()
    }
    path = folder / f"{name}.json"
    path.write_text(json.dumps({"data": [sample]}))
    return path


def get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            return int(answer.status), answer.read()
    except OSError:
        return 0, b""


def index(http_port: int) -> dict[str, str]:
    request = urllib.request.Request(f"http://127.0.0.1:{http_port}/v2/repository/index", data=b"{}", method="POST")
    with urllib.request.urlopen(request, timeout=5) as answer:
        return {entry["name"]: entry["state"] for entry in json.loads(answer.read())}


def wait_ready(process: subprocess.Popen[bytes], http_port: int, log: Path) -> None:
    """Until the repository is ready and every model READY; RuntimeError with the log's tail if not."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the repository exited ({process.returncode}):\n{log.read_text()[-4000:]}")
        ready = get(f"http://127.0.0.1:{http_port}/v2/health/ready")[0] == 200
        if ready and set(index(http_port).values()) == {"READY"}:
            return
        time.sleep(0.5)
    raise RuntimeError(f"the repository not ready within {READY_TIMEOUT_S:.0f} s:\n{log.read_text()[-4000:]}")


def parse(csv_path: Path, output: str) -> list[dict[str, Any]]:
    """One row per concurrency: throughput, latency percentiles and perf_analyzer's parts of a request, in ms."""
    means = {int(c): int(latency) / 1000 for c, _, latency in SUMMARY.findall(output)}
    rows = []
    with open(csv_path, newline="") as handle:
        for line in csv.DictReader(handle):
            concurrency = int(line["Concurrency"])
            row: dict[str, Any] = {
                "concurrency": concurrency,
                "throughput_per_s": round(float(line["Inferences/Second"]), 1),
                "mean_ms": means.get(concurrency),
            }
            row |= {key: round(int(line[column]) / 1000, 3) for column, key in LATENCIES.items()}
            row["parts_ms"] = {key: round(int(line[column]) / 1000, 3) for column, key in PARTS.items()}
            rows.append(row)
    return sorted(rows, key=lambda row: row["concurrency"])


def concurrencies(spec: str) -> list[int]:
    """The concurrencies perf_analyzer's --concurrency-range START[:END[:STEP]] visits."""
    parts = [int(part) for part in spec.split(":")]
    start = parts[0]
    end = parts[1] if len(parts) > 1 else start
    step = parts[2] if len(parts) > 2 else 1
    return list(range(start, end + 1, step))


def analyze_once(name: str, protocol: str, port: int, data: Path, window: tuple[int, int], args: argparse.Namespace,
                 folder: Path) -> dict[str, Any]:  # fmt: skip
    """One perf_analyzer sweep, `window` its requests per window and stability percentage: its rows, and its
    last lines where some concurrency did not settle."""
    requests, stability = window
    csv_path = folder / f"{name}-{protocol}-{requests}.csv"
    command = [str(ANALYZER), "-m", name, "-i", protocol, "-u", f"127.0.0.1:{port}", "--input-data", str(data),
               "--concurrency-range", args.concurrency, "--measurement-mode", "count_windows",
               "--measurement-request-count", str(requests), "--stability-percentage", str(stability),
               "--max-trials", str(args.max_trials), "-f", str(csv_path)]  # fmt: skip
    shown = shlex.join(["perf_analyzer", *command[1:]]).replace(str(folder) + "/", "")
    result: dict[str, Any] = {"command": shown, "load_before": load_average()}
    started = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    result |= {"seconds": round(time.monotonic() - started, 1), "load_after": load_average()}
    output = done.stdout + done.stderr
    rows = parse(csv_path, output) if csv_path.exists() else []  # the concurrencies that settled
    result["rows"] = rows
    result["ok"] = [row["concurrency"] for row in rows] == concurrencies(args.concurrency)
    if not result["ok"]:
        lines = [line.strip() for line in output.splitlines() if line.strip()]
        result |= {"exit": done.returncode, "message": "\n".join(lines[-3:])}
    return result


def analyze(name: str, protocol: str, port: int, data: Path, args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    """perf_analyzer's sweep on one model over one protocol. Where it does not settle, again (`--retries` times
    at most) with windows `--retry-factor` times longer, as its message advises, and the stability asked
    `--retry-stability`, as docs/oip.md advises on a busy machine; every try is kept."""
    window, tries = (args.requests, args.stability), []
    for _ in range(args.retries + 1):
        tries.append(analyze_once(name, protocol, port, data, window, args, folder))
        if tries[-1]["ok"]:
            break
        window = (window[0] * args.retry_factor, max(window[1], args.retry_stability))
    last = tries[-1]
    print(f"{name} over {protocol}: {'ok' if last['ok'] else last['message']} ({len(tries)} tries)", file=sys.stderr)
    return {"model": name, "protocol": protocol, **last, "earlier_tries": tries[:-1]}


def serve(root: Path, folder: Path, http_port: int, grpc_port: int) -> tuple[subprocess.Popen[bytes], Path]:
    run_dir = folder / "run"
    run_dir.mkdir(mode=0o700)
    log = folder / "repository.log"
    command = [sys.executable, "-m", "packrat_daemon", "serve", "--repository", str(root), "--http-port",
               str(http_port), "--grpc-port", str(grpc_port), "--run-dir", str(run_dir), *PINNED_ARGS]  # fmt: skip
    env = daemon_env(folder / "state")
    env["PACKRAT_CACHE_DIR"] = str(folder / "cache")
    with open(log, "wb") as out:
        process = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=REPO)
    return process, log


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", default="1:2", help="perf_analyzer's --concurrency-range")
    parser.add_argument("--requests", type=int, default=300, help="requests per count_windows window")
    parser.add_argument("--stability", type=int, default=20, help="perf_analyzer's --stability-percentage")
    parser.add_argument("--max-trials", type=int, default=20, help="windows before perf_analyzer gives up")
    parser.add_argument("--retries", type=int, default=1, help="tries again where a sweep did not settle")
    parser.add_argument("--retry-factor", type=int, default=3, help="each try's windows this many times longer")
    parser.add_argument("--retry-stability", type=int, default=30, help="a try's stability percentage, at least")
    parser.add_argument("--protocols", default="http,grpc")
    parser.add_argument("--models", default=",".join(repository_models.NAMES))
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "repository-perf.json")
    args = parser.parse_args()
    if not os.access(ANALYZER, os.X_OK):
        subprocess.run(["bash", str(REPO / "bench" / "peers" / "install_perf_analyzer.sh")], check=True)
    version = subprocess.run([str(ANALYZER), "--version"], capture_output=True, text=True).stdout.strip()
    report: dict[str, Any] = {
        "bench": "perf_analyzer against packrat serve --repository: three models, one HTTP and one gRPC port",
        "perf_analyzer": version or "tritonclient 2.51.0's wheel",
        "cores": len(os.sched_getaffinity(0)),
        "load_start": load_average(),
        "settings": {key: value for key, value in vars(args).items() if key != "out"},
    }
    with tempfile.TemporaryDirectory(prefix="packrat-repository-perf-") as tmp:
        folder = Path(tmp)
        root = repository_models.build(folder / "models")
        http_port, grpc_port = free_port(), free_port()
        report["serve"] = shlex.join(["packrat", "serve", "--repository", "MODELS", "--http-port", str(http_port),
                                      "--grpc-port", str(grpc_port), *PINNED_ARGS])  # fmt: skip
        process, log = serve(root, folder, http_port, grpc_port)
        try:
            wait_ready(process, http_port, log)
            report["index"] = index(http_port)
            ports = {"http": http_port, "grpc": grpc_port}
            report["runs"] = [
                analyze(name, protocol, ports[protocol], input_data(name, folder), args, folder)
                for name in args.models.split(",")
                for protocol in args.protocols.split(",")
            ]
        finally:
            stop_process(process, 60)
        report["repository_exit"] = process.returncode
        notes = [line for line in log.read_text().splitlines() if "WARNING" in line or "left out" in line]
        report["repository_notes"] = list(dict.fromkeys(line.split(": ", 1)[-1] for line in notes))[-10:]
    report["load_end"] = load_average()
    text = json.dumps(report, indent=1)
    args.out.write_text(text + "\n")
    print(text)
    return 0 if all(run["ok"] for run in report["runs"]) else 1


if __name__ == "__main__":
    sys.exit(main())
