"""`packrat demo`: the newcomer's first run — serve a built-in model and compare with one instance.

Starts the daemon with the packrat policy (it profiles the cells it needs, with a progress line),
then a second daemon with the `single` policy (PyTorch's default: one instance, all cores), sends the
same burst of requests to both through the client library, interleaved, and prints the plan and the
median latencies side by side. Both daemons are stopped before it returns.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from packrat_daemon.commands.options import add_settings, positive_int


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="serve a built-in model with packrat and with one instance, and compare their latency",
        description="Start the daemon on a built-in model, send a burst of requests, compare with `single`.",
    )
    add_settings(parser, ["model", "precision", "max_rel_error"])  # as `serve` takes them; both daemons use them
    parser.add_argument("--batch", type=positive_int, default=8, help="samples per request (default 8)")
    parser.add_argument("--requests", type=positive_int, default=8, help="requests per policy (default 8)")
    parser.set_defaults(run=run)


def _start(folder: Path, name: str, args: list[str]) -> tuple[subprocess.Popen, str]:
    endpoint = f"ipc://{folder}/{name}.ipc"
    command = [sys.executable, "-m", "packrat_daemon", "serve", "--endpoint", endpoint, "--log-level", "warning"]
    return subprocess.Popen([*command, *args]), endpoint


def _wait(process: subprocess.Popen, endpoint: str, timeout: float = 900.0) -> dict[str, Any]:
    from packrat_daemon.wire.client import Client, ClientTimeout

    deadline = time.monotonic() + timeout
    with Client(endpoint, timeout=2.0) as client:
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise SystemExit(f"packrat demo: the daemon exited with status {process.returncode}")
            try:
                return client.info()
            except ClientTimeout:
                continue
    raise SystemExit("packrat demo: the daemon did not become ready in time")


def run(args: argparse.Namespace) -> int:
    import numpy as np

    from packrat_daemon.wire.client import Client

    processes: list[subprocess.Popen] = []
    with tempfile.TemporaryDirectory(prefix="packrat-demo-") as tmp:
        folder = Path(tmp)
        common = ["--model", args.model, "--max-batch", str(args.batch), "--max-delay-ms", "0"]
        common += ["--precision", args.precision, "--max-rel-error", str(args.max_rel_error)]
        try:
            print(f"packrat demo: serving {args.model} with the packrat policy (profiling first) ...", file=sys.stderr)
            packrat, packrat_endpoint = _start(folder, "packrat", [*common, "--policy", "packrat"])
            processes.append(packrat)
            info = _wait(packrat, packrat_endpoint)
            print("packrat demo: starting the `single` baseline ...", file=sys.stderr)
            single, single_endpoint = _start(folder, "single", [*common, "--policy", "single"])
            processes.append(single)
            single_info = _wait(single, single_endpoint)
            spec = info["input"]
            rng = np.random.default_rng(0)
            shape = (args.batch, *spec["shape"])
            if spec["dtype"].startswith("float"):
                batch = rng.standard_normal(shape, dtype=np.float32).astype(spec["dtype"])
            else:
                batch = rng.integers(0, 100, shape).astype(spec["dtype"])
            times: dict[str, list[float]] = {"packrat": [], "single": []}
            with Client(packrat_endpoint, timeout=600) as fast, Client(single_endpoint, timeout=600) as base:
                clients = {"packrat": fast, "single": base}
                for client in clients.values():
                    client.infer(batch)  # warm-up: first calls build oneDNN primitives for this shape
                for _ in range(args.requests):
                    for name, client in clients.items():
                        start = time.perf_counter()
                        client.infer(batch)
                        times[name].append((time.perf_counter() - start) * 1000.0)
        finally:
            for process in processes:
                process.terminate()
            for process in processes:
                try:
                    process.wait(60)
                except subprocess.TimeoutExpired:
                    process.kill()
    plan = info["plan"]
    parts = ", ".join(f"{i['threads']} thread(s) × {i['batch']} input(s)" for i in plan["instances"])
    packrat_ms, single_ms = statistics.median(times["packrat"]), statistics.median(times["single"])
    print(f"model: {args.model}, batch {args.batch}, {args.requests} requests each (interleaved)")
    print(f"packrat plan: {len(plan['instances'])} instance(s): {parts}")
    predicted = plan.get("predicted_latency_ms")
    if predicted is not None:
        print(f"  predicted from the profile: {predicted:.1f} ms")
    print(f"  why: {plan['reason']}")
    print(f"median latency  packrat: {packrat_ms:8.1f} ms")
    print(f"median latency  single : {single_ms:8.1f} ms   (one instance, all cores: PyTorch's default)")
    print(f"speed-up of packrat over single: {single_ms / packrat_ms:.2f}×")
    for name, served in (("packrat", info), ("single", single_info)):
        guard = served.get("accuracy_guard")
        measured = "" if not guard else f" (accuracy guard: max relative error {guard['max_rel_error']:.2e})"
        print(f"{name} serves {served.get('runtime')} at {served.get('precision', 'fp32')}{measured}")
    if _layout(plan) == _layout(single_info["plan"]):
        print(
            "  packrat serves the same layout as single here (splitting is not predicted to pay on this "
            "machine), so the difference above is noise between two processes"
        )
    return 0


def _layout(plan: dict) -> list[int]:
    return sorted(instance["threads"] for instance in plan["instances"])
