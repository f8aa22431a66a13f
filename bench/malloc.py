"""glibc malloc as Packrat tunes it for its workers, against glibc's defaults, side by side.

    .venv/bin/python bench/malloc.py [--batch 4] [--rounds 10] [--idle 1.0]

Two spawned processes run built-in ResNet-50 with 2 threads, one with Packrat's
MALLOC_MMAP_THRESHOLD_/MALLOC_TRIM_THRESHOLD_ settings (packrat_daemon.backend.GLIBC_MALLOC_TUNING) and
one without; calls alternate between them with an idle pause before each, as sparse traffic does.
Prints JSON: median latency of each and their ratio.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from packrat_daemon.backend import GLIBC_MALLOC_TUNING  # noqa: E402


def _runner(conn: Any, batch: int) -> None:
    import torch

    from workers.models import load_model
    from workers.runtime import sample_input

    torch.set_num_threads(2)
    model = load_model("builtin:resnet50")
    x = torch.from_numpy(sample_input(model.input, batch)).contiguous(memory_format=torch.channels_last)
    with torch.inference_mode():
        model.module(x)
        conn.send("ready")
        while conn.recv():
            start = time.perf_counter()
            model.module(x)
            conn.send(time.perf_counter() - start)


def start(batch: int, tuned: bool) -> Any:
    saved = {k: os.environ.get(k) for k in GLIBC_MALLOC_TUNING}
    for key, value in GLIBC_MALLOC_TUNING.items():
        if tuned:
            os.environ[key] = value
        else:
            os.environ.pop(key, None)
    context = mp.get_context("spawn")
    parent, child = context.Pipe()
    context.Process(target=_runner, args=(child, batch), daemon=True).start()  # glibc reads the env at start
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    parent.recv()
    return parent


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--idle", type=float, default=1.0)
    args = parser.parse_args()
    runners = {"glibc_default": start(args.batch, tuned=False), "packrat_tuned": start(args.batch, tuned=True)}
    times: dict[str, list[float]] = {name: [] for name in runners}
    for _ in range(args.rounds):
        for name, conn in runners.items():
            time.sleep(args.idle)
            conn.send(True)
            times[name].append(conn.recv() * 1000.0)
    for conn in runners.values():
        conn.send(False)
    medians = {name: statistics.median(v) for name, v in times.items()}
    print(json.dumps({"model": "builtin:resnet50", "threads": 2, "batch": args.batch, "idle_s": args.idle,
                      "median_ms": medians, "tuned_over_default": medians["packrat_tuned"] / medians["glibc_default"]},
                     indent=2))  # fmt: skip


if __name__ == "__main__":
    main()
