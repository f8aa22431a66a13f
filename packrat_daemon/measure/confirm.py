"""Measuring plans the way they serve: one pinned worker per instance, every slice sent at once.

A profile measures each cell alone; a plan runs its instances side by side, where they share memory
bandwidth and caches (DESIGN.md measured 3–5% interference on 2 cores, 1.2–1.35× on 16). So a plan
chosen from a profile is confirmed here, and two plans are compared in one run, their rounds
interleaved so that a noisy neighbour on a shared machine slows both alike.

The same workers also measure single cells for adaptive profiling: one idle worker is kept per
thread count, because forking a fresh one for each cell (1.5–4.9 s) would cost more than the cell.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from packrat_daemon.backend import Backend, ModelInfo, sample_inputs
from packrat_daemon.measure.profiler import MAX_REPEATS, NOISY_SPREAD
from packrat_daemon.pool import Pool, WorkerHandle, WorkerState
from packrat_daemon.wire.errors import PackratError
from policies.planning.profile import Cell
from policies.planning.topology import CoreAllocator, Topology
from workers import messages

READY_TIMEOUT_S = 300.0
RESULT_TIMEOUT_S = 300.0

Instances = Sequence[tuple[int, int]]  # (threads, batch) per instance


class ConfirmError(PackratError):
    """A worker died, failed or stopped answering while a plan was measured."""


@dataclass(frozen=True)
class PlanTiming:
    """A plan measured side by side: medians over rounds."""

    instances: tuple[tuple[int, int], ...]
    latency_ms: float  # the slowest instance's compute time: the plan's latency as the solver defines it
    wall_ms: float  # first send to last reply, transport included
    per_instance_ms: tuple[float, ...]
    rounds: int

    def to_json(self) -> dict:
        return {
            "instances": [{"threads": int(t), "batch": int(b)} for t, b in self.instances],
            "latency_ms": round(self.latency_ms, 3),
            "wall_ms": round(self.wall_ms, 3),
            "per_instance_ms": [round(x, 3) for x in self.per_instance_ms],
            "rounds": self.rounds,
        }


@dataclass
class LivePlan:
    instances: tuple[tuple[int, int], ...]
    workers: list[WorkerHandle]


@contextmanager
def model_session(
    model: str, *, input_override: str | None = None, runtime: str = "torch", allocator: str = "system"
) -> Iterator[tuple[Backend, ModelInfo]]:
    """A template process with the model loaded, ready to fork workers; torn down on exit."""
    import zmq

    context = zmq.Context()
    backend = Backend(context)
    try:
        backend.start_template(model, input_override=input_override, runtime=runtime, allocator=allocator)
        yield backend, backend.wait_template()
    finally:
        backend.close()
        context.term()


class SideBySide:
    """Starts plans' workers from a loaded template and times them running together."""

    def __init__(self, backend: Backend, topology: Topology, info: ModelInfo) -> None:
        self.backend = backend
        self.info = info
        self.allocator = CoreAllocator(topology)
        self.pool = Pool(backend, warmup=(1,))
        self._job = 0
        self._cell_workers: dict[int, LivePlan] = {}
        self._inputs: dict[int, np.ndarray] = {}

    # -- plans --------------------------------------------------------------------------------
    def start(self, instances: Instances) -> LivePlan:
        """Fork one worker per instance on disjoint cores and wait until all are warm."""
        pairs = tuple((int(t), int(b)) for t, b in instances)
        cores = self.allocator.allocate([t for t, _ in pairs])
        workers = [self.pool.spawn(t, c, generation=0) for (t, _), c in zip(pairs, cores, strict=True)]
        deadline = time.monotonic() + READY_TIMEOUT_S
        while any(w.state is WorkerState.STARTING for w in workers):
            if time.monotonic() > deadline:
                raise ConfirmError(f"the plan's workers did not start within {READY_TIMEOUT_S:.0f} s")
            self.pool.pump(500)
        dead = [w for w in workers if w.state is not WorkerState.READY]
        if dead:
            raise ConfirmError(f"{len(dead)} of the plan's workers died while starting")
        return LivePlan(pairs, workers)

    def round(self, live: LivePlan, sizes: Sequence[int] | None = None) -> tuple[float, float, list[float]]:
        """Send every instance its slice at once; (slowest compute ms, wall ms, compute ms each)."""
        sizes = [b for _, b in live.instances] if sizes is None else list(sizes)
        jobs: dict[int, int] = {}
        started = time.perf_counter()
        for index, (worker, size) in enumerate(zip(live.workers, sizes, strict=True)):
            self._job += 1
            inputs = self._input(size)
            header = {"job": self._job, "dtype": inputs.dtype.name, "shape": list(inputs.shape)}
            if not self.backend.send(worker.identity, messages.RUN, header, [memoryview(inputs).cast("B")]):
                raise ConfirmError(f"worker {worker.id} is gone")
            jobs[self._job] = index
        compute = [0.0] * len(sizes)
        deadline = time.monotonic() + RESULT_TIMEOUT_S
        while jobs:
            if time.monotonic() > deadline:
                raise ConfirmError(f"no result within {RESULT_TIMEOUT_S:.0f} s from {len(jobs)} worker(s)")
            event = self.pool.pump(1000)
            self._check_alive(live.workers)
            if event is None or event.header.get("job") not in jobs:
                continue
            index = jobs.pop(event.header["job"])
            if event.kind == "failed":
                raise ConfirmError(f"the model failed on a batch of {sizes[index]}: {event.header['message']}")
            if event.kind == "result":
                compute[index] = float(event.header["compute_ms"])
        wall = (time.perf_counter() - started) * 1000.0
        return max(compute), wall, compute

    def stop(self, live: LivePlan) -> None:
        for worker in live.workers:
            self.pool.retire(worker)
        deadline = time.monotonic() + 10.0
        while any(w.id in self.pool.workers for w in live.workers) and time.monotonic() < deadline:
            self.pool.pump(100)

    def measure(self, instances: Instances, rounds: int = 5, warmup: int = 1) -> PlanTiming:
        return self.compare({"plan": instances}, rounds, warmup)["plan"]

    def compare(self, plans: Mapping[str, Instances], rounds: int = 5, warmup: int = 1) -> dict[str, PlanTiming]:
        """Time several plans in one run, their rounds interleaved (A, B, A, B, ...).

        Every plan's workers stay alive throughout; only one plan runs at a time, so the idle ones
        cost nothing but memory.
        """
        live = {name: self.start(instances) for name, instances in plans.items()}
        samples: dict[str, list[tuple[float, float, list[float]]]] = {name: [] for name in plans}
        try:
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

    # -- cells (for adaptive profiling) ---------------------------------------------------------
    def measure_cell(self, threads: int, batch: int, warmup: int = 1, repeats: int = 3,
                     max_cell_seconds: float = 20.0) -> Cell:  # fmt: skip
        """Median compute time of `batch` inputs on one `threads`-thread worker, as CellProfiler does."""
        live = self._cell_workers.get(threads)
        if live is None or live.workers[0].state is not WorkerState.READY:
            live = self._cell_workers[threads] = self.start([(threads, batch)])
        for _ in range(warmup):
            self.round(live, [batch])
        times: list[float] = []
        started = time.monotonic()
        wanted = repeats
        while len(times) < wanted:
            times.append(self.round(live, [batch])[0])
            # A slow cell (big batch on one thread) keeps fewer repeats rather than stalling for minutes.
            if time.monotonic() - started > max_cell_seconds:
                break
            # A noisy cell earns more runs, exactly as CellProfiler does, so both profile alike.
            if len(times) == wanted and wanted < MAX_REPEATS and max(times) / min(times) > NOISY_SPREAD:
                wanted = min(MAX_REPEATS, wanted + 2)
        p90 = float(np.percentile(times, 90)) if len(times) > 1 else times[0]
        return Cell(statistics.median(times), len(times), p90)

    def close(self) -> None:
        for live in self._cell_workers.values():
            self.stop(live)
        self._cell_workers.clear()

    # -- internals ----------------------------------------------------------------------------
    def _input(self, batch: int) -> np.ndarray:
        if batch not in self._inputs:
            self._inputs[batch] = sample_inputs(self.info, batch)
        return self._inputs[batch]

    @staticmethod
    def _check_alive(workers: Sequence[WorkerHandle]) -> None:
        for worker in workers:
            if worker.state is WorkerState.DEAD:
                raise ConfirmError(f"worker {worker.id} ({worker.threads} threads) died during a measurement")


def _timing(instances: tuple[tuple[int, int], ...], runs: list[tuple[float, float, list[float]]]) -> PlanTiming:
    per_instance = tuple(statistics.median(run[2][k] for run in runs) for k in range(len(instances)))
    return PlanTiming(
        instances,
        statistics.median(run[0] for run in runs),
        statistics.median(run[1] for run in runs),
        per_instance,
        len(runs),
    )


def table_confirmation(lhat, instances: Instances, interference: float = 1.0) -> float:  # noqa: ANN001
    """Replay's stand-in for a side-by-side run: the slowest instance's L̂ from the full table,
    times an interference factor (1.0: the table is taken as the truth)."""
    values = [lhat(int(t), int(b)) for t, b in instances]
    if any(v is None for v in values):
        raise ConfirmError("the full table has no cell large enough for one of the plan's instances")
    return max(values) * interference
