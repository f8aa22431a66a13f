"""The dispatcher: splits each batch across the serving instances and gathers the answers.

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
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from packrat_daemon.fleet.pool import WorkerHandle
from packrat_daemon.ops.tallies import HOP, OwnTimes
from packrat_daemon.requests.batcher import Request
from packrat_daemon.requests.jobs import Completed, InFlightBatch, Job
from packrat_daemon.requests.splitter import Splitter
from packrat_daemon.wire.codec import DTYPES
from workers.messages import numpy_name

# A batch due to move aside while no worker was free for the next one is looked at again this much later.
ASIDE_RECHECK_S = 0.05
# Weight of the newest answer in the running mean of a slice's time from dispatch to answer (`typical_slice_s`).
TYPICAL_WEIGHT = 0.2
# Production's prediction of a slice the profile predicts nothing for (`learned_ms`): the longest of the last this many
# compute times of slices of its shape (threads, rows), its workers' warm-ups included.
LEARNED_KEEP = 8

# Sends one job ({"job", "dtype", "shape"} and the input as byte views) to a worker: Pool.run, which
# moves it through shared memory or as frames; False when the worker is gone.
Send = Callable[[WorkerHandle, dict[str, Any], list[memoryview]], bool]


class Dispatcher:
    def __init__(
        self,
        send: Send,
        splitter: Splitter,
        job_timeout_s: float,
        deadline_margin: float,
        deadline_floor_s: float,
        hedge_margin: float = math.inf,
        hedge_floor_s: float = 0.0,
        own_times: OwnTimes | None = None,
        spin_floor_s: float | None = None,
    ) -> None:
        self.send = send
        self.splitter = splitter
        self.job_timeout_s = job_timeout_s
        self.deadline_margin = deadline_margin
        self.deadline_floor_s = deadline_floor_s
        # The least time and CPU time a slice is given before a worker computing it without a pause is taken for a
        # spin (Supervisor.look; before the deadline, only that). None: deadline_floor_s (no earlier look).
        self.spin_floor_s = deadline_floor_s if spin_floor_s is None else spin_floor_s
        self.hedge_margin = hedge_margin  # math.inf: never hedge
        self.hedge_floor_s = hedge_floor_s
        # The compute times of the last LEARNED_KEEP slices of each shape (threads, rows), newest last.
        self.timed: dict[tuple[int, int], deque[float]] = {}
        self.batch: InFlightBatch | None = None  # the loop's batch: the next one starts once it is answered
        self.aside: list[InFlightBatch] = []  # batches moved aside (move_aside, run_aside), still computing
        self.parked: list[Request] = []  # requests to run alone, waiting for a worker to spare (the supervisor's)
        # The inputs the batcher holds: while none, a batch aside counts as busy (the loop wakes for its deadlines,
        # a drain waits for it). The supervisor gives the batcher's count.
        self.queued: Callable[[], int] = lambda: 0
        self.typical_slice_s = math.inf  # a running mean of the slices' times from dispatch to answer; none yet
        # Every job sent and not answered, the losers of hedges included: a worker holding one is busy.
        self.jobs: dict[int, Job] = {}
        self.late: list[Job] = []  # slices past their hedge time that wait for an idle worker
        self._next_job = 1
        # No job's or in-flight request's deadline is earlier (it may be stale-early once a job is answered:
        # the next check then finds nothing and recomputes it). Lets the loop skip the check on most wakes.
        self.next_deadline = math.inf
        self.own_times = own_times  # where each slice's trip to its worker is summed, if anywhere
        # The workers batches are split across: the reconciler's serving ones as the supervisor's last look found
        # them (every change to the pool passes through that look, so the list is not rebuilt for every batch).
        self.serving: list[WorkerHandle] = []

    def set_deadlines(
        self,
        job_timeout_s: float,
        margin: float,
        floor_s: float,
        hedge_margin: float,
        hedge_floor_s: float,
        spin_floor_s: float | None = None,
    ) -> None:
        """A reload's bounds (the arguments of __init__): slices sent from now on get them, those out keep theirs."""
        self.job_timeout_s, self.deadline_margin, self.deadline_floor_s = job_timeout_s, margin, floor_s
        self.spin_floor_s = floor_s if spin_floor_s is None else spin_floor_s
        self.hedge_margin, self.hedge_floor_s = hedge_margin, hedge_floor_s

    def learn(self, threads: int, rows: int, compute_ms: float) -> None:
        """A slice of `rows` inputs was computed on a `threads`-thread worker in `compute_ms` (a RESULT's time, or a
        worker's warm-up at start): kept for `learned_ms`."""
        if not (compute_ms > 0.0 and math.isfinite(compute_ms)):
            return
        times = self.timed.get((threads, rows))
        if times is None:
            times = self.timed[(threads, rows)] = deque(maxlen=LEARNED_KEEP)
        times.append(compute_ms)

    def learned_ms(self, threads: int, rows: int) -> float | None:
        """Production's prediction of a slice of `rows` inputs on a `threads`-thread worker, for slices the profile
        predicts nothing for: the longest of the last LEARNED_KEEP slices of that shape it timed; without one, of the
        nearest smaller slice on as many threads, scaled up in proportion to the rows (a batch costs no more per
        input than a smaller one), else of the nearest larger one (nor more in all than a larger one). None when no
        slice on as many threads was timed."""
        times = self.timed.get((threads, rows))
        if times:
            return max(times)
        smaller = max((r for t, r in self.timed if t == threads and r < rows), default=None)
        if smaller is not None:
            return max(self.timed[(threads, smaller)]) * rows / smaller
        larger = min((r for t, r in self.timed if t == threads and r > rows), default=None)
        return None if larger is None else max(self.timed[(threads, larger)])

    @property
    def busy(self) -> bool:
        """A batch is in flight: the loop's, or, while nothing is queued, one aside or a request parked."""
        return self.batch is not None or (bool(self.aside or self.parked) and not self.queued())

    @property
    def holds_work(self) -> bool:
        """Anything unanswered: the loop's batch, one aside, a request parked (a drain waits for each of them, whatever
        is queued; `busy` is what the loop waits on before the next batch)."""
        return self.batch is not None or bool(self.aside or self.parked)

    def live(self, batch: InFlightBatch) -> bool:
        """Whether `batch` is still answered: the loop's or one aside (by identity: a batch compares its fields)."""
        return batch is self.batch or any(batch is aside for aside in self.aside)

    def dispatch(self, requests: list[Request], workers: list[WorkerHandle]) -> None:
        if any(w.outstanding for w in workers):
            # A worker still computing a slice nobody waits for (a hedge's loser, an abandoned batch) would
            # take this batch's slice only after it: leave it out while the others can take the batch. With none
            # free, leave out those whose slice is late (a hang's, maybe): the others answer theirs soon.
            free = [w for w in workers if not w.outstanding]
            if not free:
                late = self._late_workers(time.monotonic())
                free = [w for w in workers if w.id not in late]
            workers = free or workers
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
        batch.aside_at = self._late_at(batch)
        self.next_deadline = min(self.next_deadline, batch.aside_at)

    def on_result(self, worker: WorkerHandle, header: dict[str, Any], payload: list[Any]) -> list[Completed]:
        job = self.jobs.pop(header["job"], None)
        if job is None:
            return []  # a late answer for a slice already re-sent elsewhere
        self._start_next(worker)
        batch = job.batch
        if batch is not self.batch and not self.live(batch):
            _unlink(job)
            return []  # of a batch already answered or given up
        twin = job.twin
        if twin is not None:
            if twin.output is not None:
                _unlink(job)
                return []  # the hedge's other copy answered first
            # The first answer wins; the other copy stays in `jobs` (its worker is busy) until it answers or
            # its deadline replaces its worker.
            _put_in_place_of(batch.jobs, twin, job)
        job.output = payload[0]  # the output array, as the pool decoded it (a copy if it came shared)
        job.compute_ms = float(header["compute_ms"])
        self.learn(worker.threads, job.rows, job.compute_ms)
        if self.own_times is not None:
            self.own_times.add(HOP, time.monotonic() - job.sent_at - job.compute_ms / 1000.0)
        took = time.monotonic() - job.sent_at
        typical = self.typical_slice_s
        self.typical_slice_s = took if typical == math.inf else typical + TYPICAL_WEIGHT * (took - typical)
        batch.unanswered -= 1
        return self._finish(batch) if batch.done() else []

    def _start_next(self, worker: WorkerHandle) -> None:
        """`worker` answered a slice: the slices it holds behind it start their clocks now. They were set at sending,
        stacked behind the answered one's deadline proper, so a spin on the next slice after a quick one was told a
        deadline late (`bench/faults.py --attack hanging_model`: after the job timeout, not at its first look)."""
        held = [job for job in self.jobs.values() if job.worker.id == worker.id]
        if not held:
            return
        now = time.monotonic()
        early = held[0].clock_from - now
        if early <= 0.0:
            return  # its clock runs already: those behind it are stacked on it, as they should be
        cpu = worker.cpu_seconds()
        head = held[0]
        cpu_early = 0.0 if cpu is None or head.cpu_at_send is None else head.cpu_limit - head.cpu_budget - cpu
        spin_early = 0.0 if cpu is None or head.cpu_at_send is None else head.spin_limit - head.spin_budget - cpu
        for job in held:
            job.clock_from -= early
            job.deadline -= early
            job.watched_at -= early
            job.hedge_at -= early
            job.cpu_limit -= max(0.0, cpu_early)
            job.spin_limit -= max(0.0, spin_early)
        self.next_deadline = min(self.next_deadline, head.deadline, head.hedge_at)

    def _late_at(self, batch: InFlightBatch) -> float:
        """When the slices of `batch`, just sent, are late: after the hedge margin times a typical slice's time (at
        least the hedge floor), and not before their hedge times (a hedge answers sooner where the model is not at
        fault). Never with hedging off, before any slice was answered or predicted, or on plans whose instances share
        cores: the next batch would run on the late slice's cores."""
        typical = self.typical_slice_s
        if typical == math.inf:  # nothing answered yet: the profile's prediction, or production's, if any
            predicted = [job.expected_ms for job in batch.jobs if job.expected_ms is not None]
            typical = max(predicted) / 1000.0 if predicted else math.inf
        if math.isinf(self.hedge_margin) or typical == math.inf or self.splitter.oversubscribed:
            return math.inf
        wait = max(self.hedge_floor_s, self.hedge_margin * typical)
        hedges = [job.hedge_at for job in batch.jobs if job.hedge_at < math.inf]
        return max([max(job.sent_at for job in batch.jobs) + wait, *hedges])

    def _late_workers(self, now: float) -> set[int]:
        """The workers holding a slice sent longer ago than the hedge margin times a typical slice's time (at least
        the hedge floor)."""
        if self.typical_slice_s == math.inf or math.isinf(self.hedge_margin):
            return set()
        wait = max(self.hedge_floor_s, self.hedge_margin * self.typical_slice_s)
        return {job.worker.id for job in self.jobs.values() if now - job.sent_at > wait}

    def move_aside(self, now: float) -> list[Completed] | None:
        """Move the loop's batch aside once its unanswered slices are late (`aside_at`) and a serving worker is free
        for the next batch: the requests whose rows are all in are answered now (returned), the others wait for
        their slices where they are. None when nothing moved."""
        batch = self.batch
        if batch is None or now < batch.aside_at:
            return None
        busy = {job.worker.id for job in self.jobs.values()}
        if not any(w.id not in busy and not w.outstanding and w.pending is None for w in self.serving):
            batch.aside_at = now + ASIDE_RECHECK_S  # every worker is busy: nothing to gain yet
            self._refresh_next_deadline()
            return None
        self.batch = None
        self.late.clear()
        self.aside.append(batch)
        batch.aside_at = math.inf
        done = sorted((job for job in batch.jobs if job.output is not None), key=lambda j: j.offset)
        completed = []
        offset = 0
        for request in batch.requests:
            end = offset + request.samples
            if not request.answered and _covered(done, offset, end):
                request.answered = True  # answered here: the batch's own end leaves it out
                rows = _gather(done, offset, request.samples)
                queue_ms = (batch.started - request.arrived) * 1000.0
                compute_ms = max(job.compute_ms for job in done if job.offset < end and offset < job.offset + job.rows)
                completed.append(Completed(request, rows, queue_ms, compute_ms, done))
            offset = end
        self._refresh_next_deadline()
        return completed

    def run_aside(self, request: Request, worker: WorkerHandle) -> None:
        """Send a request to run alone (parked) to `worker`, aside from the loop's batches."""
        batch = InFlightBatch([request], DTYPES[request.dtype], tuple(request.shape[1:]))
        if request.deadline is not None:
            batch.deadline = request.deadline
            self.next_deadline = min(self.next_deadline, batch.deadline)
        self.aside.append(batch)
        self._send_job(batch, 0, request.samples, worker)

    def hedge(
        self, now: float, workers: list[WorkerHandle], computing: Callable[[Job, float], bool] | None = None
    ) -> list[Job]:
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
                if job.output is None and job.twin is None and not (computing is not None and computing(job, now)):
                    self.late.append(job)
        self.late = [job for job in self.late if job.batch is batch and job.output is None and job.twin is None]
        if not self.late:
            return []
        busy = {job.worker.id for job in self.jobs.values()}
        idle = [w for w in workers if w.id not in busy and not w.outstanding and w.pending is None]
        copies = []
        while self.late and idle:
            job = self.late.pop(0)
            copies.append(self._send_job(batch, job.offset, job.rows, idle.pop(0), twin=job))
        return copies

    def reassign(self, lost: WorkerHandle, workers: list[WorkerHandle]) -> bool:
        """Re-send the lost worker's slices; False when no worker is left to take them. A slice whose hedge
        copy is still computing elsewhere is not re-sent: that copy is the slice now."""
        orphaned = [job for job in self.jobs.values() if job.worker.id == lost.id]
        needed = [job for job in orphaned if job.twin is None and self.live(job.batch)]
        candidates = [w for w in workers if w.id != lost.id]
        if needed and not candidates:
            return False
        for job in orphaned:
            del self.jobs[job.id]
            twin = job.twin
            if twin is not None and twin.output is None:
                twin.twin = None
                _put_in_place_of(job.batch.jobs, job, twin)
            _unlink(job)
        for k, job in enumerate(needed):
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
        """In-flight and parked requests whose timeout_ms passed: the caller answers TIMEOUT, and the batch's result
        leaves them out. Also refreshes `next_deadline`."""
        expired: list[Request] = []
        for batch in [self.batch, *self.aside] if self.batch is not None else list(self.aside):
            if batch.deadline >= now:
                continue
            late = [r for r in batch.requests if not r.answered and r.deadline is not None and r.deadline < now]
            for request in late:
                request.answered = True
            expired += late
            left = [r.deadline for r in batch.requests if not r.answered and r.deadline is not None]
            batch.deadline = min(left, default=math.inf)
            if all(r.answered for r in batch.requests):
                # Every request of it answered: the batch is cancelled, so the next one may start (a model that hangs
                # on one input stalled every client behind its batch). Its jobs stay in `jobs`: their workers are busy
                # until they answer (the result is then dropped: no live batch of theirs) or their deadline replaces
                # them, and then the slice is not re-sent (reassign: not of a live batch).
                self._drop(batch)
                batch.jobs = []  # see _finish: no cycle (each job still names its batch)
        if self.parked:
            late = [r for r in self.parked if r.deadline is not None and r.deadline < now]
            if late:
                self.parked = [r for r in self.parked if r.deadline is None or r.deadline >= now]
                expired += late
        self._refresh_next_deadline()
        return expired

    def deadline(self, worker: WorkerHandle, rows: int, now: float) -> tuple[float, float | None]:
        """(deadline, predicted ms) of a slice of `rows` sent to `worker` now: the profile's latency times
        the margin, at least the floor, at most the job timeout; after the deadlines of the slices the
        worker already holds (it runs them one after another). Where the profile predicts nothing, production's
        prediction (`learned_ms`; the second value stays None: it is not the profile's) sets it the same way;
        without either: the job timeout."""
        return self._times(worker, rows, now)[1:3]

    def _times(
        self, worker: WorkerHandle, rows: int, now: float
    ) -> tuple[float, float, float | None, float | None, float, float]:
        """(hedge time, deadline, the profile's predicted ms, production's learned ms where the profile has none, first
        look, when its clocks start) of a slice; no hedge without the profile's prediction, nor one that would come no
        earlier than the deadline. The first look is the spin floor or the margin times the prediction, whichever is
        later, and no later than the deadline. Its clocks start now, or behind the worker's slices' deadlines."""
        predicted = self.splitter.predicted_ms(worker.threads, rows)
        # What slices of this shape took here, where the profile predicts nothing. It is not hedged, as before (a copy
        # would send the rows to a second worker): it sets the deadline and the CPU budgets only.
        learned = None if predicted is not None else self.learned_ms(worker.threads, rows)
        expected = predicted if predicted is not None else learned
        allowed = self.job_timeout_s
        hedge_after = math.inf
        first_look = allowed
        if expected is not None:
            allowed = min(allowed, max(self.deadline_floor_s, self.deadline_margin * expected / 1000.0))
            first_look = min(allowed, max(self.spin_floor_s, self.deadline_margin * expected / 1000.0))
        # Instances that share cores run slower than their profiled cells by a factor nobody predicts, and a hedge
        # would only put more work on the same cores: such plans are never hedged.
        if predicted is not None and not self.splitter.oversubscribed:
            hedge_after = max(self.hedge_floor_s, self.hedge_margin * predicted / 1000.0)
        held = [max(job.deadline, job.watched_at) for job in self.jobs.values() if job.worker.id == worker.id]
        start = max([now, *held])
        hedge_at = start + hedge_after if hedge_after < allowed else math.inf
        return hedge_at, start + allowed, predicted, learned, start + first_look, start

    def fail(self, job_id: object) -> tuple[list[Request], list[Request]] | None:
        """A worker's FAILED for job `job_id`. None when that job is not of a batch in flight (the loop's or one
        aside): a late failure of an earlier batch's slice (re-sent elsewhere, or a hedge's other copy), which is
        ignored (it used to abort whatever batch was in flight then). Else the batch is given up and its unanswered
        requests are returned as (suspects, others): those with rows in the failed slice, and the rest, whose rows
        it never held."""
        job = self.jobs.pop(job_id, None) if isinstance(job_id, int) else None
        if job is None or not self.live(job.batch):
            return None
        batch = job.batch
        suspects, others = _sort(batch, job)
        self._drop(batch)
        for other in [j for j in self.jobs.values() if j.batch is batch]:
            del self.jobs[other.id]
            _unlink(other)
        _unlink(job)
        batch.jobs = []  # see _finish: no cycle may keep the request buffers alive
        self._refresh_next_deadline()
        return suspects, others

    def hang(self, job: Job) -> Hang | None:
        """A slice of the batch in flight that the supervisor found hung (past its deadline, its worker's CPU time
        stopped or past the slice's CPU budget, or the job timeout passed) on a worker that is not stopped: the model
        may hang on one of its inputs, so the slice is never re-sent as it is (that hung a second worker, then a
        third, for ever). The batch is given up (the next one may start) and its unanswered requests sorted: those
        with rows in the slice that had already been run alone are the hang's (the caller answers them with an
        error), the other suspects run again each alone, and the rest batched again as usual. Its jobs stay in `jobs`
        (their workers are busy until they answer, the answer then dropped, or are replaced). None when `job` is not
        of the batch in flight (a hedge's loser, a slice of a batch given up): its worker is the caller's to judge."""
        batch = job.batch
        if job.output is not None or not self.live(batch):
            return None
        suspects, others = _sort(batch, job)
        hung = [request for request in suspects if request.alone]
        again = [request for request in suspects if not request.alone]
        for request in again:
            request.alone = True
        self._drop(batch)
        # Its worker is replaced: the answer is no longer waited for, and a model that spins on an input would keep
        # the worker, and every batch sent to it, until the job timeout. A hung request may also hang every other
        # worker that holds its rows: a hedge's copy, its first batch's slice.
        workers = {job.worker.id: job.worker}
        workers.update((j.worker.id, j.worker) for j in self.jobs.values() if any(_holds(j, r) for r in hung))
        batch.jobs = []  # see _finish: no cycle (each job still names its batch: `_holds` reads its requests)
        self._refresh_next_deadline()
        return Hang(hung, others + again, list(workers.values()))

    def abandon(self) -> list[Request]:
        """Give up every batch in flight, aside too, and the parked requests (no worker left, or the daemon stops);
        the caller answers or re-queues the unanswered requests."""
        batches = [self.batch, *self.aside] if self.batch is not None else self.aside
        requests = [r for batch in batches for r in batch.requests if not r.answered] + self.parked
        for batch in batches:
            batch.jobs.clear()  # see _finish: no cycle may keep the request buffers alive
        self.batch, self.aside, self.parked = None, [], []
        self.late.clear()
        for job in self.jobs.values():
            _unlink(job)
        self.jobs.clear()
        return requests

    # -- internals --------------------------------------------------------------------------
    def _drop(self, batch: InFlightBatch) -> None:
        """`batch` is answered or given up: neither the loop's nor aside any more."""
        if batch is self.batch:
            self.batch = None
            self.late.clear()
        else:
            self.aside = [aside for aside in self.aside if aside is not batch]

    def _refresh_next_deadline(self) -> None:
        batches = [self.batch, *self.aside] if self.batch is not None else self.aside
        self.next_deadline = min(
            [min(job.deadline, job.hedge_at) for job in self.jobs.values()]
            + [batch.deadline for batch in batches]
            + ([self.batch.aside_at] if self.batch is not None else [])
            + [request.deadline for request in self.parked if request.deadline is not None],
            default=math.inf,
        )

    def _send_job(
        self, batch: InFlightBatch, offset: int, rows: int, worker: WorkerHandle, twin: Job | None = None
    ) -> Job:
        """Send rows [offset, offset+rows) of `batch` to `worker`; `twin`: the slice this job hedges."""
        now = time.monotonic()
        hedge_at, deadline, predicted, learned, first_look, clock_from = self._times(worker, rows, now)
        if len(batch.requests) == 1 and batch.requests[0].alone:
            # A suspect of a failure or a hang, run alone to tell it from its neighbours: a hedge's copy on a second
            # worker would only spread what it does to the first.
            hedge_at = math.inf
        job = Job(self._next_job, batch, offset, rows, worker, now, first_look, predicted, hedge_at, twin)
        job.watched_at, job.learned_ms, job.clock_from = deadline, learned, clock_from
        self._next_job += 1
        expected = job.expected_ms
        cpu = None if expected is None else worker.cpu_seconds()
        if cpu is not None and expected is not None:
            # A slice needs at most its threads' CPU for its predicted time, however loaded the machine (a loaded
            # machine slows the wall clock, not the work): a worker that used `margin` times that, still with no
            # answer, spins (Supervisor.look). After the budgets of the slices it already holds, as the deadline.
            # Two budgets: the spin floor's for a worker that computes without a pause, the deadline floor's for any.
            needs = self.deadline_margin * worker.threads * expected / 1000.0
            job.cpu_at_send = cpu
            job.cpu_budget = max(self.deadline_floor_s, needs)
            job.spin_budget = min(job.cpu_budget, max(self.spin_floor_s, needs))
            mine = [j for j in self.jobs.values() if j.worker.id == worker.id]
            job.cpu_limit = max([cpu, *(j.cpu_limit for j in mine)]) + job.cpu_budget
            job.spin_limit = max([cpu, *(j.spin_limit for j in mine)]) + job.spin_budget
        self.next_deadline = min(self.next_deadline, deadline, hedge_at)
        header = {"job": job.id, "dtype": numpy_name(batch.dtype), "shape": [rows, *batch.sample_shape]}
        self.jobs[job.id] = job
        if twin is None:
            batch.jobs.append(job)
            batch.unanswered += 1
        else:  # the copy is not hedged again; it stands for the slice only once it answers first
            twin.twin = job
            job.hedge_at = math.inf
        if not self.send(worker, header, _row_frames(batch, offset, rows)):
            job.deadline = self.next_deadline = 0.0  # unreachable worker: the next check re-routes it at once
        return job

    def _finish(self, batch: InFlightBatch) -> list[Completed]:
        self._drop(batch)
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
                rows = _gather(jobs, offset, request.samples)
                queue_ms = (batch.started - request.arrived) * 1000.0
                completed.append(Completed(request, rows, queue_ms, compute_ms, jobs))
            offset += request.samples
        return completed


@dataclass
class Hang:
    """What `Dispatcher.hang` made of a slice past its deadline."""

    hung: list[Request]  # run alone already and hung again: the caller answers them with an error, never re-sends
    again: list[Request]  # to queue again at the head: the batch's other requests, then each suspect alone
    replace: list[WorkerHandle]  # the slice's worker and those holding a hung request's rows: nobody waits for them


def _sort(batch: InFlightBatch, job: Job) -> tuple[list[Request], list[Request]]:
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


def _covered(jobs: list[Job], low: int, high: int) -> bool:
    """Whether the slices `jobs` (one per slice: they do not overlap) hold every row in [low, high)."""
    return sum(max(0, min(high, j.offset + j.rows) - max(low, j.offset)) for j in jobs) == high - low


def _holds(job: Job, request: Request) -> bool:
    """Whether `job`'s slice holds rows of `request` (by identity: the same request may be in a later batch too)."""
    start = 0
    for queued in job.batch.requests:
        end = start + queued.samples
        if queued is request:
            return start < job.offset + job.rows and job.offset < end
        start = end
    return False


def _unlink(job: Job) -> None:
    """A job leaves for good: part it from its hedge's other copy. The two point at each other, a cycle that kept
    their batch's requests, and the inbox slabs their inputs are in, alive until the cyclic collector ran."""
    twin, job.twin = job.twin, None
    if twin is not None and twin.twin is job:
        twin.twin = None


def _put_in_place_of(jobs: list[Job], old: Job, new: Job) -> None:
    """Replace `old` by `new` in a batch's jobs (by identity: a Job compares its fields)."""
    for k, job in enumerate(jobs):
        if job is old:
            jobs[k] = new
            return


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
