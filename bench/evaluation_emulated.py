"""docs/evaluation.md's table (b) through the emulated daemon: T = 16 under shifting and bursty traffic.

    .venv/bin/python bench/evaluation_emulated.py [--tables inception3] [--phase-s 40] [--burst-s 60]

EMULATION: each run is `packrat serve --runtime emulated --emulate-cores 16` (default interference,
`--max-batch 32 --batches 32`, the split check off) under `packrat load --warmup 0`, one daemon per policy
(adaptive packrat, its start-up plan kept with --no-adapt, single, torchserve, the paper's estimator):
- shifting: bench/simulate.py's phases (single inputs, batches of 8, an even mix of 1 and 16 inputs, each
  at 40% of what one 16-thread instance computes at batch 32), `--phase-s` each, once through, sent as a
  `--trace` file;
- bursty: bench/simulate.py's bursts (2 s on, 8 s off, requests of 1 or 8 inputs at that instance's full
  capacity during a burst) for `--burst-s`.
These runs are shorter than the simulated table's 600 s (real time here), so each row also has the
simulation of the very same traffic, seed and daemon uptime (bench/sim_vs_emulated.py's way, without the
daemon's own costs) beside it. Reconfigurations: the daemon's log lines of the tuner's re-plans and the
production guard's reverts. Prints JSON; progress on stderr.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import simulate as tables  # noqa: E402  (bench/simulate.py: the traffic and the settings of table (b))
from harness import DaemonProcess  # noqa: E402
from sim_vs_emulated import load, served_since  # noqa: E402

from packrat_daemon.config import ServeConfig  # noqa: E402
from packrat_daemon.load.arrivals import BatchMix, Burst, Trace  # noqa: E402
from packrat_daemon.measure.emulation import Interference  # noqa: E402
from packrat_daemon.simulate import Simulation, Traffic  # noqa: E402
from policies.planning.profile import Profile  # noqa: E402

MODEL = "builtin:resnet50"  # its input stands in for the tables' models (as in bench/emulated.py)
CORES = 16
# A reconfiguration in the daemon's log: the tuner's re-plan, or the production guard's revert (a warning).
RECONFIGURED = ("packrat.daemon: adapting to the live batch sizes", "production timings reverted the plan")


def serve_flags(settings: dict[str, Any]) -> list[str]:
    flags = ["--policy", settings["policy"]]
    return [*flags, "--no-adapt"] if settings.get("adapt") is False else flags


def write_trace(trace: Trace, path: Path) -> Path:
    path.write_text("t_s,samples\n" + "".join(f"{t!r},{samples}\n" for t, samples in trace.rows))
    return path


def simulated(table: Profile, settings: dict[str, Any], traffic: Traffic, uptime_s: float) -> dict[str, Any]:
    config = ServeConfig(max_batch=tables.B_MAX_BATCH, batches=[tables.B_MAX_BATCH], **settings)
    simulation = Simulation(config, table, CORES, Interference.named(tables.INTERFERENCE))
    return simulation.run(dataclasses.replace(traffic, uptime_s=uptime_s)).to_json()


def figures(report: dict[str, Any], reconfigurations: int) -> dict[str, Any]:
    return {
        "p50_ms": report["latency_ms"]["p50"], "p99_ms": report["latency_ms"]["p99"],
        "throughput_rps": report["throughput_rps"], "sent": report["sent"], "ok": report["ok"],
        "errors": report["errors"], "reconfigurations": reconfigurations,
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tables", default="inception3")
    parser.add_argument("--phase-s", type=float, default=40.0, help="seconds of each of the three shifting phases")
    parser.add_argument("--burst-s", type=float, default=60.0, help="seconds of bursty traffic")
    parser.add_argument("--seed", type=int, default=13)
    parser.add_argument("--policies", default=",".join(tables.B_POLICIES))
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="packrat-evaluation-emulated-") as folder:
        work = Path(folder)
        for name in args.tables.split(","):
            path = REPO / tables.TABLES[name]
            table = Profile.read_csv(path)
            capacity = tables.capacity_inputs_per_s(table, CORES, tables.B_MAX_BATCH)
            shifting_s = args.phase_s * len(tables.SHIFT_PHASES)
            trace = tables.shifting_trace(capacity, shifting_s, args.seed, args.phase_s)
            burst_mix = BatchMix.parse(tables.BURST_MIX)
            burst = Burst(*tables.BURST, tables.BURST_LOAD * capacity / burst_mix.mean)
            traffics = {
                "shifting": (
                    Traffic(BatchMix.single(1), process=trace),
                    ["--trace", str(write_trace(trace, work / f"{name}-shifting.csv"))],
                ),
                "bursty": (
                    Traffic(burst_mix, process=burst, duration_s=args.burst_s, seed=args.seed),
                    ["--burst", f"{burst.on_s:g}:{burst.off_s:g}:{burst.rate_rps!r}", "--batches",
                     tables.BURST_MIX, "--duration", str(args.burst_s), "--seed", str(args.seed)],
                ),
            }  # fmt: skip
            for pattern, (traffic, load_args) in traffics.items():
                for label in args.policies.split(","):
                    settings = tables.B_POLICIES[label]
                    flags = [
                        "--model", MODEL, *serve_flags(settings), "--max-batch", str(tables.B_MAX_BATCH),
                        "--batches", str(tables.B_MAX_BATCH), "--split-check-rounds", "0", "--runtime", "emulated",
                        "--emulate-cores", str(CORES), "--emulate-interference", tables.INTERFERENCE,
                        "--profile", str(path), "--log-level", "info",
                    ]  # fmt: skip
                    daemon = DaemonProcess(f"{name}-{pattern}-{label}", work, flags)
                    try:
                        daemon.wait()
                        report = load(daemon.endpoint, *load_args, "--timeout", "60")
                        plan_log = daemon.plan_log()
                    finally:
                        daemon.close()
                    log = daemon.log_path.read_text(errors="replace")
                    uptime_s = report["started_unix_s"] - served_since(log)
                    simulation = simulated(table, settings, traffic, uptime_s)
                    row = {
                        "table": name, "traffic": pattern, "described": traffic.describe(), "policy": label,
                        "uptime_s": round(uptime_s, 3),
                        "emulated": figures(report, sum(log.count(marker) for marker in RECONFIGURED)),
                        "simulated": figures(simulation, len(simulation["plan_changes"]) - 1),
                        "emulated_plan_log": plan_log, "simulated_plan_changes": simulation["plan_changes"],
                    }  # fmt: skip
                    rows.append(row)
                    print(f"(b) {name} {pattern} {label}: emulated p50 {row['emulated']['p50_ms']}, simulated "
                          f"{row['simulated']['p50_ms']}", file=sys.stderr)  # fmt: skip
    print(json.dumps({
        "emulated": True, "note": "EMULATION: workers compute nothing (docs/emulation.md); simulated: the same traffic",
        "cores": CORES, "interference": tables.INTERFERENCE, "max_batch": tables.B_MAX_BATCH,
        "phase_s": args.phase_s, "burst_s": args.burst_s, "seed": args.seed, "rows": rows,
    }, indent=1))  # fmt: skip


if __name__ == "__main__":
    main()
