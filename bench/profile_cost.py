"""Adaptive vs full-grid profiling of a model on this machine: what each costs, and how good its plan is.

    .venv/bin/python bench/profile_cost.py [--model builtin:resnet50] [--batches 1-16] [--targets 8,12,16]
                                           [--budget 0.25] [--rounds 5] [--seed 0]

Both profiles are measured in one run from one loaded template: first every cell of the grid (as
`packrat profile` does), then the adaptive search (as `packrat profile --adaptive` does). Each target
batch size then gets two plans — solved on the full table and on the adaptive one — and both are run
side by side (every instance at once, interference included), their rounds interleaved, so the
latency ratio is fair on a noisy shared machine. Prints one JSON object on stdout; progress on stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from packrat_daemon.commands.adaptive_search import MODEL_NOISE
from packrat_daemon.commands.options import int_list
from packrat_daemon.measure.bench import Bench, model_session
from packrat_daemon.search import AdaptiveResult, Budget, adaptive_profile
from policies.planning.profile import Cell, Profile
from policies.planning.topology import Topology
from policies.solver import Solution, Solver


def log(text: str) -> None:
    print(f"[profile_cost] {text}", file=sys.stderr, flush=True)


def measure_full(profiler: Bench, grid: list[tuple[int, int]]) -> tuple[Profile, float]:
    started = time.monotonic()
    cells: dict[tuple[int, int], Cell] = {}
    for t, b in grid:  # grid order, threads outermost: one worker per thread count, as `packrat profile`
        cells[(t, b)] = profiler.measure_cell(t, b)
        log(f"full grid {len(cells)}/{len(grid)}: t={t} b={b} {cells[(t, b)].latency_ms:.1f} ms")
    return Profile(cells), time.monotonic() - started


def measure_adaptive(
    meter: Bench, grid: list[tuple[int, int]], targets: list[int], cores: int, budget: Budget, seed: int
) -> tuple[AdaptiveResult, float]:
    started = time.monotonic()

    def measure(t: int, b: int) -> float:
        latency = meter.measure_cell(t, b).latency_ms
        log(f"adaptive: t={t} b={b} {latency:.1f} ms")
        return latency

    result = adaptive_profile(measure, grid, targets, cores, budget=budget, seed=seed, noise=MODEL_NOISE)
    return result, time.monotonic() - started


def plan_json(solution: Solution, full: Profile) -> dict[str, Any]:
    lookups = [full.lhat(t, b) for t, b in solution.instances]
    return {
        "instances": [{"threads": int(t), "batch": int(b)} for t, b in solution.instances],
        "predicted_ms": round(solution.latency_ms, 3),
        # Its latency read from the full table under the solver's rule: the "true" latency in profile terms.
        "full_table_ms": round(max(x for x in lookups if x is not None), 3),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="builtin:resnet50")
    parser.add_argument("--batches", type=int_list, default=list(range(1, 17)), help="grid batches (default 1-16)")
    parser.add_argument("--targets", type=int_list, default=[8, 12, 16], help="batch sizes to plan for")
    parser.add_argument("--budget", default="0.25")
    parser.add_argument("--rounds", type=int, default=5, help="side-by-side rounds per plan")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    topology = Topology.detect()
    cores = topology.usable_cores
    threads = list(range(1, cores + 1))
    grid = [(t, b) for t in threads for b in args.batches]
    budget = Budget.parse(args.budget)
    started = time.monotonic()
    with model_session(args.model) as (backend, info):
        log(f"{args.model} loaded; {len(grid)} cells, {cores} cores")
        profiler = Bench(backend, topology, info, side_by_side=False)  # as adaptive measures
        try:
            full, full_seconds = measure_full(profiler, grid)
        finally:
            profiler.close()
        meter = Bench(backend, topology, info, side_by_side=False, keep_workers=True)
        try:
            adaptive, adaptive_seconds = measure_adaptive(meter, grid, args.targets, cores, budget, args.seed)
            meter.close()  # the cells' idle workers: the side-by-side runs get fresh, pinned ones
            solver = Solver(full, cores)
            plans = []
            for batch in args.targets:
                mine, theirs = adaptive.solutions[batch], solver.solve(batch)
                entry: dict[str, Any] = {
                    "batch": batch,
                    "full_grid_plan": plan_json(theirs, full),
                    "adaptive_plan": plan_json(mine, full),
                    "same_plan": sorted(mine.instances) == sorted(theirs.instances),
                }
                log(f"B={batch}: side by side")
                timings = meter.compare({"full": theirs.instances, "adaptive": mine.instances}, rounds=args.rounds)
                entry["side_by_side"] = {
                    "full_grid_ms": round(timings["full"].latency_ms, 3),
                    "adaptive_ms": round(timings["adaptive"].latency_ms, 3),
                    "adaptive_over_full": round(timings["adaptive"].latency_ms / timings["full"].latency_ms, 4),
                    "full_grid_wall_ms": round(timings["full"].wall_ms, 3),
                    "adaptive_wall_ms": round(timings["adaptive"].wall_ms, 3),
                }
                plans.append(entry)
        finally:
            meter.close()
    report = {
        "model": args.model,
        "cores": cores,
        "grid": {"threads": threads, "batches": args.batches, "cells": len(grid)},
        "targets": args.targets,
        "full_grid": {"cells": len(full), "seconds": round(full_seconds, 1)},
        "adaptive": {
            "cells": len(adaptive.measured),
            "measurements": adaptive.measurements,
            "seconds": round(adaptive_seconds, 1),
            "stopped": adaptive.stopped,
            "budget": args.budget,
            "seed": args.seed,
            "measured": adaptive.measured_cells(),
        },
        "adaptive_over_full": {
            # Measurements is the honest cost: a contested cell measured twice counts twice.
            "measurements": round(adaptive.measurements / len(full), 4),
            "distinct_cells": round(len(adaptive.measured) / len(full), 4),
            "seconds": round(adaptive_seconds / full_seconds, 4),
        },
        "plans": plans,
        "full_table_csv": full.to_csv(),
        "total_seconds": round(time.monotonic() - started, 1),
    }
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
