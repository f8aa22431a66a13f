"""Batching's delay: the old rule (every batch waits `--max-delay-ms` for company) against the new one
(a batch waits only when that is predicted to pay), side by side on the tiny model.

    .venv/bin/python bench/batching.py --base REV [--lone 300] [--pause-ms 10] [--window 8] [--rate 1500]

REV is a revision with the old rule (e.g. the commit before the new one); `git archive` unpacks it into
a temporary folder. One daemon of each tree serves `builtin:tiny-mlp` with the same settings (packrat
policy, `--max-batch 8`, the default `--max-delay-ms 1`), at the same time, and three loads are run on
both, interleaved request by request or phase by phase:

- idle: one request at a time with a pause between (`--lone`): median latency and queue wait;
- closed loop: `--window` requests always outstanding: throughput, median latency, mean batch size;
- open loop: Poisson arrivals at `--rate` requests/s for `--seconds`: median latency, mean batch size.

Batch sizes come from each daemon's `packrat_batch_size` histogram, read before and after a phase.
Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import zmq
from harness import REPO, free_port, stop, unpack_revision

from packrat_daemon.wire import client_side

MODEL = "builtin:tiny-mlp"
SETTINGS = ["--model", MODEL, "--policy", "packrat", "--max-batch", "8", "--log-level", "warning"]


class Served:
    """A daemon of one tree, a DEALER socket to it, and its metrics port."""

    def __init__(
        self, name: str, tree: Path, folder: Path, settings: list[str] = SETTINGS, env: dict | None = None
    ) -> None:
        self.name = name
        self.endpoint = f"ipc://{folder}/{name}.ipc"
        self.port = free_port()
        command = [sys.executable, "-m", "packrat_daemon", "serve", "--endpoint", self.endpoint]
        command += ["--metrics-port", str(self.port), *settings]
        self.log = folder / f"{name}.log"
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen(command, cwd=tree, stdout=log, stderr=subprocess.STDOUT, env=env)
        self.socket = zmq.Context.instance().socket(zmq.DEALER)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.connect(self.endpoint)
        self.next_id = 0

    def wait(self, timeout: float = 600.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise SystemExit(f"{self.name} daemon exited:\n{self.log.read_text()[-2000:]}")
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{self.port}/readyz", timeout=1).read()
                return
            except OSError:
                time.sleep(0.5)
        raise SystemExit(f"{self.name} daemon not ready:\n{self.log.read_text()[-2000:]}")

    def send(self, x: np.ndarray) -> None:
        self.next_id += 1
        self.socket.send_multipart(client_side.encode_infer_request(self.next_id, x), copy=True)

    def receive(self) -> dict[str, Any]:
        head, _ = client_side.decode_reply(self.socket.recv_multipart())
        return head

    def batches(self) -> tuple[float, float]:
        """(inputs, batches) so far, from the daemon's packrat_batch_size histogram."""
        text = urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=5).read().decode()
        values = {}
        for line in text.splitlines():
            if line.startswith(("packrat_batch_size_sum", "packrat_batch_size_count")):
                name, value = line.split()
                values[name] = float(value)
        return values["packrat_batch_size_sum"], values["packrat_batch_size_count"]

    def close(self) -> None:
        self.socket.close()
        stop(self.process, 30)


def idle(daemons: list[Served], x: np.ndarray, count: int, pause_s: float) -> dict[str, Any]:
    """One request at a time, alternating daemons, with a pause before each."""
    latency: dict[str, list[float]] = {d.name: [] for d in daemons}
    queue: dict[str, list[float]] = {d.name: [] for d in daemons}
    for k in range(count + 5):
        for daemon in daemons if k % 2 == 0 else daemons[::-1]:
            time.sleep(pause_s)
            started = time.perf_counter()
            daemon.send(x)
            head = daemon.receive()
            if k >= 5:  # warm-up
                latency[daemon.name].append((time.perf_counter() - started) * 1000.0)
                queue[daemon.name].append(head["timing"]["queue_ms"])
    return {
        name: {
            "requests": count,
            "median_ms": round(statistics.median(latency[name]), 3),
            "p90_ms": round(float(np.percentile(latency[name], 90)), 3),
            "median_queue_ms": round(statistics.median(queue[name]), 3),
        }
        for name in latency
    }


def closed_loop(daemon: Served, x: np.ndarray, window: int, seconds: float) -> dict[str, Any]:
    """`window` requests outstanding at all times for `seconds`."""
    inputs0, batches0 = daemon.batches()
    sent: dict[int, float] = {}
    latency: list[float] = []
    for _ in range(window):
        daemon.send(x)
        sent[daemon.next_id] = time.perf_counter()
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        head = daemon.receive()
        latency.append((time.perf_counter() - sent.pop(head["id"])) * 1000.0)
        daemon.send(x)
        sent[daemon.next_id] = time.perf_counter()
    elapsed = seconds
    for _ in range(len(sent)):
        daemon.receive()
    inputs, batches = daemon.batches()
    return {
        "window": window,
        "requests_per_s": round(len(latency) / elapsed, 1),
        "median_ms": round(statistics.median(latency), 3),
        "mean_batch": round((inputs - inputs0) / max(1.0, batches - batches0), 2),
    }


def open_loop(daemon: Served, x: np.ndarray, rate: float, seconds: float, seed: int) -> dict[str, Any]:
    """Poisson arrivals at `rate` requests/s; replies read while waiting for the next send."""
    inputs0, batches0 = daemon.batches()
    draw = random.Random(seed)
    sent: dict[int, float] = {}
    latency: list[float] = []
    poller = zmq.Poller()
    poller.register(daemon.socket, zmq.POLLIN)
    start = time.perf_counter()
    next_send = start
    while next_send - start < seconds:
        wait_ms = max(0.0, (next_send - time.perf_counter()) * 1000.0)
        if poller.poll(wait_ms):
            head = daemon.receive()
            latency.append((time.perf_counter() - sent.pop(head["id"])) * 1000.0)
            continue
        daemon.send(x)
        sent[daemon.next_id] = time.perf_counter()
        next_send += draw.expovariate(rate)
    while sent:
        head = daemon.receive()
        latency.append((time.perf_counter() - sent.pop(head["id"])) * 1000.0)
    inputs, batches = daemon.batches()
    return {
        "rate": rate,
        "requests": len(latency),
        "answered_per_s": round(len(latency) / seconds, 1),
        "median_ms": round(statistics.median(latency), 3),
        "p90_ms": round(float(np.percentile(latency, 90)), 3),
        "mean_batch": round((inputs - inputs0) / max(1.0, batches - batches0), 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, help="a revision with the old rule")
    parser.add_argument("--lone", type=int, default=300, help="idle requests per daemon")
    parser.add_argument("--pause-ms", type=float, default=10.0, help="pause before each idle request")
    parser.add_argument("--window", type=int, default=8, help="closed loop: requests outstanding")
    parser.add_argument("--rate", type=float, default=1500.0, help="open loop: requests/s")
    parser.add_argument("--seconds", type=float, default=5.0, help="length of each loaded phase")
    parser.add_argument("--rounds", type=int, default=3, help="loaded phases per daemon, alternating")
    args = parser.parse_args()
    x = np.random.default_rng(0).standard_normal((1, 16), dtype=np.float32)
    with tempfile.TemporaryDirectory(prefix="packrat-batching-") as tmp:
        folder = Path(tmp)
        base_tree = folder / "base"
        revision = unpack_revision(args.base, base_tree)
        daemons = [Served("old_rule", base_tree, folder), Served("new_rule", REPO, folder)]
        try:
            for daemon in daemons:
                daemon.wait()
            result: dict[str, Any] = {"model": MODEL, "settings": SETTINGS, "base": revision}
            result["idle"] = idle(daemons, x, args.lone, args.pause_ms / 1000.0)
            print(f"idle: {result['idle']}", file=sys.stderr)
            loaded: dict[str, dict[str, list[dict[str, Any]]]] = {d.name: {"closed": [], "open": []} for d in daemons}
            for k in range(args.rounds):
                for daemon in daemons if k % 2 == 0 else daemons[::-1]:
                    loaded[daemon.name]["closed"].append(closed_loop(daemon, x, args.window, args.seconds))
                    loaded[daemon.name]["open"].append(open_loop(daemon, x, args.rate, args.seconds, seed=k))
                    print(f"round {k + 1} {daemon.name}: {loaded[daemon.name]}", file=sys.stderr)
            result["loaded"] = loaded
            result["loaded_medians"] = {
                name: {
                    phase: {key: statistics.median(run[key] for run in runs) for key in ("median_ms", "mean_batch")}
                    | (
                        {"requests_per_s": statistics.median(run["requests_per_s"] for run in runs)}
                        if phase == "closed"
                        else {}
                    )  # fmt: skip
                    for phase, runs in phases.items()
                }
                for name, phases in loaded.items()
            }
        finally:
            for daemon in daemons:
                daemon.close()
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
