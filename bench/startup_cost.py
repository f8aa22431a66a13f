"""How long `packrat serve`'s start-up profiling would take on a 16-core machine: full grid and adaptive.

    .venv/bin/python bench/startup_cost.py [--seed 0]

Replays the profiling on the 16-core tables in bench/profiles/ (measured by the paper's authors): every
cell the daemon would measure costs what measure.bench.Bench spends on it by default (warm-up runs, then
timed runs until the repeats are done or the cell's time cap has passed), each run taking the table's
latency. The full grid is what serve measures without --profile (measure.bench.default_grid); adaptive
is `packrat profile --adaptive` at its default budget, each measurement charged the same way, plus the
side-by-side confirmation of its distinct plans. Not counted: forking each thread count's workers and
loading the model (seconds each, machine-dependent), and interference between the side-by-side
instances a cell runs (the tables were measured one instance alone). Prints one JSON object.
"""

from __future__ import annotations

import argparse
import inspect
import json
import math
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "packrat_daemon" / "search"))  # the replay's gap rule

from packrat_daemon.commands.adaptive_search import MODEL_NOISE  # noqa: E402
from packrat_daemon.commands.solve import solve_plans  # noqa: E402
from packrat_daemon.measure.bench import Bench, default_grid  # noqa: E402
from packrat_daemon.search import Budget, adaptive_profile  # noqa: E402
from policies.planning.profile import Profile  # noqa: E402
from policies.planning.topology import Topology  # noqa: E402
from tests.helpers.replay_tables import gaps  # noqa: E402

TABLES = {"inception3": "bench/profiles/inception3-cloudlab16.csv", "bert": "bench/profiles/bert-cloudlab16.csv"}
CORES = 16
TARGETS = {"max_batch 16 (serve's default)": [1, 2, 4, 8, 16], "max_batch 64": [1, 4, 16, 64]}
DEFAULTS = {name: p.default for name, p in inspect.signature(Bench.__init__).parameters.items()}
BUDGET = "0.25"  # packrat profile --adaptive's default --budget


def cell_seconds(latency_ms: float) -> float:
    """What Bench.measure_cell spends on a cell whose every run takes `latency_ms` (no noisy re-runs)."""
    run_s = latency_ms / 1000.0
    timed = min(DEFAULTS["repeats"], max(1, math.ceil(DEFAULTS["max_cell_seconds"] / run_s)))
    return (DEFAULTS["warmup"] + timed) * run_s


def one_case(table: Profile, targets: list[int], seed: int) -> dict[str, Any]:
    threads, batches = default_grid(CORES, max(targets))
    grid = [(t, b) for t in threads for b in batches]

    def latency(t: int, b: int) -> float:
        value = table.lhat(t, b)
        assert value is not None, f"the table has no cell for ({t}, {b})"
        return value

    full_s = sum(cell_seconds(latency(t, b)) for t, b in grid)
    spent = [0.0]

    def measure(t: int, b: int) -> float:
        spent[0] += cell_seconds(latency(t, b))
        return latency(t, b)

    result = adaptive_profile(measure, grid, targets, CORES, budget=Budget.parse(BUDGET), seed=seed, noise=MODEL_NOISE)
    plans = solve_plans(result.profile, Topology.synthetic(CORES), targets, "packrat")
    distinct = {tuple((i["threads"], i["batch"]) for i in plan["instances"]) for plan in plans}
    # Bench.compare runs each distinct plan warm-up + `repeats` rounds side by side.
    confirm_s = sum(
        (DEFAULTS["warmup"] + DEFAULTS["repeats"]) * max(latency(t, b) for t, b in plan) / 1000.0 for plan in distinct
    )
    truth = {(t, b): latency(t, b) for t, b in grid}
    worst_gap = max(gaps(result, truth, CORES).values())
    return {
        "targets": targets,
        "grid_cells": len(grid),
        "full_seconds": round(full_s, 1),
        "adaptive_cells": len(result.measured),
        "adaptive_measurements": int(result.measurements),
        "adaptive_seconds": round(spent[0] + confirm_s, 1),
        "adaptive_confirmation_seconds": round(confirm_s, 1),
        "adaptive_worst_plan_gap": round(worst_gap, 4),
        "thread_counts_forked_full": len(threads),
        "thread_counts_forked_adaptive": len({t for t, _ in result.measured}),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    report: dict[str, Any] = {
        "kind": "replay of start-up profiling on measured 16-core tables (cost model: Bench's defaults)",
        "bench_defaults": {k: DEFAULTS[k] for k in ("warmup", "repeats", "max_cell_seconds")},
        "budget": BUDGET,
        "noise": MODEL_NOISE,
        "cases": [],
    }
    for name, path in TABLES.items():
        table = Profile.read_csv(ROOT / path)
        for label, targets in TARGETS.items():
            report["cases"].append({"table": name, "grid": label, **one_case(table, targets, args.seed)})
            print(f"{name}, {label}: done", file=sys.stderr)
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
