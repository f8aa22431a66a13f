"""The daemon's logic at many cores by simulation (`packrat simulate`'s engine): docs/evaluation.md's tables.

    .venv/bin/python bench/simulate.py [--tables a,b,c] [--duration 600] [--seed 13] > bench/results/simulate.json
    .venv/bin/python bench/simulate.py --render bench/results/simulate.json   # the docs' band tables

Every number here is a simulation: the daemon's own batcher, splitter, policy and online adaptation on a
virtual clock, each slice waiting as `packrat serve --runtime emulated`'s workers wait: its profile's
L̂(threads, rows) times the emulated interference f(cores busy) / f(its own threads). They say what the
daemon's logic does with those latencies, not what a real machine measures.

Every case runs at four interference points (BAND): none; the default (F = 1.157, fitted to Inception-v3
side by side on 16 cores); the table's model's own estimate (`--emulate-interference auto`, measured
on this machine by bench/interference.py and read from its JSON: Inception-v3's for the Inception table,
BERT-base's for BERT); and a pessimistic F = 1.4.

- (a) T = 16 on the shipped tables (bench/profiles/): one client at a time, batch B = 1…64, per policy,
  beside the solver's prediction. With no interference and no wait (max_delay 0) the simulation serves
  exactly L̂ of the plan, so at `none` this checks the plumbing for packrat and single, not a hypothesis.
- (b) T = 16 on the shipped tables under shifting traffic (phases of single inputs, batches of 8, and a
  1/16 mix) and bursty traffic (on 2 s, off 8 s): adaptive packrat, its start-up plan kept (--no-adapt),
  single, torchserve and the paper's estimator.
- (c) T = 32, 64, 128 on analytic tables: the Amdahl-style model of packrat_daemon/search/gp/physics.py
  fitted to each shipped 16-core table and read at T threads (no table was measured there), under Poisson
  traffic with a mix of request sizes.

Rates are set from what one instance with all T cores carries at max_batch (its capacity), so `single`
is loaded the same way on every table.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from packrat_daemon.commands.solve import solve_plans  # noqa: E402
from packrat_daemon.config import ServeConfig  # noqa: E402
from packrat_daemon.load.arrivals import BatchMix, Burst, Poisson, Trace, open_loop_schedule  # noqa: E402
from packrat_daemon.measure.emulation import Interference  # noqa: E402
from packrat_daemon.search.gp import physics  # noqa: E402
from packrat_daemon.simulate import Simulation, Traffic  # noqa: E402
from policies.planning.profile import Profile  # noqa: E402
from policies.planning.topology import Topology  # noqa: E402

TABLES = {"inception3": "bench/profiles/inception3-cloudlab16.csv", "bert": "bench/profiles/bert-cloudlab16.csv"}
CORES = [32, 64, 128]
BATCHES = [1, 2, 4, 8, 16, 32, 64]
MIX = "1:0.4,4:0.3,16:0.2,64:0.1"
MAX_BATCH = 64
LOAD = 0.5  # (c): offered inputs per second over the all-core instance's capacity at max_batch
POLICIES: dict[str, dict[str, Any]] = {
    "packrat": {"policy": "packrat"},
    "packrat_fixed": {"policy": "packrat", "adapt": False},
    "single": {"policy": "single"},
    "torchserve": {"policy": "torchserve"},
}
B_POLICIES: dict[str, dict[str, Any]] = {**POLICIES, "paper_estimator": {"policy": "paper-estimator"}}
B_MAX_BATCH = 32
SHIFT_PHASE_S = 60.0
SHIFT_PHASES = [("1", 0.4), ("8", 0.4), ("1:0.5,16:0.5", 0.4)]  # (mix, load), repeated over the duration
BURST = (2.0, 8.0)  # on, off seconds
BURST_MIX = "1:0.5,8:0.5"
BURST_LOAD = 1.0  # during a burst: the all-core instance's capacity
INTERFERENCE = "default"  # the main rows of (b) and (c), and what the emulated (b) runs use
PESSIMISTIC = "1.4"
ESTIMATES = ROOT / "bench" / "results" / "interference.json"  # bench/interference.py's measurements
ESTIMATE_OF = {"inception3": ("inception3", "resnet50"), "bert": ("bert-base",)}  # table → models, first found


def band(estimates: Path) -> dict[str, dict[str, str]]:
    """Per table, the four interference settings: none, default, the model's own estimate, pessimistic."""
    if not estimates.is_file():
        raise SystemExit(f"{estimates}: no estimates; run bench/interference.py first (docs/emulation.md)")
    models = json.loads(estimates.read_text())["models"]
    points = {}
    for table, names in ESTIMATE_OF.items():
        found = next((name for name in names if name in models), None)
        if found is None:
            raise SystemExit(f"{estimates} has no estimate for {table} (any of {', '.join(names)})")
        own = f"{models[found]['factor']:.4f}"
        points[table] = {"none": "none", "default": "default", "estimate": own, "pessimistic": PESSIMISTIC}
    return points


def capacity_inputs_per_s(table: Profile, cores: int, max_batch: int) -> float:
    latency = table.lhat(cores, max_batch)
    assert latency is not None
    return max_batch / (latency / 1000.0)


def analytic_table(measured: Profile, cores: int) -> tuple[Profile, dict[str, float]]:
    """The physics model fitted to `measured`, read at threads 1..cores × BATCHES; with the fit's error."""
    cells = list(measured)
    latencies = np.array([measured.latency(*cell) for cell in cells])
    theta = physics.fit(cells, latencies)
    error = np.abs(physics.predict(theta, cells) / latencies - 1.0)
    grid = [(t, b) for t in range(1, cores + 1) for b in BATCHES]
    table = Profile.from_latencies(dict(zip(grid, (float(x) for x in physics.predict(theta, grid)), strict=True)))
    return table, {"median_rel_error": float(np.median(error)), "max_rel_error": float(error.max())}


def simulate(
    table: Profile, cores: int, config: ServeConfig, traffic: Traffic, interference: str = INTERFERENCE
) -> dict[str, Any]:
    simulation = Simulation(config, table, cores, Interference.named(interference))
    report = simulation.run(traffic).to_json()
    looks = simulation.adapt_wall_s
    # Wall time, so not part of the simulation's result: what online adaptation's looks cost the loop.
    report["adapt_look_ms"] = {
        "looks": len(looks),
        "mean": round(1000 * sum(looks) / len(looks), 1) if looks else None,
        "max": round(1000 * max(looks), 1) if looks else None,
    }
    return report


def summary(report: dict[str, Any]) -> dict[str, Any]:
    """What a table row shows of one run, with the run's whole report beside it."""
    return {
        "p50_ms": report["latency_ms"]["p50"],
        "p99_ms": report["latency_ms"]["p99"],
        "throughput_rps": report["throughput_rps"],
        "errors": report["errors"],
        "reconfigurations": len(report["plan_changes"]) - 1,
        "adapt_look_ms": report["adapt_look_ms"],
        "report": report,
    }


def table_a(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    for name, path in TABLES.items():
        table = Profile.read_csv(ROOT / path)
        for batch in BATCHES:
            row: dict[str, Any] = {"table": name, "batch": batch}
            for point, interference in args.band[name].items():
                row[point] = {}
                for policy in ("packrat", "single", "torchserve"):
                    config = ServeConfig(policy=policy, max_batch=MAX_BATCH, batches=[batch], max_delay_ms=0.0)
                    traffic = Traffic(BatchMix.single(batch), concurrency=1, requests=200, seed=args.seed)
                    report = simulate(table, 16, config, traffic, interference=interference)
                    predicted = solve_plans(table, Topology.synthetic(16), [batch], policy)[0]["latency_ms"]
                    row[point][policy] = {"p50_ms": report["latency_ms"]["p50"], "predicted_ms": predicted}
            rows.append(row)
        print(f"(a) {name}: done", file=sys.stderr)
    return rows


def shifting_trace(capacity: float, duration_s: float, seed: int, phase_s: float = SHIFT_PHASE_S) -> Trace:
    """Poisson phases of `phase_s` seconds, each with its own request sizes, cycled over the duration."""
    rng = random.Random(seed)
    rows: list[tuple[float, int]] = []
    start = 0.0
    phase = 0
    while start < duration_s:
        text, load = SHIFT_PHASES[phase % len(SHIFT_PHASES)]
        mix = BatchMix.parse(text)
        process = Poisson(load * capacity / mix.mean)
        length = min(phase_s, duration_s - start)
        rows += [(start + t, samples) for t, samples in open_loop_schedule(process, mix, duration_s=length, rng=rng)]
        start += length
        phase += 1
    return Trace(tuple(rows), source="shifting phases")


def table_b(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    for name, path in TABLES.items():
        table = Profile.read_csv(ROOT / path)
        capacity = capacity_inputs_per_s(table, 16, B_MAX_BATCH)
        burst_mix = BatchMix.parse(BURST_MIX)
        traffics = {
            "shifting": Traffic(BatchMix.single(1), process=shifting_trace(capacity, args.duration, args.seed)),
            "bursty": Traffic(
                burst_mix,
                process=Burst(*BURST, BURST_LOAD * capacity / burst_mix.mean),
                duration_s=args.duration,
                seed=args.seed,
            ),
        }
        for pattern, traffic in traffics.items():
            row: dict[str, Any] = {"table": name, "traffic": pattern, "described": traffic.describe()}
            for point, interference in args.band[name].items():
                row[point] = {}
                for label, settings in B_POLICIES.items():
                    config = ServeConfig(max_batch=B_MAX_BATCH, batches=[B_MAX_BATCH], **settings)
                    row[point][label] = summary(simulate(table, 16, config, traffic, interference))
            rows.append(row)
            print(f"(b) {name} {pattern}: done", file=sys.stderr)
    return rows


def table_c(args: argparse.Namespace) -> list[dict[str, Any]]:
    mix = BatchMix.parse(MIX)
    rows = []
    for name, path in TABLES.items():
        measured = Profile.read_csv(ROOT / path)
        for cores in CORES:
            table, fit = analytic_table(measured, cores)
            rate = LOAD * capacity_inputs_per_s(table, cores, MAX_BATCH) / mix.mean
            row: dict[str, Any] = {"table": name, "cores": cores, "rate_rps": round(rate, 3), "fit": fit}
            for point, interference in args.band[name].items():
                row[point] = {}
                for label, settings in POLICIES.items():
                    started = time.monotonic()
                    config = ServeConfig(max_batch=MAX_BATCH, batches=[MAX_BATCH], **settings)
                    traffic = Traffic(mix, process=Poisson(rate), duration_s=args.duration, seed=args.seed)
                    row[point][label] = summary(simulate(table, cores, config, traffic, interference))
                    spent = time.monotonic() - started
                    print(f"(c) {name} T={cores} {point} {label}: {spent:.1f} s", file=sys.stderr)
            rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tables", default="a,b,c", help="which of docs/evaluation.md's tables to make")
    parser.add_argument("--duration", type=float, default=600.0, help="virtual seconds of traffic per case")
    parser.add_argument("--seed", type=int, default=13)
    parser.add_argument("--estimates", type=Path, default=ESTIMATES, help="bench/interference.py's JSON")
    parser.add_argument("--render", type=Path, help="print the band tables of this JSON as markdown, run nothing")
    args = parser.parse_args()
    if args.render:
        from simulate_band import render

        print(render(json.loads(args.render.read_text())))
        return
    makers = {"a": table_a, "b": table_b, "c": table_c}
    wanted = args.tables.split(",")
    unknown = [t for t in wanted if t not in makers]
    if unknown:
        parser.error(f"unknown table(s) {unknown}; choose from a, b, c")
    args.band = band(args.estimates)
    results: dict[str, Any] = {
        "kind": "simulation (virtual clock, the emulated workers' service times: L̂ × f(busy) / f(own threads))",
        "interference": args.band,
        "estimates": os.path.relpath(args.estimates, ROOT),
        "duration_s": args.duration,
        "seed": args.seed,
        "load": {"a": "one client, 200 requests", "b": {"shifting": SHIFT_PHASES, "phase_s": SHIFT_PHASE_S,
                 "burst_on_off_s": BURST, "burst_mix": BURST_MIX, "burst_load": BURST_LOAD},
                 "c": {"mix": MIX, "load": LOAD}},
    }  # fmt: skip
    for key in wanted:
        results[key] = makers[key](args)
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
