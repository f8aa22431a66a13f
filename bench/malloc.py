"""glibc malloc as Packrat tunes it for its workers, against glibc's defaults, side by side.

    .venv/bin/python bench/malloc.py [--batches 4,16] [--rounds 10] [--idle 0.5] [--copies 2]

Spawned processes run built-in ResNet-50 with 2 threads under three settings: glibc's defaults; a
32 MiB mmap threshold with trimming off (what Packrat used before); and Packrat's tuning
(packrat_daemon.backend.GLIBC_MALLOC_TUNING). Each setting runs in --copies identical processes,
because page-fault counts and latency differ between processes. Calls go round all processes in turn
with an idle pause before each, as sparse traffic does. Prints JSON: per process the median latency,
the page faults of its last call and its peak resident memory; per setting the median over its
processes, and each setting's ratio to glibc's defaults.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import resource
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from packrat_daemon.backend import GLIBC_MALLOC_TUNING  # noqa: E402

SETTINGS: dict[str, dict[str, str]] = {
    "glibc_default": {},
    "threshold_32mib": {"MALLOC_MMAP_THRESHOLD_": str(32 << 20), "MALLOC_TRIM_THRESHOLD_": str(16 << 30)},
    "packrat": dict(GLIBC_MALLOC_TUNING),
}
MALLOC_VARIABLES = sorted({name for setting in SETTINGS.values() for name in setting})


def _runner(conn: Any, batches: list[int]) -> None:
    import torch

    from workers.models import load_model
    from workers.runtime import sample_input

    torch.set_num_threads(2)
    model = load_model("builtin:resnet50")
    inputs = {b: torch.from_numpy(sample_input(model.input, b)).contiguous(memory_format=torch.channels_last)
              for b in batches}  # fmt: skip
    with torch.inference_mode():
        for x in inputs.values():
            model.module(x)
        conn.send("ready")
        while (batch := conn.recv()) is not None:
            faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            start = time.perf_counter()
            model.module(inputs[batch])
            elapsed = time.perf_counter() - start
            conn.send((elapsed, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults))


def start(batches: list[int], setting: dict[str, str]) -> tuple[Any, int]:
    saved = {name: os.environ.get(name) for name in MALLOC_VARIABLES}
    for name in MALLOC_VARIABLES:
        os.environ.pop(name, None)
    os.environ.update(setting)
    context = mp.get_context("spawn")
    parent, child = context.Pipe()
    process = context.Process(target=_runner, args=(child, batches), daemon=True)
    process.start()  # glibc reads the environment when the process starts
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    return parent, process.pid


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batches", default="4,16")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--idle", type=float, default=0.5)
    parser.add_argument("--copies", type=int, default=2)
    args = parser.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    copies = range(args.copies)
    runners = {f"{name}#{copy}": start(batches, setting) for name, setting in SETTINGS.items() for copy in copies}
    for conn, _ in runners.values():
        conn.recv()
    times: dict[str, dict[int, list[float]]] = {name: {b: [] for b in batches} for name in runners}
    faults: dict[str, dict[int, int]] = {name: {} for name in runners}
    for round_number in range(args.rounds):
        print(f"round {round_number + 1}/{args.rounds}", file=sys.stderr, flush=True)
        for batch in batches:
            for name, (conn, _) in runners.items():
                time.sleep(args.idle)
                conn.send(batch)
                elapsed, faulted = conn.recv()
                times[name][batch].append(elapsed * 1000.0)
                faults[name][batch] = faulted
    processes = {
        name: {"median_ms": {b: statistics.median(times[name][b]) for b in batches}, "faults_last_call": faults[name],
               "peak_rss_mb": peak_rss_mb(pid)}
        for name, (_, pid) in runners.items()
    }  # fmt: skip
    for conn, _ in runners.values():
        conn.send(None)
    settings = {
        setting: {b: statistics.median(p["median_ms"][b] for n, p in processes.items() if n.split("#")[0] == setting)
                  for b in batches}
        for setting in SETTINGS
    }  # fmt: skip
    default = settings["glibc_default"]
    ratios = {setting: {b: settings[setting][b] / default[b] for b in batches} for setting in SETTINGS}
    print(json.dumps({"model": "builtin:resnet50", "threads": 2, "idle_s": args.idle, "rounds": args.rounds,
                      "settings": SETTINGS, "processes": processes, "median_ms": settings,
                      "over_glibc_default": ratios}, indent=2))  # fmt: skip


if __name__ == "__main__":
    main()
