"""The daemon ↔ worker hop without compute: tensors as ZeroMQ frames against shared memory, in one run.

    .venv/bin/python bench/transport.py [--batches 1,4,16] [--rounds 30] [--settle-ms 20]

One template loads a model with ResNet-50's input (float32 3×224×224, 0.6 MB a sample) and output
(1000 floats a sample) that computes almost nothing (a global average pool and a linear layer). Two
pools of the daemon's own code (packrat_daemon.pool) each fork one 1-thread worker on the same core:
one sends every tensor as frames, as the daemon did before, the other through shared memory. Their
jobs alternate (frames, shared, frames, ...), each after a pause of --settle-ms as between batches.
Per batch size it prints the medians of the round trip (send to result, as measure.bench times it),
the worker's compute time, and transport = round trip − compute, for each path, and the ratio
shared ÷ frames of the transport.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(REPO))

MODEL = "transport:resnet50_sized_head"  # this file, imported by the template from bench/


def resnet50_sized_head() -> Any:
    """ResNet-50's input and output shapes around almost no compute, so that a round trip is the hop."""
    import torch
    from torch import nn

    class Head(nn.Module):
        packrat_input = "float32:3x224x224"

        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.fc = nn.Linear(3, 1000)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(x.mean(dim=(2, 3)))

    return Head()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="1,4,16")
    parser.add_argument("--rounds", type=int, default=30, help="timed jobs per path and batch size")
    parser.add_argument("--settle-ms", type=float, default=20.0, help="pause before each job")
    args = parser.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(BENCH), str(REPO), os.environ.get("PYTHONPATH")]))

    from packrat_daemon.measure.bench import Bench, model_session
    from policies.planning.topology import Topology

    paths = {"frames": False, "shared": True}
    result: dict[str, Any] = {
        "model": MODEL, "input": "float32:3x224x224", "output": "float32:1000", "threads": 1,
        "rounds": args.rounds, "settle_ms": args.settle_ms, "by_batch": {},
    }  # fmt: skip
    with model_session(MODEL) as (backend, info):
        topology = Topology.detect()
        benches = {name: Bench(backend, topology, info, shared_memory=shared) for name, shared in paths.items()}
        for batch in batches:
            live = {name: bench.start([(1, batch)]) for name, bench in benches.items()}
            rows: dict[str, dict[str, list[float]]] = {name: {"wall": [], "compute": []} for name in paths}
            for number in range(args.rounds + 3):  # three warm-up jobs per path
                for name, bench in benches.items():
                    time.sleep(args.settle_ms / 1000.0)
                    run = bench.round(live[name])
                    if number >= 3:
                        rows[name]["wall"].append(run.wall_ms)
                        rows[name]["compute"].append(run.compute_ms[0])
            for name, bench in benches.items():
                bench.stop(live[name])
            summary: dict[str, float] = {"input_mb": round(batch * 3 * 224 * 224 * 4 / 2**20, 2)}
            for name, timed in rows.items():
                transport = [wall - compute for wall, compute in zip(timed["wall"], timed["compute"], strict=True)]
                summary[f"{name}_round_trip_ms"] = round(statistics.median(timed["wall"]), 3)
                summary[f"{name}_compute_ms"] = round(statistics.median(timed["compute"]), 3)
                summary[f"{name}_transport_ms"] = round(statistics.median(transport), 3)
            summary["shared_over_frames"] = round(summary["shared_transport_ms"] / summary["frames_transport_ms"], 3)
            result["by_batch"][batch] = summary
            print(f"batch {batch}: {summary}", file=sys.stderr)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
