"""What one look of online adaptation costs the daemon's loop at 64 and 128 cores: this tree's planning code
against an earlier revision's, side by side.

    .venv/bin/python bench/adapt_look.py [--baseline REV] [--rounds 2] [--duration 60] [--cores 64,128]

Each case is the packrat row of docs/evaluation.md's table (c) (bench/simulate.py: the analytic table of
the 16-core table's physics fit read at T cores, Poisson at half of one T-thread instance's capacity, its
mix of request sizes), run by `packrat simulate`'s engine, which records the wall time of every look
(`Simulation.adapt_wall_s`: the estimator's distribution, the tuner's plan and the production checks, as
the daemon's loop runs them). The baseline runs with the `policies` package of REV (taken out with
`git archive` into a temporary folder, first on the child's path); the other with this tree's; the two
take turns, round by round, in child processes, and each run's simulated result must be the same (the
speed-up may not change a plan). Prints JSON; progress on stderr.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import io
import json
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
BASELINE = "358c1f6~1"  # the revision before split_batch's sparse tie-break and the undominated knapsacks


def measure(table_name: str, cores: int, duration: float, seed: int) -> dict[str, Any]:
    """In the child: one simulation, its looks' wall times and a digest of its result."""
    sys.path.insert(1, str(REPO))
    sys.path.insert(1, str(REPO / "bench"))
    import simulate as tables

    from packrat_daemon.config import ServeConfig
    from packrat_daemon.load.arrivals import BatchMix, Poisson
    from packrat_daemon.measure.emulation import Interference
    from packrat_daemon.simulate import Simulation, Traffic
    from policies.planning.profile import Profile

    measured = Profile.read_csv(REPO / tables.TABLES[table_name])
    table, _ = tables.analytic_table(measured, cores)
    mix = BatchMix.parse(tables.MIX)
    rate = tables.LOAD * tables.capacity_inputs_per_s(table, cores, tables.MAX_BATCH) / mix.mean
    config = ServeConfig(policy="packrat", max_batch=tables.MAX_BATCH, batches=[tables.MAX_BATCH])
    simulation = Simulation(config, table, cores, Interference.named(tables.INTERFERENCE))
    started = time.perf_counter()
    report = simulation.run(Traffic(mix, process=Poisson(rate), duration_s=duration, seed=seed)).to_json()
    return {
        "wall_s": round(time.perf_counter() - started, 3),
        "looks_ms": [round(1000 * look, 2) for look in simulation.adapt_wall_s],
        "result_sha256": hashlib.sha256(json.dumps(report, sort_keys=True).encode()).hexdigest(),
        "p50_ms": report["latency_ms"]["p50"],
        "plan_changes": [change["plan"] for change in report["plan_changes"]],
        "policies_from": str(Path(sys.modules["policies"].__file__ or "").parent),
    }


def child(policies_root: Path | None, table: str, cores: int, args: argparse.Namespace) -> dict[str, Any]:
    command = [sys.executable, str(Path(__file__).resolve()), "--measure", f"{table}:{cores}",
               "--duration", str(args.duration), "--seed", str(args.seed)]  # fmt: skip
    if policies_root is not None:
        command += ["--policies-root", str(policies_root)]
    done = subprocess.run(command, cwd=REPO, check=True, capture_output=True, text=True)
    return json.loads(done.stdout)


def extract_policies(revision: str, folder: Path) -> str:
    """`policies/` of `revision` into `folder`; the full commit id."""
    commit = subprocess.run(["git", "rev-parse", revision], cwd=REPO, check=True, capture_output=True, text=True)
    archive = subprocess.run(["git", "archive", revision, "policies"], cwd=REPO, check=True, capture_output=True)
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(folder, filter="data")
    return commit.stdout.strip()


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    looks = [ms for run in runs for ms in run["looks_ms"]]
    return {
        "looks": len(looks),
        "mean_ms": round(statistics.mean(looks), 1),
        "median_ms": round(statistics.median(looks), 1),
        "max_ms": round(max(looks), 1),
        "p50_ms": runs[0]["p50_ms"],
        "plan_changes": runs[0]["plan_changes"],
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--baseline", default=BASELINE, help="the revision whose policies package to compare with")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--duration", type=float, default=60.0, help="virtual seconds of traffic per run")
    parser.add_argument("--seed", type=int, default=13)
    parser.add_argument("--cores", default="64,128")
    parser.add_argument("--tables", default="inception3,bert")
    parser.add_argument("--measure", help=argparse.SUPPRESS)  # TABLE:CORES, in a child
    parser.add_argument("--policies-root", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        if args.policies_root:
            sys.path.insert(0, args.policies_root)
        # Before anything puts the repository first on the path (bench/simulate.py does): its submodules then
        # all come from the package imported here.
        importlib.import_module("policies")
        table, cores = args.measure.split(":")
        print(json.dumps(measure(table, int(cores), args.duration, args.seed)))
        return
    rows = []
    with tempfile.TemporaryDirectory(prefix="packrat-adapt-look-") as folder:
        commit = extract_policies(args.baseline, Path(folder))
        for table in args.tables.split(","):
            for cores in (int(c) for c in args.cores.split(",")):
                runs: dict[str, list[dict[str, Any]]] = {"baseline": [], "this_tree": []}
                ratios = []
                for round_ in range(args.rounds):
                    order = [("baseline", Path(folder)), ("this_tree", None)]
                    for label, root in order if round_ % 2 == 0 else order[::-1]:
                        runs[label].append(child(root, table, cores, args))
                    before, after = runs["baseline"][-1], runs["this_tree"][-1]
                    ratios.append(statistics.mean(before["looks_ms"]) / statistics.mean(after["looks_ms"]))
                digests = {run["result_sha256"] for label in runs for run in runs[label]}
                assert all(run["policies_from"].startswith(folder) for run in runs["baseline"]), "baseline not loaded"
                row = {
                    "table": table, "cores": cores, "baseline": summary(runs["baseline"]),
                    "this_tree": summary(runs["this_tree"]), "speed_up_per_round": [round(r, 2) for r in ratios],
                    "same_result": len(digests) == 1,
                }  # fmt: skip
                rows.append(row)
                means = f"{row['baseline']['mean_ms']} → {row['this_tree']['mean_ms']} ms"
                note = f"×{statistics.median(ratios):.1f}, same result: {row['same_result']}"
                print(f"{table} T={cores}: mean look {means}, {note}", file=sys.stderr)
    print(json.dumps({
        "baseline": args.baseline, "baseline_commit": commit, "duration_s": args.duration, "seed": args.seed,
        "rounds": args.rounds, "rows": rows,
    }, indent=1))  # fmt: skip


if __name__ == "__main__":
    main()
