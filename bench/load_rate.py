"""How closely `packrat load --rate R` offers R requests/s: a real daemon (tiny model), a few rates and seeds.

    .venv/bin/python bench/load_rate.py [--rates 10,50,100,200,400] [--duration 15] [--seeds 0,1,2,3,4]

Two errors are told apart: the schedule's, known before anything is sent (`open_loop_schedule` with the
same seed), and the generator's own, what it sent per second against what its schedule held per second.
With `packrat load`'s default fixed count the schedule holds exactly R·D arrivals; a drawn Poisson count
(`--poisson-count drawn`) would stray by about 1/sqrt(R·D), `schedule_sd_expected` below. Prints one JSON
object; the daemon's log and each run's progress go to stderr.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from harness import REPO, DaemonProcess

from packrat_daemon.load.arrivals import BatchMix, Poisson, open_loop_schedule

SERVE = ["--model", "builtin:tiny-mlp", "--policy", "single", "--max-batch", "8"]


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",")]


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",")]


def load(endpoint: str, rate: float, duration: float, seed: int) -> dict[str, Any]:
    command = [sys.executable, "-m", "packrat_daemon", "load", "--endpoint", endpoint, "--rate", f"{rate:g}",
               "--duration", f"{duration:g}", "--seed", str(seed), "--json", "--quiet"]  # fmt: skip
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=duration + 120, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"packrat load failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", type=_floats, default=[10.0, 50.0, 100.0, 200.0, 400.0])
    parser.add_argument("--duration", type=float, default=15.0)
    parser.add_argument("--seeds", type=_ints, default=[0, 1, 2, 3, 4])
    args = parser.parse_args()
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="packrat-load-rate-") as folder:
        daemon = DaemonProcess("tiny", Path(folder), SERVE)
        try:
            info = daemon.wait()
            for rate in args.rates:
                for seed in args.seeds:
                    scheduled = open_loop_schedule(
                        Poisson(rate), BatchMix.single(1), duration_s=args.duration, rng=random.Random(seed)
                    )
                    report = load(daemon.endpoint, rate, args.duration, seed)
                    scheduled_rps = len(scheduled) / args.duration
                    run = {
                        "rate_rps": rate,
                        "seed": seed,
                        "scheduled_rps": round(scheduled_rps, 3),
                        "sent_rps": report["sent_rps"],
                        "throughput_rps": report["throughput_rps"],
                        "sent_vs_rate": round(report["sent_rps"] / rate - 1, 4),
                        "sent_vs_schedule": round(report["sent_rps"] / scheduled_rps - 1, 4),
                        "throughput_vs_rate": round(report["throughput_rps"] / rate - 1, 4),
                        "send_lag_p50_ms": report.get("send_lag_p50_ms"),
                        "send_lag_p99_ms": report.get("send_lag_p99_ms"),
                        "sent": report["sent"],
                        "ok": report["ok"],
                        "errors": report["errors"],
                        "latency_ms": report["latency_ms"],
                    }
                    runs.append(run)
                    print(f"rate {rate:g} seed {seed}: {run['sent_rps']} sent/s", file=sys.stderr)
        finally:
            daemon.close()
    by_rate = []
    for rate in args.rates:
        rows = [r for r in runs if r["rate_rps"] == rate]
        by_rate.append(
            {
                "rate_rps": rate,
                "runs": len(rows),
                "mean_scheduled_rps": round(statistics.mean(r["scheduled_rps"] for r in rows), 3),
                "mean_sent_rps": round(statistics.mean(r["sent_rps"] for r in rows), 3),
                "mean_throughput_rps": round(statistics.mean(r["throughput_rps"] for r in rows), 3),
                "worst_sent_vs_rate": max((r["sent_vs_rate"] for r in rows), key=abs),
                "worst_sent_vs_schedule": max((r["sent_vs_schedule"] for r in rows), key=abs),
                "worst_throughput_vs_rate": max((r["throughput_vs_rate"] for r in rows), key=abs),
                "schedule_sd_expected": round((rate * args.duration) ** -0.5, 4),
                "median_send_lag_p50_ms": statistics.median(r["send_lag_p50_ms"] for r in rows),
                "median_send_lag_p99_ms": statistics.median(r["send_lag_p99_ms"] for r in rows),
                "all_answered": all(r["ok"] == r["sent"] and not r["errors"] for r in rows),
            }
        )
    result = {
        "what": "packrat load --rate R against a real daemon; sent/s against R and against the seed's own schedule",
        "daemon": {"args": SERVE, "model": info.get("model"), "plan": info.get("plan")},
        "duration_s": args.duration,
        "seeds": args.seeds,
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "by_rate": by_rate,
        "runs": runs,
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
