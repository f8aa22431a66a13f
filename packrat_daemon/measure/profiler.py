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

from packrat_daemon.backend import Backend, ModelInfo, sample_inputs
from packrat_daemon.pool import Pool, WorkerHandle, WorkerState
from packrat_daemon.wire.errors import PackratError
from policies.planning.profile import Cell
from policies.planning.topology import CoreAllocator, Topology
from workers import messages

READY_TIMEOUT_S = 300.0
MAX_REPEATS = 7
NOISY_SPREAD = 1.15  # max/min of a cell's runs above which it is measured again


class MeasurementError(PackratError):
    """A worker died or stopped answering while a cell was measured."""


class CellProfiler:
    """Measures cells one at a time; keeps the workers of one thread count alive while it is in use.

    Side by side (the default), a cell (t, b) runs on as many t-thread workers as the cores hold, all
    at once on disjoint cores, and records the slowest: a plan's instances run together and slow one
    another down through shared caches and memory bandwidth, which an isolated measurement misses.
    """

    def __init__(
        self, backend: Backend, topology: Topology, info: ModelInfo, *, warmup: int = 1, repeats: int = 3,
        max_cell_seconds: float = 20.0, side_by_side: bool = True,
    ) -> None:  # fmt: skip
        self.backend = backend
        self.info = info
        self.topology = topology
        self.allocator = CoreAllocator(topology)
        self.pool = Pool(backend, warmup=(1,))
        self.warmup = warmup
        self.repeats = repeats
        self.max_cell_seconds = max_cell_seconds
        self.side_by_side = side_by_side
        self.workers: list[WorkerHandle] = []
        self._job = 0

    def measure(self, threads: int, batch: int) -> Cell:
        workers = self._workers_for(threads)
        inputs = sample_inputs(self.info, batch)
        for _ in range(self.warmup):
            self._run(workers, inputs)
        times: list[float] = []
        started = time.monotonic()
        wanted = self.repeats
        while len(times) < wanted:
            times.append(self._run(workers, inputs))
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
        for worker in self.workers:
            self.pool.retire(worker)
        for worker in self.workers:
            self._wait_exit(worker)
        self.workers = []

    # -- internals --------------------------------------------------------------------------
    def _workers_for(self, threads: int) -> list[WorkerHandle]:
        if (
            self.workers
            and self.workers[0].threads == threads
            and all(w.state is WorkerState.READY for w in self.workers)
        ):
            return self.workers
        self.close()
        count = max(1, self.topology.usable_cores // threads) if self.side_by_side else 1
        workers = [
            self.pool.spawn(threads, cores, generation=0) for cores in self.allocator.allocate([threads] * count)
        ]
        deadline = time.monotonic() + READY_TIMEOUT_S
        while any(w.state is WorkerState.STARTING for w in workers):
            if time.monotonic() > deadline:
                raise MeasurementError(f"a {threads}-thread worker did not start within {READY_TIMEOUT_S:.0f} s")
            self.pool.pump(500)
        if any(w.state is not WorkerState.READY for w in workers):
            raise MeasurementError(f"a {threads}-thread worker died while starting")
        self.workers = workers
        return workers

    def _run(self, workers: list[WorkerHandle], inputs: np.ndarray) -> float:
        """Run `inputs` on every worker at once; the slowest compute time, in milliseconds."""
        jobs: dict[int, WorkerHandle] = {}
        header = {"dtype": inputs.dtype.name, "shape": list(inputs.shape)}
        for worker in workers:
            self._job += 1
            jobs[self._job] = worker
            if not self.backend.send(
                worker.identity, messages.RUN, {**header, "job": self._job}, [memoryview(inputs).cast("B")]
            ):
                raise MeasurementError(f"worker {worker.id} is gone")
        slowest = 0.0
        while jobs:
            event = self.pool.pump(1000)
            for worker in jobs.values():
                if worker.state is WorkerState.DEAD:
                    raise MeasurementError(f"worker {worker.id} ({worker.threads} threads) died during a measurement")
            if event is None or event.header.get("job") not in jobs:
                continue
            if event.kind == "failed":
                raise MeasurementError(f"the model failed on a batch of {inputs.shape[0]}: {event.header['message']}")
            if event.kind == "result":
                del jobs[event.header["job"]]
                slowest = max(slowest, float(event.header["compute_ms"]))
        return slowest

    def _wait_exit(self, worker: WorkerHandle, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while worker.id in self.pool.workers and time.monotonic() < deadline:
            self.pool.pump(100)


def _spread(times: list[float]) -> float:
    return max(times) / min(times) if min(times) > 0 else float("inf")


def default_grid(cores: int, max_batch: int) -> tuple[list[int], list[int]]:
    """Threads 1..cores and batches 1, 2, 4, ... up to max_batch (max_batch included)."""
    batches = sorted({min(2**k, max_batch) for k in range(max_batch.bit_length() + 1)})
    return list(range(1, cores + 1)), batches
