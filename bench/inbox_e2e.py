"""A request of 16 ResNet-50-sized inputs end to end, through a daemon without the inbox and one with it.

    .venv/bin/python bench/inbox_e2e.py --base REV [--requests 40] [--pause-ms 20]

`bench/transport.py` times the daemon-to-worker hop alone; the inbox moves a copy out of that hop into
the request's arrival, so this checks what a client sees. REV is a revision before the inbox (e.g. the
commit before it); `git archive` unpacks it into a temporary folder. Both daemons serve
`transport:resnet50_sized_head` (bench/transport.py: ResNet-50's input and output around almost no
compute) at once, with the same plan, and get the same request of 16 inputs (9.2 MB), alternating,
after a pause of `--pause-ms` each. Two plans: one 1-thread worker taking all 16 inputs, and two
1-thread workers taking 8 each (a split: before the inbox, two copies into their arenas). Prints the
medians of the client's round trip and of the daemon's reported compute time, and the daemon's minor
page faults per request (a payload landing in fresh memory would fault in every page).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

from batching import REPO, Served  # noqa: E402
from harness import unpack_revision  # noqa: E402

MODEL = "transport:resnet50_sized_head"
PLANS = {"one worker": "1x16", "split in two": "2*1x8"}


def minor_faults(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[7])


def measure(daemons: list[Served], x: np.ndarray, count: int, pause_s: float) -> dict[str, Any]:
    latency: dict[str, list[float]] = {d.name: [] for d in daemons}
    compute: dict[str, list[float]] = {d.name: [] for d in daemons}
    faults: dict[str, int] = {}
    for k in range(count + 3):
        if k == 3:  # after the warm-up
            faults = {d.name: minor_faults(d.process.pid) for d in daemons}
        for daemon in daemons if k % 2 == 0 else daemons[::-1]:
            time.sleep(pause_s)
            started = time.perf_counter()
            daemon.send(x)
            head = daemon.receive()
            if k >= 3:
                latency[daemon.name].append((time.perf_counter() - started) * 1000.0)
                compute[daemon.name].append(head["timing"]["compute_ms"])
    return {
        d.name: {
            "median_ms": round(statistics.median(latency[d.name]), 3),
            "p25_p75_ms": [round(float(np.percentile(latency[d.name], q)), 3) for q in (25, 75)],
            "median_compute_ms": round(statistics.median(compute[d.name]), 3),
            "daemon_faults_per_request": round((minor_faults(d.process.pid) - faults[d.name]) / count, 1),
        }
        for d in daemons
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, help="a revision before the inbox")
    parser.add_argument("--requests", type=int, default=40, help="requests per daemon and plan")
    parser.add_argument("--pause-ms", type=float, default=20.0)
    args = parser.parse_args()
    x = np.random.default_rng(0).standard_normal((16, 3, 224, 224), dtype=np.float32)
    with tempfile.TemporaryDirectory(prefix="packrat-inbox-") as tmp:
        folder = Path(tmp)
        base_tree = folder / "base"
        revision = unpack_revision(args.base, base_tree)
        result: dict[str, Any] = {"model": MODEL, "batch": 16, "base": revision, "pause_ms": args.pause_ms}
        for label, plan in PLANS.items():
            settings = ["--model", MODEL, "--policy", "fixed", "--plan", plan, "--max-batch", "16"]
            settings += ["--max-delay-ms", "0", "--log-level", "warning"]
            daemons = []
            (folder / label.replace(" ", "-")).mkdir()
            for name, tree in (("before", base_tree), ("inbox", REPO)):
                env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tree / "bench"), str(tree)]))
                daemons.append(Served(f"{name}", tree, folder / label.replace(" ", "-"), settings, env))
            try:
                for daemon in daemons:
                    daemon.wait()
                result[label] = measure(daemons, x, args.requests, args.pause_ms / 1000.0)
                result[label]["inbox_over_before"] = round(
                    result[label]["inbox"]["median_ms"] / result[label]["before"]["median_ms"], 3
                )
                print(f"{label}: {result[label]}", file=sys.stderr)
            finally:
                for daemon in daemons:
                    daemon.close()
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
