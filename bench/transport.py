"""The daemon ↔ worker hop without compute: tensors as ZeroMQ frames against shared memory, in one run.

    .venv/bin/python bench/transport.py [--batches 1,4,16] [--rounds 30] [--settle-ms 20]

One template loads a model with ResNet-50's input (float32 3×224×224, 0.6 MB a sample) and output
(1000 floats a sample) that computes almost nothing (a global average pool and a linear layer). Three
pools of the daemon's own code (packrat_daemon.fleet.pool) each fork one 1-thread worker on the same core:

- frames: every tensor as ZeroMQ frames, as the daemon did before it shared memory;
- arena: the input copied into the worker's arena when it is sent (the daemon's path for a slice made
  of several requests);
- inbox: the input already in the daemon's inbox, where the batcher copies a request's payload on
  arrival, so the hop sends a header only. The copy on arrival is timed too (`inbox_place_ms`: the
  payload copied from private memory into the inbox, right before the job, as for a lone request),
  because it moved there from the hop: `inbox_with_place_over_frames` counts it back in.

Their jobs alternate (frames, arena, inbox, ...), each after a pause of --settle-ms as between batches.
Per batch size it prints the medians of the round trip (send to result, as measure.bench times it),
the worker's compute time, and transport = round trip − compute, for each path, and each path's
transport over the frames path's.
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

import numpy as np

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
    from workers.arena import Inbox
    from workers.models.spec import sample_input

    paths = {"frames": False, "arena": True, "inbox": True}
    inbox = Inbox("bench-inbox")
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
            source = sample_input(info.input, batch, seed=batch)  # a payload as received, in private memory
            placing: list[float] = []
            for number in range(args.rounds + 3):  # three warm-up jobs per path
                for name, bench in benches.items():
                    time.sleep(args.settle_ms / 1000.0)
                    if name == "inbox":
                        owner = Request()  # the last round's request is gone: its place is reused
                        started = time.perf_counter()
                        placed = inbox.place(source, owner)
                        placing.append((time.perf_counter() - started) * 1000.0)
                        bench._inputs[batch] = np.frombuffer(placed, source.dtype).reshape(source.shape)
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
                spread = sorted(transport)
                summary[f"{name}_transport_p25_p75_ms"] = [round(spread[len(spread) // 4], 3),
                                                           round(spread[3 * len(spread) // 4], 3)]  # fmt: skip
            summary["inbox_place_ms"] = round(statistics.median(placing[3:]), 3)
            frames = summary["frames_transport_ms"]
            for name in ("arena", "inbox"):
                summary[f"{name}_over_frames"] = round(summary[f"{name}_transport_ms"] / frames, 3)
            with_place = summary["inbox_transport_ms"] + summary["inbox_place_ms"]
            summary["inbox_with_place_over_frames"] = round(with_place / frames, 3)
            result["by_batch"][batch] = summary
            print(f"batch {batch}: {summary}", file=sys.stderr)
    inbox.close()
    print(json.dumps(result, indent=1))


class Request:
    """Stands for a queued request: the inbox keeps its payload's place while it lives."""


if __name__ == "__main__":
    main()
