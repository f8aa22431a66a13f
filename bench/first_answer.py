"""A first start and a restart on the defaults: how soon the daemon answers, how soon it serves its best
candidate, whether a request fails meanwhile, and whether a restart serves the chosen candidate at once.

    .venv/bin/python bench/first_answer.py [--model builtin:resnet50] [--batch 8] [--traffic-s 30]
                                           [--out bench/results/first-answer.json]

`packrat serve --model M` with no other flag than where it binds (tcp loopback, the default endpoint's kind),
its default state folder below a fresh $XDG_STATE_HOME and an empty conversion cache (never the user's). A
client sends the demo's traffic (one request of --batch sample inputs at a time, as `packrat demo` does) from
the moment the daemon is started: the first request waits in ZeroMQ's queue until the daemon binds, so its
answer is the time to the first answer. Every later request has --timeout-s; an error reply or a timeout
counts as failed. The
`status` reply is read every --status-every-s: which candidate is served, and which are still measured
(runtime_choice), so "the best candidate serves" is the first status after which nothing is left to measure
and the served one is the one chosen. --traffic-s after that, the daemon is stopped (SIGTERM) and started
again on the same state folder: its time to the first answer, whether it serves the same candidate decided at
the earlier start, and what its log says it did (templates started, profiling, guard runs).

Prints one JSON object (and writes it to --out). Timings taken on a machine that other work shares say so
in the report that cites them: start-up here is minutes of measuring on every core.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from harness import free_port  # noqa: E402  (bench/ is on sys.path)


class Traffic(threading.Thread):
    """The demo's client: one request at a time, from the daemon's start until stopped."""

    def __init__(self, endpoint: str, batch: int, started: float, first_timeout_s: float, timeout_s: float) -> None:
        super().__init__(daemon=True)
        self.endpoint, self.batch, self.started = endpoint, batch, started
        self.first_timeout_s, self.timeout_s = first_timeout_s, timeout_s
        self.first_answer_s: float | None = None
        self.answered = 0
        self.failed: list[dict[str, Any]] = []
        self.latencies_ms: list[float] = []
        self.stopping = threading.Event()

    def run(self) -> None:
        from packrat_daemon.wire.client import Client
        from packrat_daemon.wire.errors import PackratError

        with Client(self.endpoint, timeout=self.first_timeout_s) as client:
            try:  # waits in ZeroMQ's queue until the daemon binds, as the first request would
                sample = demo_input(client.info()["input"], self.batch)
            except PackratError as exc:
                self.failed.append({"at_s": round(time.monotonic() - self.started, 2), "error": f"info: {exc}"})
                return
            while not self.stopping.is_set():
                sent = time.monotonic()
                timeout = self.first_timeout_s if self.first_answer_s is None else self.timeout_s
                try:
                    client.infer(sample, timeout=timeout)
                except PackratError as exc:  # ServerError (an error reply) and ClientTimeout both
                    self.failed.append({"at_s": round(sent - self.started, 2), "error": f"{type(exc).__name__}: {exc}"})
                    if self.first_answer_s is None:
                        return
                    continue
                now = time.monotonic()
                if self.first_answer_s is None:
                    self.first_answer_s = now - self.started
                self.answered += 1
                self.latencies_ms.append((now - sent) * 1000.0)


def demo_input(spec: dict[str, Any], batch: int) -> np.ndarray:
    """The demo's input for the model `info` declares: standard normal floats, or small integers."""
    rng = np.random.default_rng(0)
    shape = (batch, *spec["shape"])
    if spec["dtype"].startswith("float"):
        return rng.standard_normal(shape, dtype=np.float32).astype(spec["dtype"])
    return rng.integers(0, 100, shape).astype(spec["dtype"])


def one_start(args: argparse.Namespace, folder: Path, name: str, env: dict[str, str]) -> dict[str, Any]:
    """Start the daemon, send traffic until --traffic-s after its first answer, read status meanwhile, stop it."""
    from packrat_daemon.wire.client import Client, ClientTimeout

    endpoint = f"tcp://127.0.0.1:{free_port()}"
    log_path = folder / f"{name}.log"
    command = [sys.executable, "-m", "packrat_daemon", "serve", "--model", args.model, "--endpoint", endpoint]
    started = time.monotonic()
    with open(log_path, "wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=REPO, env=env)
    traffic = Traffic(endpoint, args.batch, started, args.start_timeout_s, args.timeout_s)
    traffic.start()
    served: list[dict[str, Any]] = []  # each status read: when, what is served, what is still measured
    best_s: float | None = None
    try:
        with Client(endpoint, timeout=2.0) as watcher:
            deadline = started + args.start_timeout_s
            while time.monotonic() < deadline and process.poll() is None:
                # Traffic runs until the best candidate serves, then --traffic-s more: a stop while measuring
                # would leave the restart nothing decided to serve.
                if best_s is not None and time.monotonic() - started > best_s + args.traffic_s:
                    break
                try:
                    status = watcher.status()
                except ClientTimeout:
                    continue
                choice = status.get("runtime_choice") or {}
                measuring = [c["candidate"] for c in choice.get("candidates", []) if c["verdict"] == "measuring"]
                row = {
                    "at_s": round(time.monotonic() - started, 2),
                    "served": choice.get("served"),
                    "runtime": status.get("runtime"),
                    "precision": status.get("precision"),
                    "measuring": measuring,
                }
                if not served or (row["served"], row["measuring"]) != (served[-1]["served"], served[-1]["measuring"]):
                    served.append(row)
                if best_s is None and not measuring and not choice.get("switching") and choice.get("served"):
                    best_s = row["at_s"]
                time.sleep(args.status_every_s)
    finally:
        traffic.stopping.set()
        traffic.join(args.timeout_s + 5)
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
    log = log_path.read_text(errors="replace").splitlines()
    final = served[-1] if served else {}
    latencies = sorted(traffic.latencies_ms)
    return {
        "first_answer_s": None if traffic.first_answer_s is None else round(traffic.first_answer_s, 2),
        "best_serving_s": best_s,
        "served": final.get("served"),
        "runtime": final.get("runtime"),
        "precision": final.get("precision"),
        "served_over_time": served,
        "answered": traffic.answered,
        "failed": len(traffic.failed),
        "failures": traffic.failed[:20],
        "median_ms": None if not latencies else round(latencies[len(latencies) // 2], 2),
        "exit_status": process.returncode,
        "templates_started": sum(1 for line in log if "template process" in line and "loading " in line),
        "profiled": sorted(
            {line.split("profiling ", 1)[1].split()[0] for line in log if line.startswith("profiling ")}
        ),
        "guards_run": sum(1 for line in log if "accuracy guard: running" in line),
        "verdicts": [line.split("packrat.daemon: ", 1)[1] for line in log if "packrat.daemon: candidate " in line],
        "state_log": [line.split("packrat.daemon: ", 1)[1] for line in log if "packrat.daemon: state: " in line],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="builtin:resnet50")
    parser.add_argument("--batch", type=int, default=8, help="samples per request (the demo's default)")
    parser.add_argument("--traffic-s", type=float, default=30.0, help="traffic after the best serves")
    parser.add_argument("--timeout-s", type=float, default=60.0, help="a request after the first fails after this")
    parser.add_argument("--start-timeout-s", type=float, default=1800.0)
    parser.add_argument("--status-every-s", type=float, default=1.0)
    parser.add_argument("--out", default="bench/results/first-answer.json")
    args = parser.parse_args()
    result: dict[str, Any] = {
        "command": "bench/first_answer.py " + " ".join(sys.argv[1:]),
        "cores": len(os.sched_getaffinity(0)),
        "model": args.model,
        "batch": args.batch,
    }
    with tempfile.TemporaryDirectory(prefix="packrat-first-answer-") as tmp:
        folder = Path(tmp)
        env = dict(os.environ)
        env.pop("STATE_DIRECTORY", None)
        env["XDG_STATE_HOME"] = str(folder / "state-home")  # a fresh default state folder, kept for the restart
        env["PACKRAT_CACHE_DIR"] = str(folder / "cache")  # and no conversion made before: a new user's first start
        for name in ("fresh", "restart"):
            print(f"first_answer: {name} start of {args.model} ...", file=sys.stderr)
            result[name] = one_start(args, folder, name, env)
            print(json.dumps({name: result[name]}), file=sys.stderr)
    fresh, restart = result["fresh"], result["restart"]
    result["targets"] = {
        "first_answer_within_30_s": fresh["first_answer_s"] is not None and fresh["first_answer_s"] <= 30.0,
        "best_serving_within_300_s": fresh["best_serving_s"] is not None and fresh["best_serving_s"] <= 300.0,
        "no_failed_request": fresh["failed"] == 0 and restart["failed"] == 0,
        "restart_serves_the_chosen_candidate_at_once": restart["served"] == fresh["served"]
        and restart["templates_started"] == 1
        and not restart["profiled"]
        and restart["guards_run"] == 0,
    }
    text = json.dumps(result, indent=1)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
