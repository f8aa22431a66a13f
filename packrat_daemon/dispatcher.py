"""The dispatcher: splits each batch across the serving instances and gathers the answers.

Every batch is split exactly for the live pool (policies.solver.split_batch on the instances' own
profile rows). Each worker's rows are views of the clients' own buffers, which the pool sends as
frames or copies once into the worker's shared memory. A worker that dies or times out has its slice
sent to another instance, so every request ends in a result or an explicit error.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from packrat_daemon.batcher import Request
from packrat_daemon.pool import WorkerHandle
from packrat_daemon.wire.codec import DTYPES
from policies.planning.layouts import Split, fastest, split_on
from policies.planning.profile import Profile
from workers.messages import numpy_name

# Sends one job ({"job", "dtype", "shape"} and the input as byte views) to a worker: Pool.run, which
# moves it through shared memory or as frames; False when the worker is gone.
Send = Callable[[WorkerHandle, dict[str, Any], list[memoryview]], bool]


@dataclass
class Job:
    id: int
    batch: InFlightBatch
    offset: int  # first row of the batch this job covers
    rows: int
    worker: WorkerHandle
    sent_at: float
    deadline: float  # monotonic time past which the worker is presumed hung (see Dispatcher.deadline)
    predicted_ms: float | None  # the profile's latency for this slice; None when it has none
    output: np.ndarray | None = None
    compute_ms: float = 0.0


@dataclass
class InFlightBatch:
    requests: list[Request]
    dtype: np.dtype
    sample_shape: tuple[int, ...]
    started: float = field(default_factory=time.monotonic)
    jobs: list[Job] = field(default_factory=list)
    unanswered: int = 0  # jobs sent and not answered yet
    deadline: float = math.inf  # the earliest of its requests' deadlines (timeout_ms bounds the whole request)

    @property
    def rows(self) -> int:
        return sum(r.samples for r in self.requests)

    def done(self) -> bool:
        return self.unanswered == 0


@dataclass(slots=True)  # not frozen: one is built per request answered
class Completed:
    request: Request
    output: np.ndarray
    queue_ms: float
    compute_ms: float
    instances: int  # how many workers shared the batch
    jobs: Sequence[Job] = ()  # the batch's slices (worker, rows, predicted and measured ms): the request log, metrics


class Splitter:
    """Which live workers take a batch, and how many rows each: exact, cached, per batch size.

    A plan may keep several layouts of the same cores warm (say one 2-thread worker and two 1-thread
    workers); each batch goes to the complete layout that policies.planning.layouts.fastest picks,
    with the packrat policy's `min_split_gain` applied per batch.
    """

    def __init__(
        self,
        profile: Profile | None,
        mode: str,
        layouts: Sequence[Sequence[tuple[int, tuple[int, ...]]]] = (),
        oversubscribed: bool = False,
        min_split_gain: float = 0.0,
    ) -> None:
        self.profile = profile
        self.mode = mode
        self.layouts = [list(layout) for layout in layouts]
        self.oversubscribed = oversubscribed
        self.min_split_gain = min_split_gain
        self._cache: dict[tuple[tuple[int, ...], int], Split] = {}
        # choose()'s answers for the last `workers` sequence, by batch size. The daemon passes a new list
        # whenever its pool changes (and never edits one in place), so the list's identity is the key.
        self._chosen_for: Sequence[WorkerHandle] | None = None
        self._chosen: dict[int, list[tuple[WorkerHandle, int]]] = {}

    def choose(self, workers: Sequence[WorkerHandle], batch: int) -> list[tuple[WorkerHandle, int]]:
        """The workers that take a batch of `batch` inputs, with their rows. `workers` must be a new
        sequence whenever the pool changes: answers are remembered per sequence object."""
        if workers is self._chosen_for:
            known = self._chosen.get(batch)
            if known is not None:
                return known
        else:
            self._chosen_for, self._chosen = workers, {}
        chosen = self._choose(workers, batch)
        self._chosen[batch] = chosen
        return chosen

    def _choose(self, workers: Sequence[WorkerHandle], batch: int) -> list[tuple[WorkerHandle, int]]:
        candidates = [members for layout in self.layouts if (members := _match(layout, workers))]
        if not candidates:
            # Mid-reconfiguration no layout may be complete: use ready workers whose cores do not overlap.
            candidates = [list(workers) if self.oversubscribed else _disjoint(workers)]
        splits = [self._split(tuple(w.threads for w in members), batch) for members in candidates]
        chosen = fastest(splits, self.min_split_gain)
        members, sizes = candidates[chosen], splits[chosen].rows
        return [(worker, rows) for worker, rows in zip(members, sizes, strict=True) if rows]

    def _split(self, threads: tuple[int, ...], batch: int) -> Split:
        key = (threads, batch)
        if key not in self._cache:
            self._cache[key] = self._compute(list(threads), batch)
        return self._cache[key]

    def predicted_ms(self, threads: int, rows: int) -> float | None:
        """The profile's latency of `rows` inputs on a `threads`-thread worker (the smallest profiled batch
        that holds them); None without a profile or a row for those threads."""
        return None if self.profile is None else self.profile.lhat(threads, rows)

    def _compute(self, threads: list[int], batch: int) -> Split:
        if self.mode == "exact" and self.profile is not None:
            split = split_on(self.profile, threads, batch)
            if split is not None:
                return split
            # The profile does not cover this pool or batch: fall back to proportional.
        weights = threads if self.mode == "exact" else [1] * len(threads)
        return Split(float("inf"), _proportional(weights, batch))


def _match(layout: Sequence[tuple[int, tuple[int, ...]]], workers: Sequence[WorkerHandle]) -> list[WorkerHandle]:
    """Ready workers filling every slot of `layout`, or [] when one is missing."""
    free = [w for w in workers if w.pending is None]
    members = []
    for threads, cores in layout:
        found = next((w for w in free if w.threads == threads and w.cores == cores), None)
        if found is None:
            return []
        free.remove(found)
        members.append(found)
    return members


def _disjoint(workers: Sequence[WorkerHandle]) -> list[WorkerHandle]:
    taken: set[int] = set()
    chosen = []
    for worker in sorted(workers, key=lambda w: (-w.threads, w.id)):
        if taken.isdisjoint(worker.cores):
            chosen.append(worker)
            taken.update(worker.cores)
    return chosen


def _proportional(weights: Sequence[int], batch: int) -> list[int]:
    total = sum(weights)
    sizes = [batch * w // total for w in weights]
    for k in range(batch - sum(sizes)):
        sizes[k % len(sizes)] += 1
    return sizes


class Dispatcher:
    def __init__(
        self,
        send: Send,
        splitter: Splitter,
        job_timeout_s: float,
        deadline_margin: float,
        deadline_floor_s: float,
    ) -> None:
        self.send = send
        self.splitter = splitter
        self.job_timeout_s = job_timeout_s
        self.deadline_margin = deadline_margin
        self.deadline_floor_s = deadline_floor_s
        self.batch: InFlightBatch | None = None
        self.jobs: dict[int, Job] = {}
        self._next_job = 1
        # No job's or in-flight request's deadline is earlier (it may be stale-early once a job is answered:
        # the next check then finds nothing and recomputes it). Lets the loop skip the check on most wakes.
        self.next_deadline = math.inf

    @property
    def busy(self) -> bool:
        return self.batch is not None

    def dispatch(self, requests: list[Request], workers: list[WorkerHandle]) -> None:
        first = requests[0]
        batch = InFlightBatch(requests, DTYPES[first.dtype], tuple(first.shape[1:]))
        deadlines = [r.deadline for r in requests if r.deadline is not None]
        if deadlines:
            batch.deadline = min(deadlines)
            self.next_deadline = min(self.next_deadline, batch.deadline)
        self.batch = batch
        offset = 0
        for worker, rows in self.splitter.choose(workers, batch.rows):
            self._send_job(batch, offset, rows, worker)
            offset += rows

    def on_result(self, worker: WorkerHandle, header: dict[str, Any], payload: list[Any]) -> list[Completed]:
        job = self.jobs.pop(header["job"], None)
        if job is None or job.batch is not self.batch:
            return []  # a late answer for a slice already re-sent elsewhere
        job.output = payload[0]  # the output array, as the pool decoded it (a copy if it came shared)
        job.compute_ms = float(header["compute_ms"])
        self.batch.unanswered -= 1
        return self._finish() if self.batch.done() else []

    def reassign(self, lost: WorkerHandle, workers: list[WorkerHandle]) -> bool:
        """Re-send the lost worker's slices; False when no worker is left to take them."""
        orphaned = [job for job in self.jobs.values() if job.worker.id == lost.id]
        candidates = [w for w in workers if w.id != lost.id]
        if orphaned and not candidates:
            return False
        for k, job in enumerate(orphaned):
            del self.jobs[job.id]
            job.batch.jobs.remove(job)
            job.batch.unanswered -= 1
            self._send_job(job.batch, job.offset, job.rows, candidates[k % len(candidates)])
        return True

    def overdue(self, now: float) -> list[Job]:
        """The jobs past their deadline: each worker's oldest only (its others wait behind it)."""
        late: dict[int, Job] = {}
        for job in self.jobs.values():
            if job.deadline < now and job.worker.id not in late:
                late[job.worker.id] = job
        return list(late.values())

    def expire(self, now: float) -> list[Request]:
        """In-flight requests whose timeout_ms passed: the caller answers TIMEOUT, and the batch's result
        leaves them out. Also refreshes `next_deadline`."""
        expired: list[Request] = []
        batch = self.batch
        if batch is not None and batch.deadline < now:
            expired = [r for r in batch.requests if not r.answered and r.deadline is not None and r.deadline < now]
            for request in expired:
                request.answered = True
            left = [r.deadline for r in batch.requests if not r.answered and r.deadline is not None]
            batch.deadline = min(left, default=math.inf)
        self.next_deadline = min(
            [job.deadline for job in self.jobs.values()] + ([batch.deadline] if batch is not None else []),
            default=math.inf,
        )
        return expired

    def deadline(self, worker: WorkerHandle, rows: int, now: float) -> tuple[float, float | None]:
        """(deadline, predicted ms) of a slice of `rows` sent to `worker` now: the profile's latency times
        the margin, at least the floor, at most the job timeout; after the deadlines of the slices the
        worker already holds (it runs them one after another). Without a prediction: the job timeout."""
        predicted = self.splitter.predicted_ms(worker.threads, rows)
        allowed = self.job_timeout_s
        if predicted is not None:
            allowed = min(allowed, max(self.deadline_floor_s, self.deadline_margin * predicted / 1000.0))
        start = max([now] + [job.deadline for job in self.jobs.values() if job.worker.id == worker.id])
        return start + allowed, predicted

    def abandon(self) -> list[Request]:
        """Give up the batch in flight (no worker left); the caller answers its unanswered requests with errors."""
        requests = [r for r in self.batch.requests if not r.answered] if self.batch else []
        if self.batch is not None:
            self.batch.jobs.clear()  # see _finish: no cycle may keep the request buffers alive
        self.batch = None
        self.jobs.clear()
        return requests

    # -- internals --------------------------------------------------------------------------
    def _send_job(self, batch: InFlightBatch, offset: int, rows: int, worker: WorkerHandle) -> None:
        now = time.monotonic()
        deadline, predicted = self.deadline(worker, rows, now)
        job = Job(self._next_job, batch, offset, rows, worker, now, deadline, predicted)
        self._next_job += 1
        self.next_deadline = min(self.next_deadline, deadline)
        header = {"job": job.id, "dtype": numpy_name(batch.dtype), "shape": [rows, *batch.sample_shape]}
        self.jobs[job.id] = job
        batch.jobs.append(job)
        batch.unanswered += 1
        if not self.send(worker, header, _row_frames(batch, offset, rows)):
            job.deadline = self.next_deadline = 0.0  # unreachable worker: the next check re-routes it at once

    def _finish(self) -> list[Completed]:
        batch = self.batch
        assert batch is not None
        self.batch = None
        jobs = batch.jobs if len(batch.jobs) == 1 else sorted(batch.jobs, key=lambda j: j.offset)
        # Jobs and their batch point at each other; left alone, that cycle would keep the clients'
        # input buffers (megabytes each) alive until the cyclic garbage collector runs, and every new
        # request would land in fresh memory and page-fault all of it in (measured: 2 369 faults, the
        # whole 9.6 MB, per ResNet-50 batch of 16).
        batch.jobs = []
        compute_ms = jobs[0].compute_ms if len(jobs) == 1 else max(job.compute_ms for job in jobs)
        completed = []
        offset = 0
        for request in batch.requests:
            if not request.answered:  # answered TIMEOUT while in flight: its rows go nowhere
                rows = _gather(jobs, offset, request.samples)
                queue_ms = (batch.started - request.arrived) * 1000.0
                completed.append(Completed(request, rows, queue_ms, compute_ms, len(jobs), jobs))
            offset += request.samples
        return completed


def _row_frames(batch: InFlightBatch, offset: int, rows: int) -> list[memoryview]:
    """Frames covering rows [offset, offset+rows) of the batch, as views of the request buffers."""
    requests = batch.requests
    if len(requests) == 1 and offset == 0 and rows == requests[0].samples:
        whole = requests[0].payload
        if type(whole) is memoryview and whole.format == "B" and whole.ndim == 1:
            return [whole]  # the one request, whole: its buffer as received
    row_bytes = batch.dtype.itemsize * math.prod(batch.sample_shape)
    frames = []
    start = 0
    for request in batch.requests:
        end = start + request.samples
        low, high = max(offset, start), min(offset + rows, end)
        if low < high:
            view = memoryview(request.payload).cast("B")
            frames.append(view[(low - start) * row_bytes : (high - start) * row_bytes])
        start = end
    return frames


def _gather(jobs: list[Job], offset: int, rows: int) -> np.ndarray:
    if len(jobs) == 1 and offset == 0 and rows == jobs[0].rows:
        assert jobs[0].output is not None
        return jobs[0].output  # one request on one worker: its output as it came
    pieces = []
    for job in jobs:
        low, high = max(offset, job.offset), min(offset + rows, job.offset + job.rows)
        if low < high:
            assert job.output is not None
            pieces.append(job.output[low - job.offset : high - job.offset])
    return pieces[0] if len(pieces) == 1 else np.concatenate(pieces)
