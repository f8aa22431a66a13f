"""`packrat simulate` against `packrat serve --runtime emulated` at 16 cores, on the same inputs.

    .venv/bin/python bench/sim_vs_emulated.py [--duration 60] [--seed 3]

For each shipped 16-core table (bench/profiles/) and policy (packrat, single): an emulated daemon with 16
emulated cores and the default interference under `packrat load` (Poisson at half of what one 16-thread
instance computes at max_batch, a mix of request sizes), and the simulation with the same profile,
settings, traffic and seed, in two variants of what the daemon itself costs, both measured on an emulated
daemon with the table scaled by 1e-6 (compute that costs nothing):
- per request: that daemon's p50 under the same traffic, less the batching wait the simulation has itself,
  added to every request's latency (as bench/stand_ins.py does);
- per batch: its p50 with one client at batch 1 and at batch 16 give a fixed and a per-input cost,
  charged to every batch while it is in flight (so it delays the next batch too).
Both are stand-ins; this checks that they agree, not that either matches a real machine. Prints JSON;
progress on stderr.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from harness import DaemonProcess  # noqa: E402
from stand_ins import TRANSPORT_SCALE, error, load, scaled  # noqa: E402

from packrat_daemon.config import ServeConfig  # noqa: E402
from packrat_daemon.emulation import Interference  # noqa: E402
from packrat_daemon.load.arrivals import BatchMix, Poisson  # noqa: E402
from packrat_daemon.simulate import Simulation, Traffic  # noqa: E402
from policies.planning.profile import Profile  # noqa: E402

MODEL = "builtin:resnet50"  # its input stands in for the tables' models (as in bench/emulated.py)
CORES = 16
MIX = "1:0.4,4:0.3,16:0.3"
MAX_BATCH = 16
LOAD = 0.5
INTERFERENCE = "default"
POLICIES = ("packrat", "single")


def load_mix(endpoint: str, rate: float, args: argparse.Namespace) -> dict[str, Any]:
    return load(endpoint, argparse.Namespace(rate=rate, duration=args.duration, seed=args.seed), mix=MIX)


def simulate(
    table: Profile,
    policy: str,
    rate: float,
    args: argparse.Namespace,
    transport_ms: float,
    overhead: tuple[float, float] = (0.0, 0.0),
) -> dict:
    config = ServeConfig(policy=policy, max_batch=MAX_BATCH, batches=[MAX_BATCH], max_delay_ms=1.0)
    traffic = Traffic(BatchMix.parse(MIX), process=Poisson(rate), duration_s=args.duration, seed=args.seed)
    interference = Interference.named(INTERFERENCE)
    return Simulation(config, table, CORES, interference, transport_ms, overhead).run(traffic).to_json()


def closed_loop_p50(endpoint: str, batch: int) -> float:
    command = [
        sys.executable, "-m", "packrat_daemon", "load", "--endpoint", endpoint, "--batch", str(batch),
        "--concurrency", "1", "--duration", "8", "--quiet", "--json",
    ]  # fmt: skip
    report = json.loads(subprocess.run(command, cwd=REPO, check=True, capture_output=True, text=True).stdout)
    return float(report["latency_ms"]["p50"])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of traffic per run")
    parser.add_argument("--seed", type=int, default=3)
    args = parser.parse_args()
    rows = []
    for name in ("inception3", "bert"):
        path = REPO / "bench" / "profiles" / f"{name}-cloudlab16.csv"
        table = Profile.read_csv(path)
        alone_ms = table.lhat(CORES, MAX_BATCH)
        assert alone_ms is not None
        rate = round(LOAD * MAX_BATCH / (alone_ms / 1000.0) / BatchMix.parse(MIX).mean, 3)
        with tempfile.TemporaryDirectory(prefix="packrat-sim-vs-emulated-") as folder:
            work = Path(folder)
            tiny = work / "tiny.csv"
            scaled(table, TRANSPORT_SCALE).write_csv(tiny)
            for policy in POLICIES:
                common = [
                    "--model", MODEL, "--policy", policy, "--max-batch", str(MAX_BATCH), "--max-delay-ms", "1.0",
                    "--split-check-rounds", "0", "--runtime", "emulated", "--emulate-cores", str(CORES),
                    "--emulate-interference", INTERFERENCE,
                ]  # fmt: skip
                reports = {}
                for label, profile in (("emulated", path), ("transport", tiny)):
                    daemon = DaemonProcess(f"{label}-{policy}", work, [*common, "--profile", str(profile)])
                    try:
                        daemon.wait()
                        reports[label] = load_mix(daemon.endpoint, rate, args)
                        reports[label]["plan_log"] = daemon.plan_log()
                        if label == "transport":
                            one, full = closed_loop_p50(daemon.endpoint, 1), closed_loop_p50(daemon.endpoint, MAX_BATCH)
                    finally:
                        daemon.close()
                batching = simulate(scaled(table, TRANSPORT_SCALE), policy, rate, args, 0.0)["latency_ms"]["p50"]
                transport_ms = max(0.0, reports["transport"]["latency_ms"]["p50"] - batching)
                simulated = simulate(table, policy, rate, args, transport_ms)
                per_input = max(0.0, (full - one) / (MAX_BATCH - 1))
                overhead = (max(0.0, one - per_input), per_input)
                per_batch = simulate(table, policy, rate, args, 0.0, overhead)
                emulated = reports["emulated"]
                row = {
                    "table": name, "policy": policy, "rate_rps": rate, "transport_ms": round(transport_ms, 3),
                    "emulated_ms": {q: emulated["latency_ms"][q] for q in ("p50", "p99")},
                    "simulated_ms": {q: simulated["latency_ms"][q] for q in ("p50", "p99")},
                    "error": {q: error(simulated["latency_ms"][q], emulated["latency_ms"][q]) for q in ("p50", "p99")},
                    "batch_overhead_ms": [round(overhead[0], 3), round(overhead[1], 4)],
                    "simulated_per_batch_ms": {q: per_batch["latency_ms"][q] for q in ("p50", "p99")},
                    "error_per_batch": {
                        q: error(per_batch["latency_ms"][q], emulated["latency_ms"][q]) for q in ("p50", "p99")
                    },
                    "emulated_sent_ok_errors": [emulated["sent"], emulated["ok"], emulated["errors"]],
                    "simulated_sent_ok_errors": [simulated["sent"], simulated["ok"], simulated["errors"]],
                    "emulated_plan_log": emulated["plan_log"], "simulated_plan_changes": simulated["plan_changes"],
                }  # fmt: skip
                rows.append(row)
                print(f"{name} {policy}: error {row['error']}, per batch {row['error_per_batch']}", file=sys.stderr)
    print(json.dumps({
        "traffic": f"poisson at {LOAD:.0%} of one {CORES}-thread instance's capacity at max_batch, batch {MIX}",
        "cores": CORES, "interference": INTERFERENCE, "duration_s": args.duration, "seed": args.seed, "rows": rows,
    }, indent=1))  # fmt: skip


if __name__ == "__main__":
    main()
