"""The stand-ins checked against the real thing on this machine: the real daemon, the emulated daemon and
the simulation, side by side on the same profile and the same traffic.

    .venv/bin/python bench/stand_ins.py [--rate R] [--duration 45] [--rounds 2] [--seed 3]

1. A real daemon (built-in ResNet-50, fp32, packrat policy, every usable core) measures its profile at
   start-up and saves it (--save-profile); the split check is off, so all three start from the policy's plan.
2. An emulated daemon (`--runtime emulated --emulate-interference none`) waits that profile's latencies on
   as many emulated cores; a third, emulated on the profile scaled by 1e-6, measures what the daemon and
   the transport cost on this traffic when the compute costs nothing.
3. `packrat simulate`'s engine on the same profile, settings, traffic and seed, with that measured
   transport cost added per request (the scaled table's own simulated latency, the batching wait,
   taken off first).
The three daemons are loaded in turn, round by round, with `packrat load` (Poisson, a mix of sizes).
The errors are the emulation's and the simulation's p50 and p99 against the real daemon's (the mean over
rounds), and the simulation's against the emulation's. Prints JSON; progress on stderr.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from harness import DaemonProcess  # noqa: E402

from packrat_daemon.config import ServeConfig  # noqa: E402
from packrat_daemon.load.arrivals import BatchMix, Poisson  # noqa: E402
from packrat_daemon.measure.emulation import Interference  # noqa: E402
from packrat_daemon.simulate import DaemonCosts, Simulation, Traffic  # noqa: E402
from policies.planning.profile import Cell, Profile  # noqa: E402
from policies.planning.topology import Topology  # noqa: E402

MODEL = "builtin:resnet50"
MIX = "1:0.5,4:0.5"
SETTINGS = {"policy": "packrat", "max_batch": 4, "batches": [1, 4], "max_delay_ms": 1.0}
LOAD = 0.3  # offered inputs per second over what one all-core instance computes at max_batch, as measured
TRANSPORT_SCALE = 1e-6


def serve_args() -> list[str]:
    return [
        "--model", MODEL, "--precision", "fp32", "--policy", SETTINGS["policy"],
        "--max-batch", str(SETTINGS["max_batch"]), "--batches", ",".join(map(str, SETTINGS["batches"])),
        "--max-delay-ms", str(SETTINGS["max_delay_ms"]), "--split-check-rounds", "0", "--log-level", "info",
    ]  # fmt: skip


def emulated_args(profile: Path, cores: int) -> list[str]:
    return ["--runtime", "emulated", "--profile", str(profile), "--emulate-cores", str(cores),
            "--emulate-interference", "none"]  # fmt: skip


def load(endpoint: str, args: argparse.Namespace, mix: str = MIX) -> dict[str, Any]:
    command = [
        sys.executable, "-m", "packrat_daemon", "load", "--endpoint", endpoint, "--rate", str(args.rate),
        "--batches", mix, "--duration", str(args.duration), "--seed", str(args.seed), "--quiet", "--json",
    ]  # fmt: skip
    return json.loads(subprocess.run(command, cwd=REPO, check=True, capture_output=True, text=True).stdout)


def simulate(profile: Profile, cores: int, args: argparse.Namespace, transport_ms: float) -> dict[str, Any]:
    traffic = Traffic(BatchMix.parse(MIX), process=Poisson(args.rate), duration_s=args.duration, seed=args.seed)
    costs = DaemonCosts(transport_ms=(transport_ms, 0.0))
    simulation = Simulation(ServeConfig(**SETTINGS), profile, cores, Interference.named("none"), costs)
    return simulation.run(traffic).to_json()


def scaled(profile: Profile, factor: float) -> Profile:
    cells = {key: Cell(cell.latency_ms * factor, cell.samples) for key, cell in profile.items()}
    return Profile(cells, model=profile.model, runtime=profile.runtime)


def error(estimate: float, truth: float) -> float:
    return round(estimate / truth - 1.0, 4)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rate", type=float, help=f"Poisson requests per second (default: {LOAD:.0%} of capacity)")
    parser.add_argument("--duration", type=float, default=45.0, help="seconds of traffic per daemon and round")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seed", type=int, default=3)
    args = parser.parse_args()
    cores = Topology.detect().usable_cores
    with tempfile.TemporaryDirectory(prefix="packrat-stand-ins-") as folder:
        work = Path(folder)
        profile_path = work / "resnet50.csv"
        print("starting the real daemon (it measures its profile first) ...", file=sys.stderr)
        real = DaemonProcess("real", work, [*serve_args(), "--save-profile", str(profile_path)])
        real.wait()
        (profile,) = Profile.read_all(profile_path).values()  # the one runtime and precision served
        if args.rate is None:
            alone_ms = profile.lhat(cores, SETTINGS["max_batch"])
            assert alone_ms is not None
            args.rate = round(LOAD * SETTINGS["max_batch"] / (alone_ms / 1000.0) / BatchMix.parse(MIX).mean, 3)
        emulated_path, tiny_path = work / "emulated.csv", work / "tiny.csv"
        Profile(dict(profile.items())).write_csv(emulated_path)
        scaled(profile, TRANSPORT_SCALE).write_csv(tiny_path)
        daemons = {"real": real}
        try:
            daemons["emulated"] = DaemonProcess("emulated", work, [*serve_args(), *emulated_args(emulated_path, cores)])
            daemons["transport"] = DaemonProcess("transport", work, [*serve_args(), *emulated_args(tiny_path, cores)])
            for daemon in daemons.values():
                daemon.wait()
            runs: dict[str, list[dict[str, Any]]] = {name: [] for name in daemons}
            for round_index in range(args.rounds):
                for name, daemon in daemons.items():
                    runs[name].append(load(daemon.endpoint, args))
                    p50 = runs[name][-1]["latency_ms"]["p50"]
                    print(f"round {round_index + 1}: {name} p50 {p50} ms", file=sys.stderr)
            plans = {name: daemon.plan_log() for name, daemon in daemons.items()}
        finally:
            for daemon in daemons.values():
                daemon.close()
    mean = {
        name: {q: statistics.mean(r["latency_ms"][q] for r in reports) for q in ("p50", "p99")}
        for name, reports in runs.items()
    }
    # What the daemon and the transport add, past the batching wait the simulation has itself.
    batching = simulate(scaled(profile, TRANSPORT_SCALE), cores, args, 0.0)["latency_ms"]["p50"]
    transport_ms = max(0.0, mean["transport"]["p50"] - batching)
    simulated = simulate(profile, cores, args, transport_ms)
    sim = {q: simulated["latency_ms"][q] for q in ("p50", "p99")}
    print(json.dumps({
        "model": MODEL, "cores": cores, "settings": SETTINGS, "traffic": f"poisson {args.rate}/s, batch {MIX}",
        "duration_s": args.duration, "rounds": args.rounds, "seed": args.seed,
        "profile": {f"{t},{b}": round(cell.latency_ms, 3) for (t, b), cell in profile.items()},
        "transport_ms": round(transport_ms, 3),
        "p50_ms": {**{k: round(v["p50"], 3) for k, v in mean.items()}, "simulated": sim["p50"]},
        "p99_ms": {**{k: round(v["p99"], 3) for k, v in mean.items()}, "simulated": sim["p99"]},
        "errors": {
            "emulated_vs_real": {q: error(mean["emulated"][q], mean["real"][q]) for q in ("p50", "p99")},
            "simulated_vs_real": {q: error(sim[q], mean["real"][q]) for q in ("p50", "p99")},
            "simulated_vs_emulated": {q: error(sim[q], mean["emulated"][q]) for q in ("p50", "p99")},
        },
        "plan_changes": {"simulated": simulated["plan_changes"], **plans},
        "runs": runs,
    }, indent=1))  # fmt: skip


if __name__ == "__main__":
    main()
