"""The first big request of each size: its copy into a fresh inbox against one reserved at start-up.

    .venv/bin/python bench/inbox_page_in.py [--batches 1,4,16] [--rounds 20] [--sample-bytes 602112]

Each round makes two new inboxes, as two new daemons would have: one left as it is (a request's first
payload of a size then pages in its place while it is copied) and one whose places were reserved and paged
in by `Inbox.reserve`, as the daemon does before it opens (`Batcher.reserve_inbox`). A payload of each
batch size (ResNet-50's input, 0.6 MB a sample, by default) is placed into both, in turns; the copy into
the reserved inbox then pays only the copy. Also timed: `reserve_ms`, what the reservation costs at
start-up for sizes 1 to the largest batch, and the minor page faults during each copy
(`resource.getrusage`), so that a gap is read as page faults and not as noise.
Prints JSON: per batch size the medians of the copy in each inbox and their ratio.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from workers.arena import Inbox  # noqa: E402

RESNET50_SAMPLE_BYTES = 3 * 224 * 224 * 4


class Owner:
    """Stands for a request: the inbox keeps a payload's place while its owner lives."""


def timed_place(inbox: Inbox, payload: np.ndarray) -> tuple[float, int]:
    """Milliseconds and minor page faults of one copy into `inbox` (its owner is dropped at once)."""
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    started = time.perf_counter()
    placed = inbox.place(payload, Owner())
    elapsed_ms = (time.perf_counter() - started) * 1000.0
    assert placed is not None, "a payload under the inbox's minimum stays where it is"
    return elapsed_ms, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batches", default="1,4,16")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--sample-bytes", type=int, default=RESNET50_SAMPLE_BYTES)
    args = parser.parse_args()
    batches = [int(size) for size in args.batches.split(",")]
    payloads = {batch: np.ones(batch * args.sample_bytes, dtype=np.uint8) for batch in batches}
    times: dict[int, dict[str, list[float]]] = {batch: {"fresh": [], "reserved": []} for batch in batches}
    faults: dict[int, dict[str, list[int]]] = {batch: {"fresh": [], "reserved": []} for batch in batches}
    reserve_ms: list[float] = []
    for round_ in range(args.rounds):
        fresh, reserved = Inbox("bench-fresh"), Inbox("bench-reserved")
        try:
            started = time.perf_counter()
            reserved.reserve(samples * args.sample_bytes for samples in range(1, max(batches) + 1))
            reserve_ms.append((time.perf_counter() - started) * 1000.0)
            order = ("fresh", "reserved") if round_ % 2 == 0 else ("reserved", "fresh")
            for batch in batches:
                for name in order:
                    elapsed_ms, minor = timed_place(fresh if name == "fresh" else reserved, payloads[batch])
                    times[batch][name].append(elapsed_ms)
                    faults[batch][name].append(minor)
        finally:
            fresh.close()
            reserved.close()
    rows: list[dict[str, Any]] = []
    for batch in batches:
        fresh_ms = statistics.median(times[batch]["fresh"])
        reserved_ms = statistics.median(times[batch]["reserved"])
        rows.append({
            "batch": batch,
            "payload_mb": round(batch * args.sample_bytes / 1e6, 2),
            "fresh_ms": round(fresh_ms, 3),
            "reserved_ms": round(reserved_ms, 3),
            "reserved_over_fresh": round(reserved_ms / fresh_ms, 3),
            "minor_faults_fresh": statistics.median(faults[batch]["fresh"]),
            "minor_faults_reserved": statistics.median(faults[batch]["reserved"]),
        })  # fmt: skip
    print(json.dumps({
        "what": "one payload's copy into a new inbox, its place fresh or reserved and paged in at start-up",
        "sample_bytes": args.sample_bytes, "rounds": args.rounds,
        "reserve_ms_median": round(statistics.median(reserve_ms), 2), "rows": rows,
    }, indent=1))  # fmt: skip


if __name__ == "__main__":
    main()
