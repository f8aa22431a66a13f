"""Triton's statistics extension for the one model: counts and cumulative durations, as `perf_analyzer`
reads them for its server-side breakdown.

What each duration is, in Packrat's terms (docs/oip.md, "Statistics"): `queue` is the daemon's `queue_ms`
(waiting to be batched and dispatched), `compute_infer` its `compute_ms` (the batch the request rode in),
`compute_input` the gateway decoding the request into a tensor, `compute_output` encoding the result;
`success` is the whole request as the gateway saw it. Batches are formed in the daemon from the requests of
every frontend, so `execution_count` counts requests, and `batch_stats` is by request size.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

DURATIONS = ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output", "cache_hit", "cache_miss")
_BATCH_DURATIONS = ("compute_input", "compute_infer", "compute_output")


@dataclass
class Duration:
    count: int = 0
    ns: int = 0

    def add(self, ns: int) -> None:
        self.count += 1
        self.ns += ns

    def to_json(self) -> dict[str, int]:
        return {"count": self.count, "ns": self.ns}


@dataclass
class Statistics:
    """The model's statistics since the gateway started."""

    last_inference_ms: int = 0  # Unix milliseconds of the last answered inference (0: none yet)
    inference_count: int = 0  # samples answered
    execution_count: int = 0  # requests answered
    durations: dict[str, Duration] = field(default_factory=lambda: {name: Duration() for name in DURATIONS})
    by_batch: dict[int, dict[str, Duration]] = field(default_factory=dict)
    # The loop's requests and the threaded gRPC server's handlers count into the same statistics.
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def succeeded(self, samples: int, total_ns: int, queue_ns: int, compute_ns: int, input_ns: int, output_ns: int):
        with self._lock:
            self._succeeded(samples, total_ns, queue_ns, compute_ns, input_ns, output_ns)

    def _succeeded(self, samples: int, total_ns: int, queue_ns: int, compute_ns: int, input_ns: int, output_ns: int):
        self.last_inference_ms = int(time.time() * 1000)
        self.inference_count += samples
        self.execution_count += 1
        parts = {"success": total_ns, "queue": queue_ns, "compute_infer": compute_ns}
        parts.update(compute_input=input_ns, compute_output=output_ns)
        for name, ns in parts.items():
            self.durations[name].add(ns)
        batch = self.by_batch.setdefault(samples, {name: Duration() for name in _BATCH_DURATIONS})
        for name in _BATCH_DURATIONS:
            batch[name].add(parts[name])

    def failed(self, total_ns: int) -> None:
        with self._lock:
            self.durations["fail"].add(total_ns)

    def to_json(self, name: str, version: str) -> dict[str, Any]:
        """One entry of the `model_stats` list, in the REST extension's JSON (the gRPC message's fields)."""
        with self._lock:
            return self._to_json(name, version)

    def _to_json(self, name: str, version: str) -> dict[str, Any]:
        return {
            "name": name,
            "version": version,
            "last_inference": self.last_inference_ms,
            "inference_count": self.inference_count,
            "execution_count": self.execution_count,
            "inference_stats": {key: value.to_json() for key, value in self.durations.items()},
            "batch_stats": [
                {"batch_size": size, **{key: value.to_json() for key, value in parts.items()}}
                for size, parts in sorted(self.by_batch.items())
            ],
        }
