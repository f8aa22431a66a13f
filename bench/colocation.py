"""Several models on one machine, by simulation: the joint plan against the splits users make today.

    .venv/bin/python bench/colocation.py --out bench/results/colocation.json     # 16, 32 and 64 cores
    .venv/bin/python bench/colocation.py --quick                                 # the smallest case, short

Every number is a simulation (packrat_daemon/simulate/colocated.py): each model's daemon (its own loop
core, batcher, splitter and plan) on one virtual clock, their slices sharing one machine's cores by the
emulated workers' rules, where the slow-down comes from the busy threads of all models together.

Strategies, on the same traffic (same seed) side by side:
- `every`: each model plans for all the cores (two independent daemons, or Triton/OVMS/TorchServe at
  their defaults): the case (a) of issue 26;
- `even`: a static even split (b); `proportional`: cores in proportion to each model's offered work,
  re-split as it moves (c); `joint`: policies.colocation.plan_jointly, re-planned as the traffic moves.
All four re-pick a model's plan inside an unchanged share for its live batch sizes, and the moving ones
move cores only through packrat_daemon.coordinate.watch, `packrat coordinate`'s own rule (a backlogged queue
moves at once to the split for the last second's rates; else policies.colocation.should_move's predicted
gain, change detector and cool-down), so moves are counted the same way.

Machines and models:
- 16 cores: BERT and Inception-v3 on their measured 16-core tables (bench/profiles/);
- 32 and 64 cores: no table was measured there, so analytic ones: the physics model of
  packrat_daemon/search/gp/physics.py fitted to each 16-core table and read at 32 or 64 threads (as
  bench/simulate.py does), and Amdahl tables (policies.testing.amdahl_profile's law) for the third and
  fourth model, on a grid of thread counts.

Traffic (per model, Poisson within each phase; loads are fractions of what the model's own plan on all the
machine's cores carries, its capacity): `shift`: phases of PHASE_S in which one model is busy and the others
light, rotating (A busy/B light, then swapped); `burst`: short bursts at above capacity, the models' bursts
offset, over a light base. Two loads each: light and heavy.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from packrat_daemon.config import ServeConfig  # noqa: E402
from packrat_daemon.load.arrivals import BatchMix  # noqa: E402
from packrat_daemon.measure.emulation import Interference  # noqa: E402
from packrat_daemon.search.gp import physics  # noqa: E402
from packrat_daemon.simulate.colocated import (  # noqa: E402
    STRATEGIES,
    CoordinatorSettings,
    Model,
    Phase,
    phased,
    simulate_colocated,
)
from packrat_daemon.simulate.run import Traffic  # noqa: E402
from policies.colocation import ModelDemand, evaluate  # noqa: E402
from policies.planning.distribution import BatchDistribution  # noqa: E402
from policies.planning.profile import Profile  # noqa: E402

TABLES = {"bert": "bench/profiles/bert-cloudlab16.csv", "inception3": "bench/profiles/inception3-cloudlab16.csv"}
MIXES = {"bert": "1", "inception3": "1:0.5,4:0.5", "amdahl-a": "1:0.5,2:0.5", "amdahl-b": "1"}
AMDAHL = {"amdahl-a": (1.0, 60.0), "amdahl-b": (4.0, 120.0)}  # serial, parallel ms per input (overhead 2 ms)
MODELS = {16: ["bert", "inception3"], 32: ["bert", "inception3", "amdahl-a"],
          64: ["bert", "inception3", "amdahl-a", "amdahl-b"]}  # fmt: skip
THREAD_GRID = (1, 2, 3, 4, 6, 8, 12, 16, 20, 24, 32, 40, 48, 56, 64)
BATCHES = (1, 2, 4, 8, 16, 32)
MAX_BATCH = 32
INTERFERENCE = "default"
PHASE_S = 30.0
SETTLE_S = 10.0  # a move this soon after a phase change is the coordinator following it; later, flapping
LOADS = {"light": (0.3, 0.1), "heavy": (0.8, 0.5)}  # (busy model, light models) as fractions of capacity
BURST = (2.0, 3.0)  # seconds on, off
BURST_LOADS = {"light": (0.6, 0.1), "heavy": (1.2, 0.3)}  # (during a burst, between bursts)


def analytic(name: str, cores: int) -> Profile:
    threads = [t for t in THREAD_GRID if t <= cores]
    if name in AMDAHL:
        serial, parallel = AMDAHL[name]
        table = {(t, b): 2.0 + b * (serial + parallel / t) for t in threads for b in BATCHES}
        return Profile.from_latencies(table, model=name)
    measured = Profile.read_csv(ROOT / TABLES[name])
    cells = list(measured)
    theta = physics.fit(cells, np.array([measured.latency(*cell) for cell in cells]))
    grid = [(t, b) for t in threads for b in BATCHES]
    return Profile.from_latencies(
        dict(zip(grid, (float(x) for x in physics.predict(theta, grid)), strict=True)), model=name
    )


def profile_of(name: str, cores: int) -> Profile:
    return Profile.read_csv(ROOT / TABLES[name]) if cores == 16 else analytic(name, cores)


def capacity_rps(name: str, profile: Profile, cores: int) -> float:
    """Requests per second the model's own plan on all `cores` carries, one request per batch."""
    mix = BatchMix.parse(MIXES[name])
    distribution = BatchDistribution.from_counts(dict(zip(mix.sizes, mix.weights, strict=True)))
    share = evaluate([ModelDemand(name, profile, distribution, 1.0)], [cores]).shares[0]
    return 1000.0 / share.service_ms


def phases_of(kind: str, load: str, index: int, models: int, capacity: float) -> list[Phase]:
    if kind == "shift":
        busy, light = LOADS[load]
        order = [busy if k == index else light for k in range(models)]  # model `index` busy in phase `index`
        return [Phase(PHASE_S, share * capacity) for share in order]
    on, off = BURST
    peak, base = BURST_LOADS[load]
    cycle = on + off
    lead = cycle * index / models  # the models' bursts offset evenly over the cycle
    pieces = [Phase(lead, base * capacity)] if lead > 0 else []
    pieces.append(Phase(on, peak * capacity))
    rest = cycle - lead - on
    if rest > 0:
        pieces.append(Phase(rest, base * capacity))
    return pieces


def scenario(cores: int, kind: str, load: str, duration_s: float, seed: int) -> tuple[list[Model], list[float]]:
    """The models with their traffic, and the times at which the traffic changes phase (shift only)."""
    names = MODELS[cores]
    models = []
    for index, name in enumerate(names):
        profile = profile_of(name, cores)
        mix = BatchMix.parse(MIXES[name])
        phases = phases_of(kind, load, index, len(names), capacity_rps(name, profile, cores))
        trace = phased(phases, mix, duration_s, random.Random(seed * 1000 + index))
        config = ServeConfig(max_batch=MAX_BATCH, adapt=False, batches=list(mix.sizes), max_delay_ms=0.0)
        models.append(Model(name, config, profile, Traffic(mix, process=trace)))
    # The start counts as a change: every strategy that moves starts from the even split.
    changes = [k * PHASE_S for k in range(int(duration_s // PHASE_S) + 1)] if kind == "shift" else []
    return models, changes


def run_case(cores: int, kind: str, load: str, duration_s: float, seed: int) -> dict[str, Any]:
    models, changes = scenario(cores, kind, load, duration_s, seed)
    row: dict[str, Any] = {"cores": cores, "traffic": kind, "load": load, "models": [m.name for m in models]}
    results = {}
    for strategy in STRATEGIES:
        started = time.perf_counter()
        settings = CoordinatorSettings(strategy=strategy)
        result = simulate_colocated(models, cores, settings, Interference.named(INTERFERENCE))
        report = result.to_json()
        report["wall_s"] = round(time.perf_counter() - started, 2)  # real seconds, not part of the simulation
        report["moves_by_rule"] = {
            rule: sum(1 for move in report["moves"] if move["rule"] == rule) for rule in ("backlog", "gain")
        }
        if kind == "shift":
            report["steady"] = result.steady(changes, SETTLE_S)
            report["moves_in_steady_phases"] = sum(
                1 for move in report["moves"] if not any(0 <= move["t_s"] - t < SETTLE_S for t in changes)
            )
        results[strategy] = report
    row["strategies"] = results
    joint = results["joint"]["overall"]
    if kind == "shift":
        steady = results["joint"]["steady"]["overall"]["p99_ms"]
        row["steady_p99_over_joint"] = {
            name: _ratio(results[name]["steady"]["overall"]["p99_ms"], steady) for name in STRATEGIES if name != "joint"
        }
    row["ratios"] = {
        f"{name}_p99_over_joint": _ratio(results[name]["overall"]["p99_ms"], joint["p99_ms"])
        for name in STRATEGIES
        if name != "joint"
    } | {
        f"{name}_p50_over_joint": _ratio(results[name]["overall"]["p50_ms"], joint["p50_ms"])
        for name in STRATEGIES
        if name != "joint"
    }
    return row


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 4) if a is not None and b else None


def render(paths: list[str]) -> str:
    """The docs' tables from saved runs: per case, each strategy's overall and per-model p50/p99, and moves."""
    lines = []
    for path in paths:
        data = json.loads(Path(path).read_text())
        for row in data["rows"]:
            names = row["models"]
            lines.append(f"\n{row['cores']} cores, {row['traffic']}, {row['load']} ({', '.join(names)}):\n")
            head = " | ".join(f"{n} p50 / p99" for n in names)
            lines.append(f"| strategy | overall p50 / p99 ms | {head} | steady p99 | busy | moves (steady) |")
            lines.append("|---" * (5 + len(names)) + "|")
            for name, report in row["strategies"].items():
                models = report["models"]
                cells = " | ".join(f"{_ms(models[n]['p50_ms'])} / {_ms(models[n]['p99_ms'])}" for n in names)
                busy = " / ".join(f"{models[n]['busy_fraction']:.2f}" for n in names)
                steady = report.get("moves_in_steady_phases")
                moves = f"{report['moves_made']}" + ("" if steady is None else f" ({steady})")
                overall = report["overall"]
                steady_p99 = _ms(report["steady"]["overall"]["p99_ms"]) if "steady" in report else "-"
                lines.append(
                    f"| {name} | {_ms(overall['p50_ms'])} / {_ms(overall['p99_ms'])} | {cells} | {steady_p99} | {busy} "
                    f"| {moves} |"
                )
    return "\n".join(lines)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}" if value >= 100 else f"{value:.1f}"


def family(args: argparse.Namespace) -> None:
    """`--family`: every group of bench/colocation_family.py under every shape; JSON out, by default to
    bench/results/colocation-family.json."""
    import colocation_family  # bench/ is on the path when this file runs as a script

    if args.render_family:
        print(colocation_family.render(json.loads(Path(args.render_family).read_text())))
        return
    cores = [int(c) for c in args.cores.split(",")]
    replay = colocation_family.REPLAY if args.replay else None
    data = colocation_family.run_family(cores, args.shapes.split(","), args.seed, args.workers, args.held, replay)
    data["command"] = " ".join(["bench/colocation.py", *sys.argv[1:]])
    text = json.dumps(data, indent=1)
    print(text)
    Path(args.out or ROOT / "bench" / "results" / "colocation-family.json").write_text(text + "\n")
    print(json.dumps(data["verdict"], indent=1), file=sys.stderr)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cores", default="16,32,64")
    parser.add_argument("--traffic", default="shift,burst")
    parser.add_argument("--loads", default="light,heavy")
    parser.add_argument("--duration", type=float, default=120.0, help="seconds of traffic per case (16 cores)")
    parser.add_argument("--large-duration", type=float, default=90.0, help="seconds per case at 32 and 64 cores")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="16 cores, shifting heavy traffic, 30 s")
    parser.add_argument("--out", help="also write the JSON here")
    parser.add_argument("--render", nargs="+", metavar="FILE.json", help="print the docs' tables of saved runs")
    parser.add_argument("--family", action="store_true", help="the family of tables (bench/colocation_family.py)")
    parser.add_argument("--shapes", default="shift-heavy,shift-light,burst", help="--family: the traffic shapes")
    parser.add_argument("--held", choices=("all", "tuning", "held-out"), default="all", help="--family: which groups")
    parser.add_argument("--render-family", metavar="FILE.json", help="--family: print the docs' table of a run")
    parser.add_argument("--replay", action="store_true", help="--family: the joint strategy scores by a replay")
    parser.add_argument("--workers", type=int, default=2, help="--family: processes running groups side by side")
    args = parser.parse_args()
    if args.render:
        print(render(args.render))
        return
    if args.family:
        family(args)
        return
    if args.quick:
        args.cores, args.traffic, args.loads, args.duration = "16", "shift", "heavy", 30.0
    rows = []
    for cores in (int(c) for c in args.cores.split(",")):
        duration = args.duration if cores == 16 else args.large_duration
        for kind in args.traffic.split(","):
            for load in args.loads.split(","):
                rows.append(run_case(cores, kind, load, duration, args.seed))
                print(f"{cores} cores {kind} {load}: {rows[-1]['ratios']}", file=sys.stderr)
    out = {
        "simulated": True,
        "command": " ".join(["bench/colocation.py", *sys.argv[1:]]),
        "interference": INTERFERENCE,
        "phase_s": PHASE_S,
        "settle_s": SETTLE_S,
        "loads": LOADS,
        "burst": {"on_off_s": BURST, "loads": BURST_LOADS},
        "coordinator": CoordinatorSettings().to_json(),
        "rows": rows,
    }
    text = json.dumps(out, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
