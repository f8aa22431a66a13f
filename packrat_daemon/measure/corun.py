"""A model alone and side by side on this machine's cores: the measurement behind `--emulate-interference auto`.

    python -m packrat_daemon.measure.corun --model SPEC --cpus 0,1 --batches 1,4 --rounds 5

Run in a child process of its own by packrat_daemon.measure.interference: it imports torch, which the
daemon never does. The model is loaded once and forked into one worker per CPU, each pinned to its CPU
with one intra-op thread, as a worker of an all-1-thread plan runs. Per batch, each round times the
first worker's call twice, in an order that alternates from round to round:

- alone: the other workers idle;
- side by side: every other worker runs the same call over and over, started before the timed one and
  stopped after it, so the timed call never runs with fewer cores busy.

Calls are timed in CPU time of the worker's process as well as wall time. Interference (shared caches,
memory bandwidth) makes a call spend more CPU time; another program taking the core meanwhile does not,
so the CPU-time ratio can still be read on a machine shared with other work. What such a machine does
change is how much of the time the instances really ran at once: each worker's share of wall time on a
core is printed with it, and the measurement raises its own priority where it may (PRIORITY, as root),
so that its instances take their cores from other work while they are timed. Prints one JSON object
(`Estimate.from_run` reads it).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import sys
import time
from collections.abc import Sequence
from multiprocessing.connection import Connection
from multiprocessing.synchronize import Event
from typing import Any

WARMUP_CALLS = 2  # per worker and batch: the first calls of a fresh process allocate and pick kernels
# The niceness asked for (lower runs first): enough that co-runners of other programs get a small share
# of the cores for the minute or two this takes. Without the privilege the process keeps its own.
PRIORITY = -15


def _raise_priority() -> int:
    """Ask for PRIORITY; the niceness this process runs at, either way (its workers inherit it)."""
    with contextlib.suppress(OSError):  # unprivileged: measured at its own niceness; on_cpu will say so
        os.setpriority(os.PRIO_PROCESS, 0, PRIORITY)
    return os.getpriority(os.PRIO_PROCESS, 0)


def _worker(cpu: int, runtime: Any, inputs: dict[int, Any], conn: Connection, stop: Event) -> None:
    os.sched_setaffinity(0, {cpu})
    runtime.set_threads(1)
    runtime.serve_only()
    for batch in inputs.values():
        for _ in range(WARMUP_CALLS):
            runtime.run(batch)
    conn.send("ready")
    while True:
        command, batch = conn.recv()
        if command == "stop":
            return
        if command == "once":
            conn.send(_timed(runtime, inputs[batch]))
            continue
        conn.send("started")  # "loop": the caller starts the timed call once every looper has said so
        cpu_s, wall_s, calls = time.process_time(), time.perf_counter(), 0
        while not stop.is_set():
            runtime.run(inputs[batch])
            calls += 1
        conn.send({"calls": calls, "on_cpu": (time.process_time() - cpu_s) / (time.perf_counter() - wall_s)})


def _timed(runtime: Any, batch: Any) -> dict[str, float]:
    cpu_s, wall_s = time.process_time(), time.perf_counter()
    runtime.run(batch)
    return {"cpu_ms": (time.process_time() - cpu_s) * 1000.0, "wall_ms": (time.perf_counter() - wall_s) * 1000.0}


def _side_by_side(conns: list[Connection], stop: Event, batch: int) -> dict[str, Any]:
    first, others = conns[0], conns[1:]
    for conn in others:
        conn.send(("loop", batch))
    for conn in others:
        conn.recv()  # "started"
    first.send(("once", batch))
    timed = first.recv()
    stop.set()
    loops = [conn.recv() for conn in others]
    stop.clear()
    timed["others_on_cpu"] = min(loop["on_cpu"] for loop in loops)
    return timed


def measure(
    model: str, input_override: str | None, cpus: Sequence[int], batches: Sequence[int], rounds: int
) -> dict[str, Any]:
    """Every round's timings, per batch: {"rounds": {b: [{"alone": {...}, "side": {...}}, ...]}, ...}."""
    import torch

    from workers.models.spec import sample_input
    from workers.runtimes.torch_runtime import TorchRuntime

    niceness = _raise_priority()
    runtime = TorchRuntime()
    spec = runtime.load(model, input_override)  # in this process, one thread: the workers fork from it
    inputs = {batch: sample_input(spec, batch) for batch in batches}
    context = multiprocessing.get_context("fork")
    stop = context.Event()
    pipes = [context.Pipe() for _ in cpus]
    workers = [
        context.Process(target=_worker, args=(cpu, runtime, inputs, child, stop), daemon=True)
        for cpu, (_, child) in zip(cpus, pipes, strict=True)
    ]
    for worker in workers:
        worker.start()
    conns = [parent for parent, _ in pipes]
    try:
        for conn in conns:
            conn.recv()  # "ready"
        timings: dict[str, list[dict[str, Any]]] = {}
        for batch in batches:
            timings[str(batch)] = []
            for round_ in range(rounds):
                result: dict[str, Any] = {}
                for phase in ("alone", "side") if round_ % 2 == 0 else ("side", "alone"):
                    if phase == "alone":
                        conns[0].send(("once", batch))
                        result["alone"] = conns[0].recv()
                    else:
                        result["side"] = _side_by_side(conns, stop, batch)
                timings[str(batch)].append(result)
    finally:
        for conn in conns:
            conn.send(("stop", 0))
        for worker in workers:
            worker.join(timeout=60)
    return {"model": model, "cpus": list(cpus), "torch": torch.__version__, "niceness": niceness, "rounds": timings}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m packrat_daemon.measure.corun")
    parser.add_argument("--model", required=True)
    parser.add_argument("--input")
    parser.add_argument("--cpus", required=True, help="logical CPUs, one worker pinned to each, e.g. 0,1")
    parser.add_argument("--batches", default="1,4")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    cpus = [int(cpu) for cpu in args.cpus.split(",")]
    batches = [int(batch) for batch in args.batches.split(",")]
    print(json.dumps(measure(args.model, args.input, cpus, batches, args.rounds)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
