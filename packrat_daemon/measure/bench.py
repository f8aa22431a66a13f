"""Measuring on real workers: profile cells, and plans run side by side (confirmations, split checks).

Every measurement runs the very worker code that serves production traffic, forked from the template
and pinned, so a measured cell and a served slice measure the same thing. One mechanism serves all:
start pinned workers on disjoint cores, send each its slice at once (a round), record compute times.

- A cell L(t, b) is a round repeated: warm-up runs (the first call on a new shape builds oneDNN
  primitives), then repeats; the median compute time and the p90 are recorded. Side by side (the
  default), a cell runs on as many t-thread workers as the cores hold, all at once, and records the
  slowest: a plan's instances run together and slow one another down through shared caches and
  memory bandwidth, which an isolated measurement misses.
- A plan chosen from a profile is confirmed by running its instances together, and two plans are
  compared in one run, their rounds interleaved so that a noisy neighbour on a shared machine slows
  both alike.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from packrat_daemon.fleet.backend import Backend, ModelInfo
from packrat_daemon.fleet.pool import Pool, WorkerHandle, WorkerState
from packrat_daemon.measure import contention
from packrat_daemon.ops.progress import Progress
from packrat_daemon.wire.errors import PackratError
from policies.planning.cores import CoreAllocator
from policies.planning.profile import Cell
from policies.planning.topology import Topology
from workers.models.spec import sample_input

READY_TIMEOUT_S = 300.0
RESULT_TIMEOUT_S = 300.0
STOP_TIMEOUT_S = 10.0
MAX_REPEATS = 7
NOISY_SPREAD = 1.15  # max/min of a cell's runs above which it is measured again

Instances = Sequence[tuple[int, int]]  # (threads, batch) per instance


class MeasurementError(PackratError):
    """A worker died, failed or stopped answering while a cell or a plan was measured."""


class Round(NamedTuple):
    """One round: every worker ran its slice at once."""

    slowest_ms: float  # the slowest worker's compute time: the plan's latency as the solver defines it
    wall_ms: float  # first send to last reply, transport included
    compute_ms: list[float]  # each worker's compute time, in the order of its instances


@dataclass(frozen=True)
class PlanTiming:
    """A plan measured side by side: medians over rounds."""

    instances: tuple[tuple[int, int], ...]
    latency_ms: float  # median of the rounds' slowest compute times
    wall_ms: float
    per_instance_ms: tuple[float, ...]
    rounds: int


@dataclass
class LivePlan:
    instances: tuple[tuple[int, int], ...]
    workers: list[WorkerHandle]


@contextmanager
def model_session(
    model: str,
    *,
    input_override: str | None = None,
    runtime: str = "torch",
    allocator: str = "system",
    precision: str = "fp32",
) -> Iterator[tuple[Backend, ModelInfo]]:
    """A template process with the model loaded, ready to fork workers; torn down on exit."""
    import zmq

    context = zmq.Context()
    backend = Backend(context)
    try:
        backend.start_template(
            model, input_override=input_override, runtime=runtime, allocator=allocator, precision=precision
        )
        yield backend, backend.wait_template()
    finally:
        backend.close()
        context.term()


class Bench:
    """Starts workers from a loaded template and times them: cells one at a time, or whole plans.

    `warmup`, `repeats` and `max_cell_seconds` shape each cell's measurement. `side_by_side` runs a
    cell on every core at once (False: on one worker alone). The workers of a cell's thread count stay
    alive for the next cell of that count; `keep_workers` keeps every count's alive until `close`,
    for callers that return to a thread count in any order (adaptive profiling), since forking a
    fresh worker takes seconds, more than most cells. `shared_memory=False` sends every tensor as
    frames, as the daemon did before its workers shared memory (bench/transport.py compares the two).
    """

    def __init__(
        self, backend: Backend, topology: Topology, info: ModelInfo, *, warmup: int = 1, repeats: int = 3,
        max_cell_seconds: float = 20.0, side_by_side: bool = True, keep_workers: bool = False,
        shared_memory: bool = True,
    ) -> None:  # fmt: skip
        self.backend = backend
        self.info = info
        self.topology = topology
        self.allocator = CoreAllocator(topology)
        self.pool = Pool(backend, warmup=(1,), shared_memory=shared_memory)
        self.warmup = warmup
        self.repeats = repeats
        self.max_cell_seconds = max_cell_seconds
        self.side_by_side = side_by_side
        self.keep_workers = keep_workers
        self._job = 0
        self._cell_workers: dict[int, LivePlan] = {}  # thread count → its live cell workers
        self.on_cpu: dict[tuple[int, int], float] = {}  # cell → its workers' on-CPU share (measure.contention)
        self._inputs: dict[int, np.ndarray] = {}

    # -- cells ----------------------------------------------------------------------------------
    def measure_cells(
        self,
        cells: Sequence[tuple[int, int]],
        measured: dict[tuple[int, int], Cell],
        progress: Progress,
        interrupted: Callable[[], bool] = lambda: False,
    ) -> None:
        """Measure `cells` in order into `measured`, so what was measured survives a later failure; one
        progress step each. Stops between cells with KeyboardInterrupt once `interrupted()` says so."""
        for t, b in cells:
            if interrupted():
                raise KeyboardInterrupt
            measured[(t, b)] = cell = self.measure_cell(t, b)
            progress.advance(f"t={t} b={b}: {cell.latency_ms:.2f} ms")

    def measure_cell(self, threads: int, batch: int) -> Cell:
        """Median compute time of `batch` inputs on `threads`-thread workers (the slowest of a round). A cell whose
        workers were crowded off their cores (`contention`) is measured again, up to RETRIES times, and the least
        crowded measurement kept; its on-CPU share goes into `on_cpu`."""
        live = self._workers_for_cell(threads)
        sizes = [batch] * len(live.workers)
        for _ in range(self.warmup):
            self.round(live, sizes)
        best: tuple[float, Cell] | None = None
        for _ in range(1 + contention.RETRIES):
            sampler = contention.Sampler(w.pid for w in live.workers)
            cell = self._timed(live, sizes)
            share = sampler.share()
            if share is None:
                return cell  # the kernel keeps no schedstat: nothing to tell
            if best is None or share > best[0]:
                best = (share, cell)
            if share >= contention.QUIET_ON_CPU:
                break
        assert best is not None
        self.on_cpu[(threads, batch)] = best[0]
        return best[1]

    def _timed(self, live: LivePlan, sizes: list[int]) -> Cell:
        times: list[float] = []
        started = time.monotonic()
        wanted = self.repeats
        while len(times) < wanted:
            times.append(self.round(live, sizes).slowest_ms)
            # A slow cell (big batch on one thread) keeps fewer repeats rather than stalling for minutes.
            if time.monotonic() - started > self.max_cell_seconds:
                break
            # A noisy cell (another process stole the cores for a moment) earns a few more runs, so
            # one outlier cannot steer the plan: the median of 7 shrugs off up to 3 of them.
            if len(times) == wanted and wanted < MAX_REPEATS and _spread(times) > NOISY_SPREAD:
                wanted = min(MAX_REPEATS, wanted + 2)
        p90 = float(np.percentile(times, 90)) if len(times) > 1 else times[0]
        return Cell(statistics.median(times), len(times), p90)

    # -- plans ----------------------------------------------------------------------------------
    def compare(self, plans: Mapping[str, Instances], rounds: int = 5, warmup: int = 1) -> dict[str, PlanTiming]:
        """Time several plans in one run, their rounds interleaved (A, B, A, B, ...).

        Every plan's workers stay alive throughout; only one plan runs at a time, so the idle ones
        cost nothing but memory.
        """
        live: dict[str, LivePlan] = {}
        samples: dict[str, list[Round]] = {name: [] for name in plans}
        try:
            for name, instances in plans.items():
                live[name] = self.start(instances)
            for _ in range(warmup):  # first calls on a new shape build oneDNN primitives
                for plan in live.values():
                    self.round(plan)
            for _ in range(rounds):
                for name, plan in live.items():
                    samples[name].append(self.round(plan))
        finally:
            for plan in live.values():
                self.stop(plan)
        return {name: _timing(live[name].instances, runs) for name, runs in samples.items()}

    def start(self, instances: Instances) -> LivePlan:
        """Fork one worker per instance on disjoint cores and wait until all are warm."""
        pairs = tuple((int(t), int(b)) for t, b in instances)
        cores = self.allocator.allocate([t for t, _ in pairs])
        workers = [self.pool.spawn(t, c, generation=0) for (t, _), c in zip(pairs, cores, strict=True)]
        live = LivePlan(pairs, workers)
        deadline = time.monotonic() + READY_TIMEOUT_S
        while any(w.state is WorkerState.STARTING for w in workers):
            if time.monotonic() > deadline:
                self.stop(live)
                raise MeasurementError(f"the workers did not start within {READY_TIMEOUT_S:.0f} s")
            self.pool.pump(500)
        dead = [w for w in workers if w.state is not WorkerState.READY]
        if dead:
            self.stop(live)
            threads = sorted({w.threads for w in dead})
            raise MeasurementError(f"{len(dead)} of {len(workers)} worker(s) ({threads} threads) died while starting")
        return live

    def round(self, live: LivePlan, sizes: Sequence[int] | None = None) -> Round:
        """Send every worker its slice at once (`sizes`, by default the instances' batches); wait for all."""
        sizes = [b for _, b in live.instances] if sizes is None else list(sizes)
        jobs: dict[int, int] = {}
        started = time.perf_counter()
        for index, (worker, size) in enumerate(zip(live.workers, sizes, strict=True)):
            self._job += 1
            inputs = self._input(size)
            header = {"job": self._job, "dtype": inputs.dtype.name, "shape": list(inputs.shape)}
            if not self.pool.run(worker, header, [inputs.data.cast("B")]):
                raise MeasurementError(f"worker {worker.id} is gone")
            jobs[self._job] = index
        compute = [0.0] * len(sizes)
        deadline = time.monotonic() + RESULT_TIMEOUT_S
        while jobs:
            if time.monotonic() > deadline:
                raise MeasurementError(f"no result within {RESULT_TIMEOUT_S:.0f} s from {len(jobs)} worker(s)")
            event = self.pool.pump(1000)
            for worker in live.workers:
                if worker.state is WorkerState.DEAD:
                    raise MeasurementError(f"worker {worker.id} ({worker.threads} threads) died during a measurement")
            if event is None or event.header.get("job") not in jobs:
                continue
            index = jobs.pop(event.header["job"])
            if event.kind == "failed":
                raise MeasurementError(f"the model failed on a batch of {sizes[index]}: {event.header['message']}")
            if event.kind == "result":
                compute[index] = float(event.header["compute_ms"])
        wall = (time.perf_counter() - started) * 1000.0
        return Round(max(compute), wall, compute)

    def stop(self, live: LivePlan) -> None:
        for worker in live.workers:
            self.pool.retire(worker)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while any(w.id in self.pool.workers for w in live.workers) and time.monotonic() < deadline:
            self.pool.pump(100)

    def close(self) -> None:
        """Stop the workers kept for cells."""
        for live in self._cell_workers.values():
            self.stop(live)
        self._cell_workers.clear()

    # -- internals ------------------------------------------------------------------------------
    def _workers_for_cell(self, threads: int) -> LivePlan:
        live = self._cell_workers.get(threads)
        if live is not None and all(w.state is WorkerState.READY for w in live.workers):
            return live
        if live is not None:  # one of them died: start them all again
            self.stop(self._cell_workers.pop(threads))
        if not self.keep_workers:
            self.close()
        count = max(1, self.topology.usable_cores // threads) if self.side_by_side else 1
        live = self._cell_workers[threads] = self.start([(threads, 1)] * count)
        return live

    def _input(self, batch: int) -> np.ndarray:
        if batch not in self._inputs:
            # Seeded by the batch size, so every measurement of a batch size sends the same values.
            self._inputs[batch] = sample_input(self.info.input, batch, seed=batch)
        return self._inputs[batch]


def _spread(times: list[float]) -> float:
    return max(times) / min(times) if min(times) > 0 else float("inf")


def _timing(instances: tuple[tuple[int, int], ...], runs: list[Round]) -> PlanTiming:
    per_instance = tuple(statistics.median(run.compute_ms[k] for run in runs) for k in range(len(instances)))
    return PlanTiming(
        instances,
        statistics.median(run.slowest_ms for run in runs),
        statistics.median(run.wall_ms for run in runs),
        per_instance,
        len(runs),
    )


def default_grid(cores: int, max_batch: int) -> tuple[list[int], list[int]]:
    """Threads 1..cores and batches 1, 2, 4, ... up to max_batch (max_batch included)."""
    batches = sorted({min(2**k, max_batch) for k in range(max_batch.bit_length() + 1)})
    return list(range(1, cores + 1)), batches
