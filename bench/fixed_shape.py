"""Fixed-shape models unchanged by free axes (issue 40): today's daemon against the commit before them, side by side.

    .venv/bin/python bench/fixed_shape.py [--base 5f9bd7b] [--rounds 8] [--requests 10]

The free-axis change touched the request path every model takes (the frontend's checks, the batcher's budget, the
dispatcher's slices, the workers' layouts). This runs both trees at once — REV unpacked with `git archive` — on the
two models `bench/e2e.py` states its ratios for: built-in ResNet-50 (the compute) at batches 1, 4 and 16, and the tiny
model at batch 1 (the daemon's own per-request cost). Every daemon serves one fixed plan (one instance of every
core's thread, torch fp32), so only
the code differs. Each round sends `--requests` requests one after another to each daemon, in alternating order; the
figure is the median over rounds of today's median over the base's (1.0: unchanged; the target is within 3%).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

from batching import REPO, Served  # noqa: E402
from harness import unpack_revision  # noqa: E402

BASE = "5f9bd7b"  # the commit before 8874dd6, the free axes
CASES = {"builtin:resnet50": [1, 4, 16], "builtin:tiny-mlp": [1]}
SHAPES = {"builtin:resnet50": (3, 224, 224), "builtin:tiny-mlp": (16,)}


def round_trips(daemon: Served, x: np.ndarray, count: int, pause_s: float) -> list[float]:
    latencies = []
    for _ in range(count):
        time.sleep(pause_s)
        started = time.perf_counter()
        daemon.send(x)
        head = daemon.receive()
        if not head.get("ok", True):
            raise SystemExit(f"{daemon.name} failed a request: {head.get('error')}")
        latencies.append((time.perf_counter() - started) * 1000.0)
    return latencies


def one_model(model: str, batches: list[int], base_tree: Path, folder: Path, args: argparse.Namespace) -> dict:
    plan = f"{os.cpu_count() or 1}x{max(batches)}"  # one instance of every core's thread (THREADSxBATCH)
    settings = ["--model", model, "--runtime", "torch", "--precision", "fp32", "--policy", "fixed",
                "--plan", plan, "--max-batch", str(max(batches)), "--log-level", "warning"]  # fmt: skip
    tag = model.split(":")[-1]
    daemons = [
        Served(f"{tag}-base", base_tree, folder, [*settings, "--state-dir", str(folder / f"{tag}-base.state")]),
        Served(f"{tag}-today", REPO, folder, [*settings, "--state-dir", str(folder / f"{tag}-today.state")]),
    ]
    result: dict[str, Any] = {}
    try:
        for daemon in daemons:
            daemon.wait()
        for batch in batches:
            x = np.random.default_rng(batch).standard_normal((batch, *SHAPES[model]), dtype=np.float32)
            for daemon in daemons:  # warm-up: the first batches of a size fault in their buffers
                round_trips(daemon, x, 3, 0.0)
            rounds = []
            for k in range(args.rounds):
                medians = {}
                for daemon in daemons if k % 2 == 0 else daemons[::-1]:
                    medians[daemon.name] = statistics.median(round_trips(daemon, x, args.requests, args.pause_s))
                rounds.append(medians)
            base, today = daemons[0].name, daemons[1].name
            result[f"batch_{batch}"] = {
                "base_ms": round(statistics.median(r[base] for r in rounds), 3),
                "today_ms": round(statistics.median(r[today] for r in rounds), 3),
                "today_over_base": round(statistics.median(r[today] / r[base] for r in rounds), 4),
            }
            print(json.dumps({model: {f"batch_{batch}": result[f"batch_{batch}"]}}), file=sys.stderr)
    finally:
        for daemon in daemons:
            daemon.close()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default=BASE, help="the revision before the change")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--requests", type=int, default=10, help="per daemon per round, one after another")
    parser.add_argument("--pause-ms", dest="pause_s", type=lambda v: float(v) / 1000.0, default=0.02)
    parser.add_argument("--models", default=",".join(CASES), help="which of the two (default both)")
    parser.add_argument("--out", type=Path, default=BENCH / "results" / "fixed-shape.json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="packrat-fixed-shape-") as tmp:
        folder = Path(tmp)
        revision = unpack_revision(args.base, folder / "base")
        result: dict[str, Any] = {"base": revision, "load_average": round(os.getloadavg()[0], 2)}
        models = args.models.split(",")
        for model in models:
            result[model] = one_model(model, CASES[model], folder / "base", folder, args)
    ratios = [case["today_over_base"] for model in models for case in result[model].values()]
    result["within_3_percent"] = all(abs(r - 1.0) <= 0.03 for r in ratios)
    text = json.dumps(result, indent=1)
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
