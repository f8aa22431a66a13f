"""The family of latency tables the co-location rules are judged on (`bench/colocation.py --family`).

Issue 42: the rules were tuned on two 16-core tables and judged on none they had not seen. Here every rule
is judged on a family, some of it held out while tuning:

- **shipped**: the measured 16-core tables of bench/profiles/ (BERT, Inception-v3), read as measured at 16
  cores and extrapolated by the physics model (packrat_daemon/search/gp/physics.py) at 32 and 64;
- **here**: this machine's built-in ResNet-50, measured on its 2 cores (bench/results/stand-ins.json's
  profile, threads 1–2 × batches 1, 2, 4), extrapolated by the physics model;
- **analytic**, L(t, b) = overhead + b·(serial + parallel / speedup(t)) × drag(t), across serial fractions
  and scaling shapes: compute-bound (speedup t; 2% and 20% serial), memory-bound that stops scaling early
  (speedup min(t, 4)), saturating (speedup t / (1 + (t − 1)/8)) and with an interference slow-down that
  grows with busy cores (drag 1 + 0.02·(t − 1): past a point more threads are slower).

Groups are pairs and triples of them at 16, 32 and 64 cores. HELD_OUT tables (and every group holding one)
were not looked at while the rules were tuned; the JSON and docs/colocation.md mark them.
"""

from __future__ import annotations

import json
import multiprocessing
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from packrat_daemon.config import ServeConfig
from packrat_daemon.load.arrivals import BatchMix
from packrat_daemon.measure.emulation import Interference
from packrat_daemon.search.gp import physics
from packrat_daemon.simulate.colocated import CoordinatorSettings, Model, Phase, phased, simulate_colocated
from packrat_daemon.simulate.colocated_replay import ReplaySettings
from packrat_daemon.simulate.run import Traffic
from policies.colocation import ModelDemand, evaluate
from policies.planning.distribution import BatchDistribution
from policies.planning.profile import Profile

ROOT = Path(__file__).resolve().parent.parent
THREAD_GRID = (1, 2, 3, 4, 6, 8, 12, 16, 20, 24, 32, 40, 48, 56, 64)
BATCHES = (1, 2, 4, 8, 16, 32)
MAX_BATCH = 32
PHASE_S = 20.0  # shift: each model busy for one phase, in turn
SETTLE_S = 8.0  # a move this soon after a phase change follows it; later, it is a move in a steady phase
BURST_S = 30.0  # bursts: their pattern is steady, so every move after SETTLE_S counts as one in a steady phase
SHAPES = {  # (busy, light) fractions of capacity for shift; (in a burst, between bursts) for burst
    "shift-heavy": ("shift", 0.8, 0.5),
    "shift-light": ("shift", 0.3, 0.1),
    "burst": ("burst", 1.2, 0.3),
}
BURST = (2.0, 3.0)  # seconds on, off; the models' bursts offset evenly over the cycle


@dataclass(frozen=True)
class Table:
    name: str
    kind: str  # shipped, here or analytic
    mix: str  # the batch sizes its clients send (BatchMix form)
    what: str


TABLES = {
    t.name: t
    for t in (
        Table("bert", "shipped", "1", "BERT, measured on a 16-core server (bench/profiles)"),
        Table("inception3", "shipped", "1:0.5,4:0.5", "Inception-v3, measured on a 16-core server (bench/profiles)"),
        Table("resnet50-here", "here", "1:0.5,4:0.5", "builtin:resnet50 measured on this 2-core machine, extrapolated"),
        Table("compute-2", "analytic", "1:0.5,2:0.5", "compute-bound, 2% serial"),
        Table("compute-20", "analytic", "1", "compute-bound, 20% serial"),
        Table("memory", "analytic", "1:0.5,4:0.5", "memory-bound: stops scaling at 4 threads"),
        Table("saturating", "analytic", "1", "saturating: speedup t / (1 + (t - 1) / 8)"),
        Table("interfering", "analytic", "1:0.5,2:0.5", "slow-down growing 2% per extra busy core"),
    )
}
# Not looked at while tuning: the built-in measured here, the saturating and the interfering shapes.
HELD_OUT = frozenset({"resnet50-here", "saturating", "interfering"})
GROUPS: dict[int, list[tuple[str, ...]]] = {
    16: [("bert", "inception3"), ("compute-2", "memory"), ("bert", "compute-20"),
         ("resnet50-here", "interfering"), ("inception3", "saturating"), ("bert", "memory", "saturating")],
    32: [("bert", "inception3"), ("compute-20", "memory"), ("inception3", "compute-2"),
         ("resnet50-here", "saturating"), ("memory", "interfering"), ("bert", "inception3", "compute-2")],
    64: [("bert", "inception3"), ("compute-2", "compute-20"), ("memory", "inception3"),
         ("saturating", "interfering"), ("resnet50-here", "bert"), ("inception3", "compute-20", "interfering")],
}  # fmt: skip
# Analytic shapes: (overhead ms, serial ms, parallel ms per input, speedup(t), drag(t)).
Shape = tuple[float, float, float, Callable[[int], float], Callable[[int], float]]
ANALYTIC: dict[str, Shape] = {
    "compute-2": (2.0, 1.2, 60.0, float, lambda t: 1.0),
    "compute-20": (2.0, 8.0, 32.0, float, lambda t: 1.0),
    "memory": (1.0, 2.0, 40.0, lambda t: float(min(t, 4)), lambda t: 1.0),
    "saturating": (2.0, 1.0, 50.0, lambda t: t / (1.0 + (t - 1) / 8.0), lambda t: 1.0),
    "interfering": (1.0, 0.5, 40.0, float, lambda t: 1.0 + 0.02 * (t - 1)),
}


def held_out(names: Sequence[str]) -> bool:
    return any(name in HELD_OUT for name in names)


def measured_here() -> Profile:
    """builtin:resnet50 as bench/stand_ins.py measured it on this machine (threads,batch → ms)."""
    data = json.loads((ROOT / "bench" / "results" / "stand-ins.json").read_text())
    cells = {tuple(int(x) for x in key.split(",")): float(ms) for key, ms in data["profile"].items()}
    return Profile.from_latencies(cells, model="resnet50-here")  # type: ignore[arg-type]


def extrapolated(measured: Profile, cores: int, name: str) -> Profile:
    cells = list(measured)
    theta = physics.fit(cells, np.array([measured.latency(*cell) for cell in cells]))
    grid = [(t, b) for t in THREAD_GRID if t <= cores for b in BATCHES]
    return Profile.from_latencies(
        dict(zip(grid, (float(x) for x in physics.predict(theta, grid)), strict=True)), model=name
    )


def table(name: str, cores: int) -> Profile:
    """The family's table `name` on a machine of `cores`."""
    if name in ANALYTIC:
        overhead, serial, parallel, speedup, drag = ANALYTIC[name]
        threads = [t for t in THREAD_GRID if t <= cores]
        cells = {(t, b): (overhead + b * (serial + parallel / speedup(t))) * drag(t) for t in threads for b in BATCHES}
        return Profile.from_latencies(cells, model=name)
    if name == "resnet50-here":
        return extrapolated(measured_here(), cores, name)
    measured = Profile.read_csv(ROOT / "bench" / "profiles" / f"{name}-cloudlab16.csv")
    return measured if cores == 16 else extrapolated(measured, cores, name)


def capacity_rps(name: str, profile: Profile, cores: int) -> float:
    """Requests per second the model's own plan on all `cores` carries, one request per batch."""
    mix = BatchMix.parse(TABLES[name].mix)
    distribution = BatchDistribution.from_counts(dict(zip(mix.sizes, mix.weights, strict=True)))
    share = evaluate([ModelDemand(name, profile, distribution, 1.0)], [cores]).shares[0]
    return 1000.0 / share.service_ms


def phases_of(shape: str, index: int, models: int, capacity: float) -> list[Phase]:
    kind, high, low = SHAPES[shape]
    if kind == "shift":  # model `index` busy in phase `index`, the others light
        return [Phase(PHASE_S, (high if k == index else low) * capacity) for k in range(models)]
    on, off = BURST
    cycle = on + off
    lead = cycle * index / models
    pieces = [Phase(lead, low * capacity)] if lead > 0 else []
    pieces.append(Phase(on, high * capacity))
    if cycle - lead - on > 0:
        pieces.append(Phase(cycle - lead - on, low * capacity))
    return pieces


def scenario(names: Sequence[str], cores: int, shape: str, seed: int) -> tuple[list[Model], list[float], float]:
    """The models with their traffic; the times the traffic changes (its steady phases start SETTLE_S later);
    the run's length."""
    kind = SHAPES[shape][0]
    duration = PHASE_S * len(names) if kind == "shift" else BURST_S
    models = []
    for index, name in enumerate(names):
        profile = table(name, cores)
        mix = BatchMix.parse(TABLES[name].mix)
        phases = phases_of(shape, index, len(names), capacity_rps(name, profile, cores))
        trace = phased(phases, mix, duration, random.Random(seed * 1000 + index))
        config = ServeConfig(max_batch=MAX_BATCH, adapt=False, batches=list(mix.sizes), max_delay_ms=0.0)
        models.append(Model(name, config, profile, Traffic(mix, process=trace)))
    # The start, each phase change and the traffic's end (a move as the last requests drain follows it).
    changes = [k * PHASE_S for k in range(len(names))] if kind == "shift" else [0.0]
    changes.append(duration)
    return models, changes, duration


def in_steady_phase(t_s: float, changes: Sequence[float]) -> bool:
    return not any(0 <= t_s - change < SETTLE_S for change in changes)


def describe() -> dict[str, Any]:
    """The family as the JSON states it."""
    return {
        "tables": {
            name: {"kind": t.kind, "mix": t.mix, "what": t.what, "held_out": name in HELD_OUT}
            for name, t in TABLES.items()
        },
        "held_out": sorted(HELD_OUT),
        "groups": {str(cores): [list(g) for g in groups] for cores, groups in GROUPS.items()},
        "shapes": {name: {"kind": k, "high": h, "low": lo} for name, (k, h, lo) in SHAPES.items()},
        "phase_s": PHASE_S,
        "settle_s": SETTLE_S,
        "burst_s": BURST_S,
        "burst_on_off_s": BURST,
    }


# -- running it ----------------------------------------------------------------------------------------

STRATEGIES = ("joint", "every", "even", "proportional")
SIMPLE = ("every", "even", "proportional")
# `--replay`: the joint strategy scores its candidate splits by a replay of the recent traffic
# (packrat_daemon/simulate/colocated_replay.py) instead of the closed-form prediction. Judged on the family
# and not accepted (docs/colocation.md, "Scoring by a replay"): off unless asked.
REPLAY = ReplaySettings()


def settings_for(strategy: str, replay: ReplaySettings | None = None) -> CoordinatorSettings:
    return CoordinatorSettings(strategy=strategy, replay=replay if strategy == "joint" else None)


def run_group(case: tuple[int, tuple[str, ...], str, int, ReplaySettings | None]) -> dict[str, Any]:
    """One group on one machine under one traffic shape: each strategy on the same traffic (same seed)."""
    cores, names, shape, seed, replay = case
    models, changes, duration = scenario(names, cores, shape, seed)
    row: dict[str, Any] = {
        "cores": cores, "models": list(names), "shape": shape, "held_out": held_out(names), "seconds": duration,
    }  # fmt: skip
    for strategy in STRATEGIES:
        started = time.process_time()
        result = simulate_colocated(models, cores, settings_for(strategy, replay), Interference.named("default"))
        report = result.to_json()
        looks = result.coordinator.replay_looks_s  # CPU seconds of the replays, per look that replayed
        steady = [m for m in report["moves"] if in_steady_phase(m["t_s"], changes)]
        row[strategy] = {
            "p50_ms": report["overall"]["p50_ms"],
            "p99_ms": report["overall"]["p99_ms"],
            "mean_ms": report["overall"]["mean_ms"],
            "moves": report["moves_made"],
            "moves_in_steady_phases": len(steady),
            "modes": [m.get("mode") for m in report["moves"]],
            "moves_at": [[m["t_s"], m["rule"], m["mode"], m["to"]] for m in report["moves"]],
            "errors": sum(sum(m["errors"].values()) for m in report["models"].values()),
            "cpu_s": round(time.process_time() - started, 2),  # real seconds of this process, not simulated
            "replay_looks": len(looks),
            "replay_cpu_s_per_look": {"mean": round(sum(looks) / len(looks), 4), "max": round(max(looks), 4)}
            if looks
            else None,
        }
    best = min(SIMPLE, key=lambda s: row[s]["p99_ms"])
    row["best_simple"] = best
    row["joint_over_best_simple_p99"] = round(row["joint"]["p99_ms"] / row[best]["p99_ms"], 4)
    row["every_over_joint_p99"] = round(row["every"]["p99_ms"] / row["joint"]["p99_ms"], 4)
    return row


def verdict(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The issue's Done-when over the rows: every row, and the heavy rows' share beating `every` by 1.2×."""
    over = [r for r in rows if r["joint_over_best_simple_p99"] > 1.05]
    flapping = [r for r in rows if r["joint"]["moves_in_steady_phases"] > 0]
    heavy = [r for r in rows if r["shape"] == "shift-heavy"]
    beating = [r for r in heavy if r["every_over_joint_p99"] >= 1.2]

    def name(r: dict[str, Any]) -> str:
        return f"{r['cores']} {'+'.join(r['models'])} {r['shape']}" + (" (held out)" if r["held_out"] else "")

    return {
        "rows": len(rows),
        "joint_within_1_05_of_best_simple": len(rows) - len(over),
        "over_1_05": [f"{name(r)}: {r['joint_over_best_simple_p99']}" for r in over],
        "worst_joint_over_best_simple": max((r["joint_over_best_simple_p99"] for r in rows), default=None),
        "rows_with_steady_moves": [f"{name(r)}: {r['joint']['moves_in_steady_phases']}" for r in flapping],
        "heavy_rows": len(heavy),
        "heavy_rows_1_2x_under_every": len(beating),
        "holds": not over and not flapping and 2 * len(beating) >= len(heavy),
    }


def run_family(
    cores: Sequence[int],
    shapes: Sequence[str],
    seed: int,
    workers: int,
    held: str,
    replay: ReplaySettings | None = None,
) -> dict[str, Any]:
    cases = [
        (c, tuple(group), shape, seed, replay)
        for c in cores
        for group in GROUPS[c]
        for shape in shapes
        if held == "all" or (held == "tuning") != held_out(group)
    ]
    started = time.perf_counter()
    if workers > 1:
        with multiprocessing.get_context("fork").Pool(workers) as pool:
            rows = pool.map(run_group, cases, chunksize=1)
    else:
        rows = [run_group(case) for case in cases]
    tuning = [r for r in rows if not r["held_out"]]
    held_rows = [r for r in rows if r["held_out"]]
    return {
        "simulated": True,
        "family": describe(),
        "coordinator": settings_for("joint", replay).to_json(),
        "seed": seed,
        "wall_s": round(time.perf_counter() - started, 1),
        "verdict": {"all": verdict(rows), "tuning": verdict(tuning), "held_out": verdict(held_rows)},
        "replay_cost": replay_cost(rows),
        "rows": rows,
    }


def replay_cost(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The joint strategy's replays, in CPU seconds per look that replayed: the mean over the rows' means, the
    worst look of any row, and how many looks replayed."""
    costs = [r["joint"]["replay_cpu_s_per_look"] for r in rows if r["joint"].get("replay_cpu_s_per_look")]
    return {
        "looks": sum(r["joint"].get("replay_looks", 0) for r in rows),
        "mean_s": round(sum(c["mean"] for c in costs) / len(costs), 4) if costs else None,
        "max_s": max((c["max"] for c in costs), default=None),
    }


def render(data: dict[str, Any]) -> str:
    """The docs' table: one line per row, held-out rows marked."""
    lines = [
        "| cores | models | traffic | joint p99 | every | even | proportional | joint ÷ best simple "
        "| every ÷ joint | joint moves (steady) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in data["rows"]:
        mark = " *(held out)*" if r["held_out"] else ""
        cells = " | ".join(f"{r[s]['p99_ms']:.0f}" for s in STRATEGIES)
        lines.append(
            f"| {r['cores']} | {' + '.join(r['models'])}{mark} | {r['shape']} | {cells} "
            f"| {r['joint_over_best_simple_p99']:.2f} | {r['every_over_joint_p99']:.2f} "
            f"| {r['joint']['moves']} ({r['joint']['moves_in_steady_phases']}) |"
        )
    return "\n".join(lines)
