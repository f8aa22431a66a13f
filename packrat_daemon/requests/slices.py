"""Functions of a batch's slices, which hold no state of their own: how a batch in flight is formed and split
(sorted and cut by cost for a model of a free axis, `requests.ragged`), the rows a slice sends (views of the clients'
buffers), the answers gathered from them, which requests a slice holds, and the links between a hedge's copies that
must be cut when one leaves. The dispatcher (`requests.dispatcher`) owns the slices and calls these.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from packrat_daemon.requests.batcher import Request
from packrat_daemon.requests.jobs import Completed, InFlightBatch, Job
from packrat_daemon.requests.ragged import PAD_BATCH, Ragged
from packrat_daemon.wire.codec import DTYPES

if TYPE_CHECKING:
    from packrat_daemon.fleet.pool import WorkerHandle
    from packrat_daemon.requests.splitter import Splitter


def sort(batch: InFlightBatch, job: Job) -> tuple[list[Request], list[Request]]:
    """The batch's unanswered requests: (those with rows in `job`'s slice, the others)."""
    low, high = job.offset, job.offset + job.rows
    suspects: list[Request] = []
    others: list[Request] = []
    start = 0
    for request in batch.requests:
        end = start + request.samples
        if not request.answered:
            (suspects if start < high and low < end else others).append(request)
        start = end
    return suspects, others


def covered(jobs: list[Job], low: int, high: int) -> bool:
    """Whether the slices `jobs` (one per slice: they do not overlap) hold every row in [low, high)."""
    return sum(max(0, min(high, j.offset + j.rows) - max(low, j.offset)) for j in jobs) == high - low


def holds(job: Job, request: Request) -> bool:
    """Whether `job`'s slice holds rows of `request` (by identity: the same request may be in a later batch too)."""
    start = 0
    for queued in job.batch.requests:
        end = start + queued.samples
        if queued is request:
            return start < job.offset + job.rows and job.offset < end
        start = end
    return False


def prediction(job: Job) -> str:
    """A slice's prediction, as a log line says it."""
    if job.predicted_ms is not None:
        return f"predicted {job.predicted_ms:.0f} ms"
    if job.learned_ms is not None:
        return f"{job.learned_ms:.0f} ms in production"
    return "no prediction"


def unlink(job: Job) -> None:
    """A job leaves for good: part it from its hedge's other copy. The two point at each other, a cycle that kept
    their batch's requests, and the inbox slabs their inputs are in, alive until the cyclic collector ran."""
    twin, job.twin = job.twin, None
    if twin is not None and twin.twin is job:
        twin.twin = None


def put_in_place_of(jobs: list[Job], old: Job, new: Job) -> None:
    """Replace `old` by `new` in a batch's jobs (by identity: a Job compares its fields)."""
    for k, job in enumerate(jobs):
        if job is old:
            jobs[k] = new
            return


def row_frames(batch: InFlightBatch, offset: int, rows: int) -> list[memoryview]:
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


def to_send(batch: InFlightBatch, offset: int, rows: int) -> tuple[list[memoryview], tuple[int, ...], int]:
    """What a slice of rows [offset, offset+rows) sends: its frames, their per-sample shape and the padded length
    (0 for a model of fixed shape, whose rows go as views of the clients' buffers)."""
    ragged = batch.ragged
    if ragged is None:
        return row_frames(batch, offset, rows), batch.sample_shape, 0
    array, length = ragged.rows(batch.requests, offset, rows)
    return [np.ascontiguousarray(array).reshape(-1).view(np.uint8).data], array.shape[1:], length


def gather(jobs: list[Job], offset: int, rows: int, length: int = 0) -> np.ndarray:
    """A request's rows [offset, offset+rows) of the slices' outputs; `length`: its own, along the model's free axis
    (each slice answered at its padded length is cut back to it)."""
    if len(jobs) == 1 and offset == 0 and rows == jobs[0].rows and jobs[0].length == length:
        assert jobs[0].output is not None
        return jobs[0].output  # one request on one worker: its output as it came
    pieces = []
    for job in jobs:
        low, high = max(offset, job.offset), min(offset + rows, job.offset + job.rows)
        if low < high:
            assert job.output is not None
            piece = job.output[low - job.offset : high - job.offset]
            ragged = job.batch.ragged
            pieces.append(piece if ragged is None else ragged.cut(piece, job.length, length))
    return pieces[0] if len(pieces) == 1 else np.concatenate(pieces)


def completions(batch: InFlightBatch) -> list[Completed]:
    """Every slice of `batch` is in: its unanswered requests' answers. Its jobs are let go."""
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
        if not request.answered:  # answered TIMEOUT while in flight, or when moved aside: answered once
            rows = gather(jobs, offset, request.samples, request.length)
            queue_ms = (batch.started - request.arrived) * 1000.0
            completed.append(Completed(request, rows, queue_ms, compute_ms, jobs))
        offset += request.samples
    return completed


def answered_in_part(batch: InFlightBatch) -> list[Completed]:
    """The answers of the requests of `batch` whose rows are all in, though some slices are not: each is marked
    answered (the batch's own end leaves it out)."""
    done = sorted((job for job in batch.jobs if job.output is not None), key=lambda j: j.offset)
    completed = []
    offset = 0
    for request in batch.requests:
        end = offset + request.samples
        if not request.answered and covered(done, offset, end):
            request.answered = True
            rows = gather(done, offset, request.samples, request.length)
            queue_ms = (batch.started - request.arrived) * 1000.0
            compute_ms = max(job.compute_ms for job in done if job.offset < end and offset < job.offset + job.rows)
            completed.append(Completed(request, rows, queue_ms, compute_ms, done))
        offset = end
    return completed


def in_flight(requests: list[Request], ragged: Ragged | None) -> InFlightBatch:
    """A batch in flight of `requests`: for a model of a free axis, sorted by length (each slice then pads to its own
    longest, and the longest rows go to the instances of most threads), except in the mode PAD_BATCH."""
    first = requests[0]
    dtype, sample_shape = DTYPES[first.dtype], tuple(first.shape[1:])
    if ragged is None:
        return InFlightBatch(requests, dtype, sample_shape)
    ordered = requests if ragged.mode == PAD_BATCH else sorted(requests, key=lambda request: request.length)
    return InFlightBatch(ordered, dtype, sample_shape, ragged=ragged)


def split(splitter: Splitter, workers: list[WorkerHandle], batch: InFlightBatch) -> list[tuple[WorkerHandle, int]]:
    """Which workers take `batch`, and how many rows each: the splitter's exact split, or for a model of a free axis,
    its rows cut by predicted cost across the workers that split chose (by count in the mode PAD_BATCH)."""
    if batch.ragged is None or batch.ragged.mode == PAD_BATCH:
        return splitter.choose(workers, batch.rows)
    lengths = [request.length for request in batch.requests for _ in range(request.samples)]
    return splitter.choose_by_cost(workers, lengths, batch.ragged.longest)


def at_reference(job: Job) -> bool:
    """Whether a slice's time is a profile cell's: a fixed-shape model's, or one padded to the model's longest (the
    length the profile is measured at)."""
    return job.batch.ragged is None or job.length == job.batch.ragged.longest
