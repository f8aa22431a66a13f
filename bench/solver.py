"""Solver speed and quality against the paper's O(T²B²) dynamic program, on the same table.

    .venv/bin/python bench/solver.py [--cores 16] [--batch 1024]

Prints JSON: both solvers' time and latency at T=16, B=1024 (Amdahl-style table with batches
1, 2, 4, ..., 1024, so the DP must apply the same L̂ rule for unprofiled batches), their ratio, and the
wall time of `packrat solve` (CLI start included) on a T=64 table with every batch 1..1024.
The DP is re-implemented here only as a baseline; it is the paper's recurrence, allowing idle cores.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from policies.planning.profile import Profile
from policies.solver import Solver


def amdahl_ms(threads: int, batch: int) -> float:
    # 0.5 ms fixed cost per call, 8 ms per input, 12% serial, plus a mild per-thread overhead.
    return 0.5 + 8.0 * batch * (0.12 + 0.88 / threads) + 0.05 * threads


def paper_dp(profile: Profile, cores: int, batch: int) -> float:
    """min over ⟨t_k, b_k⟩ of max L̂, Σt ≤ T, Σb = B: dp[τ][β] in O(T²B²), pure Python as in the paper."""
    inf = float("inf")
    lhat = {t: [inf] + [profile.lhat(t, b) or inf for b in range(1, batch + 1)] for t in range(1, cores + 1)}
    dp = [[inf] * (batch + 1) for _ in range(cores + 1)]
    for used in range(cores + 1):
        dp[used][0] = 0.0
    for used in range(1, cores + 1):
        row = dp[used]
        below = dp[used - 1]
        for inputs in range(1, batch + 1):
            best = below[inputs]  # leave a core idle
            for t in range(1, used + 1):
                rest = dp[used - t]
                costs = lhat[t]
                for b in range(1, inputs + 1):
                    candidate = costs[b] if costs[b] > rest[inputs - b] else rest[inputs - b]
                    if candidate < best:
                        best = candidate
            row[inputs] = best
    return dp[cores][batch]


def timed(function: Callable[..., Any], *args: Any, repeats: int = 1) -> tuple[Any, float]:
    times, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = function(*args)
        times.append(time.perf_counter() - start)
    return result, statistics.median(times)


def cli_wall_time(cores: int, batch: int, repeats: int) -> tuple[float, dict]:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "t64.csv"
        table = {(t, b): amdahl_ms(t, b) for t in range(1, cores + 1) for b in range(1, batch + 1)}
        Profile.from_latencies(table).write_csv(path)
        command = [sys.executable, "-m", "packrat_daemon", "solve", "--profile", str(path)]
        command += ["--cores", str(cores), "--batch", str(batch), "--json"]
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
            times.append(time.perf_counter() - start)
        return statistics.median(times), json.loads(out)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cores", type=int, default=16)
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument("--cli-cores", type=int, default=64)
    args = parser.parse_args()

    batches = [2**k for k in range(args.batch.bit_length()) if 2**k <= args.batch]
    profile = Profile.from_latencies({(t, b): amdahl_ms(t, b) for t in range(1, args.cores + 1) for b in batches})
    solution, solver_s = timed(lambda: Solver(profile, args.cores).solve(args.batch), repeats=20)
    dp_latency, dp_s = timed(paper_dp, profile, args.cores, args.batch)
    cli_s, cli_out = cli_wall_time(args.cli_cores, 1024, repeats=3)
    print(
        json.dumps(
            {
                "table": {"cores": args.cores, "batches": batches, "model": "amdahl 12% serial"},
                "batch": args.batch,
                "solver": {
                    "seconds_median_of_20": solver_s,
                    "latency_ms": solution.latency_ms,
                    "instances": [f"{n}x{t}t:{b}" for (t, b), n in Counter(solution.instances).items()],
                },
                "paper_dp": {"seconds": dp_s, "latency_ms": dp_latency},
                "speedup": dp_s / solver_s,
                "solver_latency_le_dp": solution.latency_ms <= dp_latency + 1e-9,
                "cli_T64_B1024": {
                    "wall_seconds_median_of_3": cli_s,
                    "latency_ms": cli_out["plans"][0]["latency_ms"],
                    "instances": len(cli_out["plans"][0]["instances"]),
                },
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
