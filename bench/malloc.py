"""glibc malloc as Packrat tunes it for its workers, against glibc's defaults, side by side.

    .venv/bin/python bench/malloc.py [--batches 4,16] [--rounds 10] [--idle 0.5] [--copies 2]
    .venv/bin/python bench/malloc.py --rounds 0 --copies 1 --creep 250   # does memory creep?

Spawned processes run built-in ResNet-50 with 2 threads under each setting: glibc's defaults; a
32 MiB mmap threshold with trimming off (what Packrat used before); Packrat's tuning
(packrat_daemon.fleet.backend.GLIBC_MALLOC_TUNING); and jemalloc and tcmalloc preloaded, where installed
(`packrat serve --allocator`). Each setting runs in --copies identical processes,
because page-fault counts and latency differ between processes. Calls go round all processes in turn
with an idle pause before each, as sparse traffic does. Prints JSON: per process the median latency,
the page faults of its last call and its peak resident memory; per setting the median over its
processes, and each setting's ratio to glibc's defaults. With --creep N, each process then runs N
calls at random batch sizes from 1 to 16 (the same sequence in each) and reports its resident memory
every 25 calls: a heap that never returns memory must still not grow without bound.
"""

from __future__ import annotations

import argparse
import contextlib
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

from packrat_daemon.fleet.backend import ALLOCATORS, GLIBC_MALLOC_TUNING, allocator_library
from packrat_daemon.wire.errors import ConfigError

SETTINGS: dict[str, dict[str, str]] = {
    "glibc_default": {},
    "threshold_32mib": {"MALLOC_MMAP_THRESHOLD_": str(32 << 20), "MALLOC_TRIM_THRESHOLD_": str(16 << 30)},
    "packrat": dict(GLIBC_MALLOC_TUNING),
}
for _name in ALLOCATORS:  # `packrat serve --allocator NAME`, where installed
    with contextlib.suppress(ConfigError):
        SETTINGS[_name] = {"LD_PRELOAD": str(allocator_library(_name))}
MALLOC_VARIABLES = sorted({name for setting in SETTINGS.values() for name in setting})


def _runner(conn: Any, batches: list[int]) -> None:
    import torch

    from workers.models.loading import load_model
    from workers.models.spec import sample_input

    torch.set_num_threads(2)
    model = load_model("builtin:resnet50")
    inputs = {b: torch.from_numpy(sample_input(model.input, b)).contiguous(memory_format=torch.channels_last)
              for b in batches}  # fmt: skip
    with torch.inference_mode():
        for x in inputs.values():
            model.module(x)
        conn.send("ready")
        while (batch := conn.recv()) is not None:
            if isinstance(batch, tuple):  # ("creep", calls)
                conn.send(_creep(model, batch[1]))
                continue
            faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            start = time.perf_counter()
            model.module(inputs[batch])
            elapsed = time.perf_counter() - start
            conn.send((elapsed, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults))


def _creep(model: Any, calls: int) -> list[float]:
    """Resident MB every 25 calls over `calls` random batch sizes (fixed seed: the same in every process)."""
    import random

    import torch

    from workers.models.spec import sample_input

    rng = random.Random(0)
    resident = []
    for call in range(1, calls + 1):
        batch = rng.randint(1, 16)
        model.module(torch.from_numpy(sample_input(model.input, batch)).contiguous(memory_format=torch.channels_last))
        if call % 25 == 0:
            resident.append(_rss_mb())
    return resident


def _rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


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


def _arguments() -> argparse.Namespace:
    """The command line; SETTINGS cut down to the settings chosen."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--batches", default="4,16")
    for flag, kind, default in (("--rounds", int, 10), ("--idle", float, 0.5), ("--copies", int, 2)):
        parser.add_argument(flag, type=kind, default=default)
    parser.add_argument("--creep", type=int, default=0, help="then N calls at random batch sizes, RSS every 25")
    parser.add_argument("--settings", default=",".join(SETTINGS), help=f"a subset of {','.join(SETTINGS)}")
    args = parser.parse_args()
    chosen = [name for name in args.settings.split(",") if name]
    unknown = [name for name in chosen if name not in SETTINGS]
    if unknown:
        parser.error(f"unknown setting(s) {', '.join(unknown)}; choose from {', '.join(SETTINGS)}")
    for name in list(SETTINGS):
        if name not in chosen:
            del SETTINGS[name]
    return args


def _rounds(
    args: argparse.Namespace, batches: list[int], runners: dict[str, Any]
) -> tuple[dict[str, dict[int, list[float]]], dict[str, dict[int, int]]]:
    """Each runner's call times (ms) per batch size, and its page faults in the last call, over the rounds."""
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
    return times, faults


def _medians(report: dict[str, Any], times: dict[str, dict[int, list[float]]], batches: list[int]) -> None:
    """The report's medians: each process's, each setting's (the median of its copies'), and over glibc's default."""
    processes = report["processes"]
    for name in times:
        processes[name]["median_ms"] = {b: statistics.median(times[name][b]) for b in batches}
    settings = {
        setting: {b: statistics.median(p["median_ms"][b] for n, p in processes.items()
                                       if n.split("#")[0] == setting) for b in batches}
        for setting in SETTINGS
    }  # fmt: skip
    report["median_ms"] = settings
    if "glibc_default" in settings:
        default = settings["glibc_default"]
        report["over_glibc_default"] = {s: {b: settings[s][b] / default[b] for b in batches} for s in SETTINGS}


def main() -> None:
    args = _arguments()
    batches = [int(b) for b in args.batches.split(",")]
    copies = range(args.copies)
    runners = {f"{name}#{copy}": start(batches, setting) for name, setting in SETTINGS.items() for copy in copies}
    for conn, _ in runners.values():
        conn.recv()
    times, faults = _rounds(args, batches, runners)
    processes: dict[str, dict[str, Any]] = {}
    for name, (_, pid) in runners.items():
        processes[name] = {"peak_rss_mb": peak_rss_mb(pid)}
    report: dict[str, Any] = {"model": "builtin:resnet50", "threads": 2, "idle_s": args.idle, "rounds": args.rounds,
                              "settings": SETTINGS, "processes": processes}  # fmt: skip
    if args.rounds:
        _medians(report, times, batches)
        for name in runners:
            processes[name]["faults_last_call"] = faults[name]
    if args.creep:
        print(f"creep: {args.creep} calls at random batch sizes in each process ...", file=sys.stderr, flush=True)
        report["creep_calls"] = args.creep
        for name, (conn, _) in runners.items():
            conn.send(("creep", args.creep))
            processes[name]["rss_mb_every_25_calls"] = conn.recv()
    for conn, _ in runners.values():
        conn.send(None)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
