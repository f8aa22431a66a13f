"""The dispatcher: the one owner of work in flight. It splits each batch across the serving instances, owns every
slice sent (`jobs`: sent, hedged, late, hung), the batches in flight (`batch`, `aside`) and the requests waiting to
run alone (`parked`), and answers each event with what to do (`Actions`): the supervisor pumps the workers' events
into it and applies what it returns; of its state it reads only what the loop asks (`busy`, `serving`,
`next_deadline`), and writes none.

Every batch is split exactly for the live pool (policies.solver.split_batch on the instances' own
profile rows). Each worker's rows are views of the clients' own buffers, which the pool sends as
frames or copies once into the worker's shared memory. A worker that dies or times out has its slice
sent to another instance, so every request ends in a result or an explicit error. A slice that is
merely late is hedged first: sent to an idle worker too, the first answer used, and nobody killed.

One batch is the loop's at a time (`batch`: the next one starts once it is answered). A batch whose last slices
are late while a worker is free for the next one is moved aside (`move_aside`): the requests whose rows are all
in are answered at once, the rest wait for their slices on their own workers, and the next batch starts on the
free ones. A request run alone to tell a bad input from its neighbours runs aside from the start (`run_aside`),
on a worker the next batches can spare: a model that hangs on an input then holds one worker, not every client.

The events: `start` (the loop's batch), `on_result`, `failed`, `lost`, `on_deadline`, `looked_at` (a look's reading
of an overdue slice's worker, judged by `fleet.verdicts`), `pool_looked`. The slices' clocks come from `timing`,
their rows and answers from `slices`, and the transitions that send nothing from `inflight.InFlight`, which this
class is.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from typing import Any

from packrat_daemon.fleet import verdicts
from packrat_daemon.fleet.pool import WorkerHandle
from packrat_daemon.ops.tallies import HOP, OwnTimes
from packrat_daemon.requests import slices
from packrat_daemon.requests.batcher import Request
from packrat_daemon.requests.inflight import Actions, InFlight
from packrat_daemon.requests.jobs import Completed, InFlightBatch, Job
from packrat_daemon.requests.ragged import Ragged
from packrat_daemon.requests.splitter import Splitter
from packrat_daemon.requests.timing import Clocks, Deadlines, Timing, restart_clocks
from packrat_daemon.wire.codec import ErrorCode
from workers.messages import numpy_name
from workers.worker import HEARTBEAT_SECONDS

# Actions too: the supervisor, in fleet/ below requests/, may import this module and no other of requests/' new ones.
__all__ = ["Actions", "Dispatcher"]

log = logging.getLogger("packrat.daemon")

# A hedge goes only to an idle worker heard from within this (a heartbeat late at most): not to a hung one.
HEDGE_FRESH_S = 2 * HEARTBEAT_SECONDS

# Sends one job ({"job", "dtype", "shape"} and the input as byte views) to a worker: Pool.run, which
# moves it through shared memory or as frames; False when the worker is gone.
Send = Callable[[WorkerHandle, dict[str, Any], list[memoryview]], bool]
# Whether a worker computes the late slice it was sent at a time, its CPU time then (None: unread), at a time
# (fleet.proc.computing, which reads /proc for it).
Computing = Callable[[WorkerHandle, float, float | None, float], bool]


def _none() -> int:
    return 0


class Dispatcher(InFlight):
    def __init__(
        self,
        send: Send,
        splitter: Splitter,
        deadlines: Deadlines | float,
        *bounds: float,
        own_times: OwnTimes | None = None,
        spin_floor_s: float | None = None,
        queued: Callable[[], int] = _none,
        pool_size: Callable[[], int] = _none,
        computing: Computing | None = None,
        ragged: Ragged | None = None,
    ) -> None:
        """`deadlines`: the slices' bounds (a job timeout, then the other `bounds` and `spin_floor_s` in Deadlines'
        order, is the older spelling). `queued`: the inputs the batcher holds (while none, a batch aside counts as
        busy: the loop wakes for its deadlines, a drain waits for it). `pool_size`: the pool's live workers, starting
        ones too (with one, a request to run alone is the loop's batch). `computing`: whether a late slice's worker is
        computing it (such a slice is not hedged); None: never."""
        super().__init__(queued)
        self.send = send
        self.splitter = splitter
        self.timing = Timing(Deadlines.of(deadlines, *bounds, spin_floor_s=spin_floor_s))
        self.pool_size = pool_size
        self.computing = computing
        self._next_job = 1
        self.own_times = own_times  # where each slice's trip to its worker is summed, if anywhere
        self.ragged = ragged  # a model of a free axis: batches sorted by length, sliced by cost, padded per slice

    # -- the deadlines, one value -------------------------------------------------------------------
    @property
    def deadlines(self) -> Deadlines:
        return self.timing.deadlines

    def set_deadlines(self, deadlines: Deadlines | float, *bounds: float, spin_floor_s: float | None = None) -> None:
        """A reload's bounds: slices sent from now on get them, those out keep theirs. (A job timeout and the other
        bounds, as reload.py passes them, stand for a Deadlines.)"""
        self.timing.deadlines = Deadlines.of(deadlines, *bounds, spin_floor_s=spin_floor_s)

    # Each bound by its older name (test_reload reads them).
    job_timeout_s = property(lambda self: self.deadlines.job_timeout_s)
    deadline_margin = property(lambda self: self.deadlines.margin)
    deadline_floor_s = property(lambda self: self.deadlines.floor_s)
    spin_floor_s = property(lambda self: self.deadlines.spin_s)
    hedge_margin = property(lambda self: self.deadlines.hedge_margin)
    hedge_floor_s = property(lambda self: self.deadlines.hedge_floor_s)

    def learn(self, threads: int, rows: int, compute_ms: float) -> None:
        self.timing.learn(threads, rows, compute_ms)

    def learned_ms(self, threads: int, rows: int) -> float | None:
        return self.timing.learned_ms(threads, rows)

    def warmed_up(self, worker: WorkerHandle, times: Any) -> None:
        """A worker is ready, with its warm-up's times ([rows, ms] each): production's first prediction of slices the
        profile predicts nothing for, before any is answered (a model may hang on the first batch it is sent)."""
        for timed in times or ():
            try:
                self.learn(worker.threads, int(timed[0]), float(timed[1]))
            except (TypeError, ValueError, IndexError):
                continue

    # -- the loop's batches ----------------------------------------------------------------------------
    def start(self, batch: list[Request]) -> None:
        """Send the loop's batch to the serving workers; a request to run alone (a suspect of a failure or a hang)
        is parked instead, to run aside on a worker the next batches can spare (start_parked), unless the pool
        has only one worker."""
        if len(batch) == 1 and batch[0].alone and self.pool_size() > 1:
            self.parked.append(batch[0])
            self.start_parked()
            return
        self.dispatch(batch, self.serving)

    def start_parked(self) -> None:
        """Run each parked request on an idle serving worker while another serving worker, not running a batch
        aside, is left to the loop's batches, or while no batch waits or runs: a request that hangs the model then
        holds one worker, not every client. With one worker in the pool there is nothing to spare, and they run
        on it in turn."""
        if not self.parked:
            return
        idle = self.idle(self.serving)
        while self.parked and idle:
            worker = idle[0]
            aside = {job.worker.id for batch in self.aside for job in batch.jobs}
            kept = [w for w in self.serving if w.id not in aside and w.id != worker.id]
            if not kept and self.pool_size() > 1 and (self.queued() or self.batch is not None):
                return  # the next batches' only worker: wait for another (starting, or answering a batch aside)
            idle.pop(0)
            request = self.parked.pop(0)
            log.info("request %s (%d inputs) runs alone on worker %d, aside from the batches", request.request_id,
                     request.samples, worker.id)  # fmt: skip
            self.run_aside(request, worker)

    def dispatch(self, requests: list[Request], workers: list[WorkerHandle]) -> None:
        if any(w.outstanding for w in workers):
            late_after, shared = self.timing.late_after(), self.splitter.oversubscribed
            workers = self.free_for_next(workers, time.monotonic(), late_after, shared)
        batch = slices.in_flight(requests, self.ragged)
        deadlines = [r.deadline for r in requests if r.deadline is not None]
        if deadlines:
            batch.deadline = min(deadlines)
            self.next_deadline = min(self.next_deadline, batch.deadline)
        self.batch = batch
        offset = 0
        for worker, rows in slices.split(self.splitter, workers, batch):
            self._send_job(batch, offset, rows, worker)
            offset += rows
        batch.aside_at = self.timing.late_at(batch, not self.splitter.oversubscribed)
        self.next_deadline = min(self.next_deadline, batch.aside_at)

    def run_aside(self, request: Request, worker: WorkerHandle) -> None:
        """Send a request to run alone (parked) to `worker`, aside from the loop's batches."""
        batch = slices.in_flight([request], self.ragged)
        if request.deadline is not None:
            batch.deadline = request.deadline
            self.next_deadline = min(self.next_deadline, batch.deadline)
        self.aside.append(batch)
        self._send_job(batch, 0, request.samples, worker)

    def profile_rows(self, header: dict[str, Any]) -> int | None:
        """A RESULT's rows as a profile cell (asked before `on_result`); None: padded to another length than its."""
        job = self.jobs.get(header["job"])
        return int(header["batch"]) if job is None or slices.at_reference(job) else None

    # -- the workers' events -----------------------------------------------------------------------------
    def on_result(self, worker: WorkerHandle, header: dict[str, Any], payload: list[Any]) -> list[Completed]:
        """A worker's RESULT: the requests it completes, to answer (then `retry_late`: the worker may be idle)."""
        job = self.jobs.pop(header["job"], None)
        if job is None:
            return []  # a late answer for a slice already re-sent elsewhere
        # The slices its worker holds behind it start their clocks now (timing.restart_clocks).
        moved = restart_clocks(self.held_by(worker), time.monotonic(), worker.cpu_seconds)
        if moved is not None:
            self.next_deadline = min(self.next_deadline, moved)
        batch = job.batch
        if batch is not self.batch and not self.live(batch):
            slices.unlink(job)
            return []  # of a batch already answered or given up
        twin = job.twin
        if twin is not None:
            if twin.output is not None:
                slices.unlink(job)
                return []  # the hedge's other copy answered first
            # The first answer wins; the other copy stays in `jobs` (its worker is busy) until it answers or
            # its deadline replaces its worker.
            slices.put_in_place_of(batch.jobs, twin, job)
        job.output = payload[0]  # the output array, as the pool decoded it (a copy if it came shared)
        job.compute_ms = float(header["compute_ms"])
        if slices.at_reference(job):  # production's table is of one length: the profile's
            self.timing.learn(worker.threads, job.rows, job.compute_ms)
        if self.own_times is not None:
            self.own_times.add(HOP, time.monotonic() - job.sent_at - job.compute_ms / 1000.0)
        self.timing.answered(time.monotonic() - job.sent_at)
        batch.unanswered -= 1
        if not batch.done():
            return self.part_answered(batch, self.splitter.oversubscribed, time.monotonic())
        self.drop(batch)
        return slices.completions(batch)

    def lost(self, worker: WorkerHandle, candidates: list[WorkerHandle]) -> Actions:
        """`worker` is gone or replaced (also when no batch is in flight: it may hold a hedge's losing copy, which is
        dropped): its slices go to the `candidates`. With none left to take them (the others died too, or their
        replacements are still starting) every batch goes back to the head of the queue and waits for the
        replacements, once: a batch that loses its workers twice may be what kills them, and is answered INTERNAL."""
        if self.reassign(worker, candidates):
            return Actions()
        actions = Actions()
        for request in self.abandon():
            if request.retried:
                actions.errors.append(
                    (request, ErrorCode.INTERNAL, "every worker died while serving this batch, twice")
                )
            else:
                request.retried = True
                actions.requeue.append(request)
        return actions

    def reassign(self, lost: WorkerHandle, workers: list[WorkerHandle]) -> bool:
        """Re-send the lost worker's slices; False when no worker is left to take them. A slice whose hedge
        copy is still computing elsewhere is not re-sent: that copy is the slice now."""
        orphaned = [job for job in self.jobs.values() if job.worker.id == lost.id]
        needed = [job for job in orphaned if job.twin is None and self.live(job.batch)]
        candidates = [w for w in workers if w.id != lost.id]
        if needed and not candidates:
            return False
        self.let_go(orphaned)
        for k, job in enumerate(needed):
            job.batch.jobs.remove(job)
            job.batch.unanswered -= 1
            self._send_job(job.batch, job.offset, job.rows, candidates[k % len(candidates)])
        return True

    # -- deadlines and looks ---------------------------------------------------------------------------------
    def on_deadline(self, now: float) -> Actions:
        """A deadline of work in flight passed: a slice past its hedge time is sent to an idle worker too;
        `timeout_ms` bounds the whole request, so one whose batch is still computing is answered now; the loop's
        batch moves aside if its slices are late; a slice past its deadline is for the next look (`overdue`)."""
        self.hedge_due(now)
        message = "the request's timeout passed while it was computed"
        errors = [(request, ErrorCode.TIMEOUT, message) for request in self.expire(now)]
        return Actions(errors=errors, results=self._move_aside(now))

    def looked_at(self, job: Job, reading: verdicts.Reading) -> Actions:
        """A look read `reading` of the worker of `job`, an overdue slice: only slow, it is looked at again later;
        hung, its batch is given up (`hang`), or, a stopped worker's or a slice of no batch in flight, its worker
        replaced and the slice sent elsewhere."""
        overdue = verdicts.Slice(job.sent_at, job.watched_at, job.worker.threads, job.cpu_at_send, job.cpu_limit,
                                 job.cpu_budget, job.spin_limit, job.spin_budget)  # fmt: skip
        verdict = verdicts.judge(overdue, reading, job.looked or verdicts.Looked(), self.deadlines.job_timeout_s)
        job.looked = verdict.looked
        now, worker = reading.at, job.worker
        if verdict.why is None:
            if verdict.first_past_deadline:
                log.info(
                    "worker %d has not answered its %d rows in %.0f ms; replaced only once its CPU time stops or "
                    "passes the slice's CPU budget",
                    worker.id, job.rows, (now - job.sent_at) * 1000.0,
                )  # fmt: skip
            job.deadline = verdict.next_look
            self.next_deadline = min(self.next_deadline, job.deadline)
            return Actions()
        hang = None if reading.stopped else self.hang(job)
        if hang is not None:  # a stopped worker is not its input's doing: its slice is re-sent
            return self.hung(job, hang, now, verdict.why)
        log.warning(
            "worker %d (pid %s, %d threads) has not answered its %d rows in %.0f ms (%s) and %s: presumed hung, "
            "replacing it and sending the rows to another worker",
            worker.id, worker.pid, worker.threads, job.rows, (now - job.sent_at) * 1000.0,
            slices.prediction(job), verdict.why,
        )  # fmt: skip
        return Actions(replace=[worker])

    def pool_looked(self, serving: list[WorkerHandle], now: float) -> Actions:
        """The supervisor's look found `serving` (what batches are split across from now on): a late slice or a late
        batch may have the free worker it waited for."""
        self.serving = serving
        self.retry_late(now)
        return Actions(results=self._move_aside(now))

    def retry_late(self, now: float) -> None:
        """A worker may have become idle: a late slice waiting for one is hedged on it."""
        if self.late:
            self.hedge_due(now)

    def hedge_due(self, now: float) -> None:
        """Hedge the slices of the loop's batch past their hedge time on the idle serving workers heard from lately."""
        fresh = [worker for worker in self.serving if now - worker.last_seen <= HEDGE_FRESH_S]
        for copy in self.hedge(now, fresh, self.computing):
            late = copy.twin
            assert late is not None and late.predicted_ms is not None  # only a predicted slice is hedged
            log.info(
                "worker %d (pid %s) has not answered its %d rows in %.0f ms (predicted %.0f ms): also sent to "
                "worker %d; the first answer is used",
                late.worker.id, late.worker.pid, late.rows, (now - late.sent_at) * 1000.0, late.predicted_ms,
                copy.worker.id,
            )  # fmt: skip

    def hedge(self, now: float, workers: list[WorkerHandle], computing: Computing | None = None) -> list[Job]:
        """Send each slice of the batch in flight that is past its hedge time to an idle worker as well, and
        return the copies sent. A slice with no idle worker to take it waits in `late` for the next one. A slice
        whose worker is `computing` it is not hedged: a copy would only compute it again, and spread a hang on its
        input to a second worker; its batch moves aside instead (move_aside), leaving the idle worker to the next."""
        batch = self.batch
        if batch is None:
            self.late.clear()
            return []
        for job in batch.jobs:
            if job.hedge_at <= now:
                job.hedge_at = math.inf  # hedged once at most
                if job.output is None and job.twin is None and not self._computing(job, now, computing):
                    self.late.append(job)
        self.late = [job for job in self.late if job.batch is batch and job.output is None and job.twin is None]
        if not self.late:
            return []
        idle = self.idle_apart(workers)  # a copy on a busy worker's cores would slow the slice it hedges
        copies = []
        while self.late and idle:
            job = self.late.pop(0)
            copies.append(self._send_job(batch, job.offset, job.rows, idle.pop(0), twin=job))
        return copies

    @staticmethod
    def _computing(job: Job, now: float, computing: Computing | None) -> bool:
        return computing is not None and computing(job.worker, job.sent_at, job.cpu_at_send, now)

    def deadline(self, worker: WorkerHandle, rows: int, now: float) -> tuple[float, float | None]:
        """(deadline, predicted ms) of a slice of `rows` sent to `worker` now (Timing.clocks); production's
        prediction, where the profile has none, sets it the same way, but the second value stays None: it is not
        the profile's."""
        clocks = self._clocks(worker, rows, now)
        return clocks.deadline, clocks.predicted

    # -- internals --------------------------------------------------------------------------
    def _clocks(self, worker: WorkerHandle, rows: int, now: float, length: int = 0) -> Clocks:
        reference = 0 if self.ragged is None else self.ragged.longest
        predicted = self.splitter.predicted_ms(worker.threads, rows, length, reference)
        held = self.held_by(worker)
        return self.timing.clocks(worker, rows, now, predicted, held, not self.splitter.oversubscribed)

    def _send_job(
        self, batch: InFlightBatch, offset: int, rows: int, worker: WorkerHandle, twin: Job | None = None
    ) -> Job:
        """Send rows [offset, offset+rows) of `batch` to `worker`; `twin`: the slice this job hedges."""
        now = time.monotonic()
        frames, sample_shape, length = slices.to_send(batch, offset, rows)
        hedge_at, deadline, predicted, learned, first_look, clock_from = self._clocks(worker, rows, now, length)
        if len(batch.requests) == 1 and batch.requests[0].alone:
            # A suspect of a failure or a hang, run alone to tell it from its neighbours: a hedge's copy on a second
            # worker would only spread what it does to the first.
            hedge_at = math.inf
        job = Job(self._next_job, batch, offset, rows, worker, now, first_look, predicted, hedge_at, twin)
        job.watched_at, job.learned_ms, job.clock_from, job.length = deadline, learned, clock_from, length
        self._next_job += 1
        cpu = None if job.expected_ms is None else worker.cpu_seconds()
        if cpu is not None:
            self.timing.budget(job, cpu, self.held_by(worker))
        self.next_deadline = min(self.next_deadline, deadline, hedge_at)
        header = {"job": job.id, "dtype": numpy_name(batch.dtype), "shape": [rows, *sample_shape]}
        self.jobs[job.id] = job
        if twin is None:
            batch.jobs.append(job)
            batch.unanswered += 1
        else:  # the copy is not hedged again; it stands for the slice only once it answers first
            twin.twin = job
            job.hedge_at = math.inf
        if not self.send(worker, header, frames):
            job.deadline = self.next_deadline = 0.0  # unreachable worker: the next check re-routes it at once
        return job
