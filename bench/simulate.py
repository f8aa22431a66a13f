"""The daemon at 32, 64 and 128 cores, by simulation (`packrat simulate`'s engine), on analytic tables.

    .venv/bin/python bench/simulate.py [--duration 600] [--seed 13]

No machine here has those cores, and no table was measured there: each analytic table is the Amdahl-style
model of packrat_daemon/search/gp/physics.py fitted to a shipped 16-core table (bench/profiles/) and read
at T threads. The numbers are therefore a model's, run through the daemon's own batcher, splitter, policy
and online adaptation on a virtual clock; they say what the daemon's logic does at T cores if the model
holds, not what a real machine would measure. Prints one JSON object; progress on stderr.

Traffic per (table, T): Poisson arrivals with a mix of request sizes, at half the rate one instance with
all T cores could carry at max_batch (so `single` is not overloaded by construction), for `--duration`
virtual seconds. Policies: packrat (adaptive), packrat with its start-up plan kept (--no-adapt), single,
torchserve.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from packrat_daemon.config import ServeConfig  # noqa: E402
from packrat_daemon.load.arrivals import BatchMix, Poisson  # noqa: E402
from packrat_daemon.search.gp import physics  # noqa: E402
from packrat_daemon.simulate import ServiceModel, Simulation, Traffic  # noqa: E402
from policies.planning.profile import Profile  # noqa: E402

TABLES = {"inception3": "bench/profiles/inception3-cloudlab16.csv", "bert": "bench/profiles/bert-cloudlab16.csv"}
CORES = [32, 64, 128]
BATCHES = [1, 2, 4, 8, 16, 32, 64]
MIX = "1:0.4,4:0.3,16:0.2,64:0.1"
MAX_BATCH = 64
LOAD = 0.5  # offered inputs per second over what one all-core instance carries at max_batch
POLICIES: dict[str, dict[str, Any]] = {
    "packrat": {"policy": "packrat"},
    "packrat_fixed": {"policy": "packrat", "adapt": False},
    "single": {"policy": "single"},
    "torchserve": {"policy": "torchserve"},
}


def analytic_table(measured: Profile, cores: int) -> tuple[Profile, dict[str, float]]:
    """The physics model fitted to `measured`, read at threads 1..cores × BATCHES; with the fit's error."""
    cells = list(measured)
    latencies = np.array([measured.latency(*cell) for cell in cells])
    theta = physics.fit(cells, latencies)
    error = np.abs(physics.predict(theta, cells) / latencies - 1.0)
    grid = [(t, b) for t in range(1, cores + 1) for b in BATCHES]
    table = Profile.from_latencies(dict(zip(grid, (float(x) for x in physics.predict(theta, grid)), strict=True)))
    return table, {"median_rel_error": float(np.median(error)), "max_rel_error": float(error.max())}


def run_case(table: Profile, cores: int, settings: dict[str, Any], rate: float, args: argparse.Namespace) -> dict:
    config = ServeConfig(max_batch=MAX_BATCH, batches=[MAX_BATCH], **settings)
    traffic = Traffic(BatchMix.parse(MIX), process=Poisson(rate), duration_s=args.duration, seed=args.seed)
    return Simulation(config, table, cores, ServiceModel(table, cores)).run(traffic).to_json()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--duration", type=float, default=600.0, help="virtual seconds of traffic per case")
    parser.add_argument("--seed", type=int, default=13)
    args = parser.parse_args()
    mix = BatchMix.parse(MIX)
    results: dict[str, Any] = {
        "kind": "simulation on analytic tables (physics model fitted to measured 16-core tables, read at T threads)",
        "traffic": f"poisson, batch mix {MIX}, {LOAD:.0%} of one all-core instance's capacity at max_batch",
        "duration_s": args.duration,
        "seed": args.seed,
        "max_batch": MAX_BATCH,
        "interference": "none",
        "cases": [],
    }
    for name, path in TABLES.items():
        measured = Profile.read_csv(ROOT / path)
        for cores in CORES:
            table, fit = analytic_table(measured, cores)
            single_ms = table.lhat(cores, MAX_BATCH)
            assert single_ms is not None
            rate = LOAD * (MAX_BATCH / (single_ms / 1000.0)) / mix.mean
            case: dict[str, Any] = {"table": name, "cores": cores, "rate_rps": round(rate, 3), "fit": fit}
            for label, settings in POLICIES.items():
                started = time.monotonic()
                case[label] = run_case(table, cores, settings, rate, args)
                print(f"{name} T={cores} {label}: {time.monotonic() - started:.1f} s", file=sys.stderr)
            results["cases"].append(case)
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
