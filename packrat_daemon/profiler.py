"""Measuring L(t, b): each cell in a pinned worker with t intra-op threads, forked from the template.

The profiler runs the very worker code that serves production traffic, so a profiled cell and a
served slice measure the same thing. Each cell: warm-up runs (the first call on a new shape builds
oneDNN primitives), then repeats; the median compute time and the p90 are recorded.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterable

import numpy as np

from packrat_daemon.backend import Backend, ModelInfo
from packrat_daemon.errors import PackratError
from packrat_daemon.pool import Pool, WorkerHandle, WorkerState
from packrat_daemon.profile import Cell
from packrat_daemon.topology import CoreAllocator, Topology
from workers import messages

READY_TIMEOUT_S = 300.0
MAX_REPEATS = 7
NOISY_SPREAD = 1.15  # max/min of a cell's runs above which it is measured again


class MeasurementError(PackratError):
    """A worker died or stopped answering while a cell was measured."""


class CellProfiler:
    """Measures cells one at a time; keeps one worker alive per thread count while it is in use."""

    def __init__(
        self, backend: Backend, topology: Topology, info: ModelInfo, *, warmup: int = 1, repeats: int = 3,
        max_cell_seconds: float = 20.0,
    ) -> None:  # fmt: skip
        self.backend = backend
        self.info = info
        self.allocator = CoreAllocator(topology)
        self.pool = Pool(backend, warmup=(1,))
        self.warmup = warmup
        self.repeats = repeats
        self.max_cell_seconds = max_cell_seconds
        self.worker: WorkerHandle | None = None
        self._job = 0

    def measure(self, threads: int, batch: int) -> Cell:
        worker = self._worker_for(threads)
        inputs = _sample(self.info, batch)
        for _ in range(self.warmup):
            self._run(worker, inputs)
        times: list[float] = []
        started = time.monotonic()
        wanted = self.repeats
        while len(times) < wanted:
            times.append(self._run(worker, inputs))
            # A slow cell (big batch on one thread) keeps fewer repeats rather than stalling for minutes.
            if time.monotonic() - started > self.max_cell_seconds:
                break
            # A noisy cell (another process stole the cores for a moment) earns a few more runs, so
            # one outlier cannot steer the plan: the median of 7 shrugs off up to 3 of them.
            if len(times) == wanted and wanted < MAX_REPEATS and _spread(times) > NOISY_SPREAD:
                wanted = min(MAX_REPEATS, wanted + 2)
        p90 = float(np.percentile(times, 90)) if len(times) > 1 else times[0]
        return Cell(statistics.median(times), len(times), p90)

    def measure_many(self, cells: Iterable[tuple[int, int]]) -> dict[tuple[int, int], Cell]:
        return {(t, b): self.measure(t, b) for t, b in cells}

    def close(self) -> None:
        if self.worker is not None:
            self.pool.retire(self.worker)
            self._wait_exit(self.worker)
            self.worker = None

    # -- internals --------------------------------------------------------------------------
    def _worker_for(self, threads: int) -> WorkerHandle:
        if self.worker is not None and self.worker.threads == threads and self.worker.state is WorkerState.READY:
            return self.worker
        self.close()
        cores = self.allocator.allocate([threads])[0]
        worker = self.pool.spawn(threads, cores, generation=0)
        deadline = time.monotonic() + READY_TIMEOUT_S
        while worker.state is WorkerState.STARTING:
            if time.monotonic() > deadline:
                raise MeasurementError(f"a {threads}-thread worker did not start within {READY_TIMEOUT_S:.0f} s")
            self._pump(500)
        if worker.state is not WorkerState.READY:
            raise MeasurementError(f"the {threads}-thread worker died while starting")
        self.worker = worker
        return worker

    def _run(self, worker: WorkerHandle, inputs: np.ndarray) -> float:
        self._job += 1
        job = self._job
        header = {"job": job, "dtype": inputs.dtype.name, "shape": list(inputs.shape)}
        if not self.backend.send(worker.identity, messages.RUN, header, [memoryview(inputs).cast("B")]):
            raise MeasurementError(f"worker {worker.id} is gone")
        while True:
            event = self._pump(1000)
            if worker.state is WorkerState.DEAD:
                raise MeasurementError(f"worker {worker.id} ({worker.threads} threads) died during a measurement")
            if event is not None and event.kind == "result" and event.header["job"] == job:
                return float(event.header["compute_ms"])
            if event is not None and event.kind == "failed" and event.header.get("job") == job:
                raise MeasurementError(f"the model failed on a batch of {inputs.shape[0]}: {event.header['message']}")

    def _pump(self, timeout_ms: int):  # noqa: ANN202
        received = self.backend.recv(timeout_ms)
        if received is None:
            if not self.pool.template_alive():
                raise MeasurementError("the template process died")
            return None
        return self.pool.handle(*received)

    def _wait_exit(self, worker: WorkerHandle, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while worker.id in self.pool.workers and time.monotonic() < deadline:
            self._pump(100)


def _sample(info: ModelInfo, batch: int) -> np.ndarray:
    rng = np.random.default_rng(batch)
    shape = (batch, *info.shape)
    if info.dtype.startswith("float"):
        return rng.standard_normal(shape, dtype=np.float32).astype(info.dtype)
    if info.dtype == "bool":
        return rng.integers(0, 2, shape).astype(bool)
    return rng.integers(0, info.high or 100, shape).astype(info.dtype)


def _spread(times: list[float]) -> float:
    return max(times) / min(times) if min(times) > 0 else float("inf")


def default_grid(cores: int, max_batch: int) -> tuple[list[int], list[int]]:
    """Threads 1..cores and batches 1, 2, 4, ... up to max_batch (max_batch included)."""
    batches = sorted({min(2**k, max_batch) for k in range(max_batch.bit_length() + 1)})
    return list(range(1, cores + 1)), batches
