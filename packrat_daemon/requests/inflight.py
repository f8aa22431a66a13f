"""The state of work in flight and the transitions of it that send nothing: which slices are out (`jobs`, each
worker's oldest first), the loop's batch (`batch`), the batches moved aside (`aside`), the requests parked to run
alone (`parked`), the slices late for a hedge (`late`), and the earliest deadline among them (`next_deadline`).

`dispatcher.Dispatcher` is an `InFlight`: it adds what sends (the splitting, hedges, re-sends) and turns the workers'
events into `Actions`, what the supervisor does for them. Nothing else in the daemon writes this state.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from packrat_daemon.requests import slices
from packrat_daemon.requests.jobs import Completed, InFlightBatch, Job
from packrat_daemon.wire.codec import ErrorCode

if TYPE_CHECKING:
    from packrat_daemon.fleet.pool import WorkerHandle
    from packrat_daemon.requests.batcher import Request

log = logging.getLogger("packrat.daemon")

# A batch due to move aside while no worker was free for the next one is looked at again this much later.
ASIDE_RECHECK_S = 0.05


@dataclass
class Actions:
    """What the supervisor does for an event, in this order: answer with errors, answer with results, queue requests
    again at the head of the queue, replace workers (each then lost: `Dispatcher.lost`, and its actions)."""

    errors: list[tuple[Request, ErrorCode, str]] = field(default_factory=list)
    results: list[Completed] = field(default_factory=list)
    requeue: list[Request] = field(default_factory=list)
    replace: list[WorkerHandle] = field(default_factory=list)


@dataclass
class Hang:
    """What `InFlight.hang` made of a slice past its deadline."""

    hung: list[Request]  # run alone already and hung again: the caller answers them with an error, never re-sends
    again: list[Request]  # to queue again at the head: the batch's other requests, then each suspect alone
    replace: list[WorkerHandle]  # the slice's worker and those holding a hung request's rows: nobody waits for them


def on_free_cores(workers: Sequence[WorkerHandle], busy: Collection[int], held: set[int]) -> list[WorkerHandle]:
    """Those of `workers` not busy (`busy`: their ids) and on none of the `held` cores: the next batch's, while
    slices of a batch aside compute (the daemon's `InFlight.free_for_next`, the simulation's `free_workers`)."""
    return [w for w in workers if w.id not in busy and held.isdisjoint(w.cores)]


def holds_the_queue(now: float, started: float, ends: list[float]) -> bool:
    """Whether a batch part answered at `now`, started at `started`, would hold the requests queued behind it for
    longer than it has run: its slices still out are predicted back at `ends`. Slices cut to even costs end close
    together (waiting for them keeps the whole pool for the next batch); a long row alone ends far later."""
    return bool(ends) and max(ends) - now > now - started


class InFlight:
    def __init__(self, queued: Callable[[], int]) -> None:
        self.batch: InFlightBatch | None = None  # the loop's batch: the next one starts once it is answered
        self.aside: list[InFlightBatch] = []  # batches moved aside (move_aside, run_aside), still computing
        self.parked: list[Request] = []  # requests to run alone, waiting for a worker to spare (start_parked)
        # The inputs the batcher holds: while none, a batch aside counts as busy (the loop wakes for its deadlines,
        # a drain waits for it).
        self.queued = queued
        # Every job sent and not answered, the losers of hedges included: a worker holding one is busy.
        self.jobs: dict[int, Job] = {}
        self.late: list[Job] = []  # slices past their hedge time that wait for an idle worker
        # No job's or in-flight request's deadline is earlier (it may be stale-early once a job is answered:
        # the next check then finds nothing and recomputes it). Lets the loop skip the check on most wakes.
        self.next_deadline = math.inf
        # The workers batches are split across: the reconciler's serving ones as the supervisor's last look found
        # them (every change to the pool passes through that look, so the list is not rebuilt for every batch).
        self.serving: list[WorkerHandle] = []

    # -- queries ------------------------------------------------------------------------------------------
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

    def busy_workers(self) -> set[int]:
        """The ids of the workers holding a slice (an answer to wait for, or a loser's to drop)."""
        return {job.worker.id for job in self.jobs.values()}

    def idle(self, workers: list[WorkerHandle]) -> list[WorkerHandle]:
        """Those of `workers` holding nothing and not being reconfigured."""
        busy = self.busy_workers()
        return [w for w in workers if w.id not in busy and not w.outstanding and w.pending is None]

    def idle_apart(self, workers: list[WorkerHandle]) -> list[WorkerHandle]:
        """Those of `workers` idle (`idle`) on cores that no worker holding a slice computes on. A plan's spare layouts
        share cores (one 2-thread worker, two 1-thread ones on the same 2 cores): a batch moved aside onto the idle
        ones, or a hedge's copy, ran beside the busy worker on its cores, slowed both, made the next batch late too,
        and the queue grew (ResNet-50 on 2 cores at concurrency 8: a p99 of 2.6 s, half the throughput)."""
        held = self.held_cores(workers)
        return [w for w in self.idle(workers) if held.isdisjoint(w.cores)]

    def held_cores(self, workers: list[WorkerHandle]) -> set[int]:
        """The cores of the workers computing a slice: of a batch in flight, or one nobody waits for (outstanding)."""
        held = {core for job in self.jobs.values() for core in job.worker.cores}
        held.update(core for w in workers if w.outstanding for core in w.cores)
        return held

    def held_by(self, worker: WorkerHandle) -> list[Job]:
        """The slices `worker` holds, oldest first (it runs them one after another)."""
        return [job for job in self.jobs.values() if job.worker.id == worker.id]

    def late_workers(self, now: float, wait: float) -> set[int]:
        """The workers holding a slice sent longer than `wait` ago."""
        return {job.worker.id for job in self.jobs.values() if now - job.sent_at > wait}

    def overdue(self, now: float) -> list[Job]:
        """The jobs past their deadline: each worker's oldest only (its others wait behind it)."""
        late: dict[int, Job] = {}
        for job in self.jobs.values():
            if job.deadline < now and job.worker.id not in late:
                late[job.worker.id] = job
        return list(late.values())

    # -- transitions ----------------------------------------------------------------------------------------
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
                self.drop(batch)
                batch.jobs = []  # see slices.completions: no cycle (each job still names its batch)
        if self.parked:
            late = [r for r in self.parked if r.deadline is not None and r.deadline < now]
            if late:
                self.parked = [r for r in self.parked if r.deadline is None or r.deadline >= now]
                expired += late
        self.refresh_next_deadline()
        return expired

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
        suspects, others = slices.sort(batch, job)
        self.drop(batch)
        for other in [j for j in self.jobs.values() if j.batch is batch]:
            del self.jobs[other.id]
            slices.unlink(other)
        slices.unlink(job)
        batch.jobs = []  # see slices.completions: no cycle may keep the request buffers alive
        self.refresh_next_deadline()
        return suspects, others

    def hang(self, job: Job) -> Hang | None:
        """A slice of the batch in flight that a look found hung (fleet.verdicts: past its deadline, its worker's CPU
        time stopped or past the slice's CPU budget, or the job timeout passed) on a worker that is not stopped: the
        model may hang on one of its inputs, so the slice is never re-sent as it is (that hung a second worker, then
        a third, for ever). The batch is given up (the next one may start) and its unanswered requests sorted: those
        with rows in the slice that had already been run alone are the hang's (the caller answers them with an
        error), the other suspects run again each alone, and the rest batched again as usual. Its jobs stay in `jobs`
        (their workers are busy until they answer, the answer then dropped, or are replaced). None when `job` is not
        of the batch in flight (a hedge's loser, a slice of a batch given up): its worker is the caller's to judge."""
        batch = job.batch
        if job.output is not None or not self.live(batch):
            return None
        suspects, others = slices.sort(batch, job)
        hung = [request for request in suspects if request.alone]
        again = [request for request in suspects if not request.alone]
        for request in again:
            request.alone = True
        self.drop(batch)
        # Its worker is replaced: the answer is no longer waited for, and a model that spins on an input would keep
        # the worker, and every batch sent to it, until the job timeout. A hung request may also hang every other
        # worker that holds its rows: a hedge's copy, its first batch's slice.
        workers = {job.worker.id: job.worker}
        workers.update((j.worker.id, j.worker) for j in self.jobs.values() if any(slices.holds(j, r) for r in hung))
        batch.jobs = []  # see slices.completions: no cycle (each job still names its batch: `holds` reads its requests)
        self.refresh_next_deadline()
        return Hang(hung, others + again, list(workers.values()))

    def failed(self, worker: WorkerHandle, header: dict[str, object]) -> Actions:
        """A worker's FAILED: the model raised. One bad input must not fail other clients' requests: the requests
        whose rows were in that slice are run again each alone, the rest batched again as usual; a request that
        fails alone (or was its batch's only one) is answered INTERNAL."""
        message = header.get("message", "the model failed")
        given_up = self.fail(header.get("job"))
        if given_up is None:
            log.warning("worker %d failed job %s, of a batch already answered or given up: ignored (%s)",
                        worker.id, header.get("job"), message)  # fmt: skip
            return Actions()
        suspects, others = given_up
        log.error("worker %d failed a batch (%d request(s) in its slice): %s", worker.id, len(suspects), message)
        actions, again = Actions(), []
        for request in suspects:
            if request.alone or len(suspects) + len(others) == 1:  # it failed on its own: it is the bad input
                actions.errors.append((request, ErrorCode.INTERNAL, f"the model failed on this request: {message}"))
            else:
                request.alone = True
                again.append(request)
        actions.requeue = others + again  # the innocents first: their rows were never in the failed slice
        return actions

    def hung(self, job: Job, hang: Hang, now: float, why: str) -> Actions:
        """A slice of a batch in flight is hung (`hang`): the hang's requests are answered, the others queued again;
        the slice's worker and those holding a hung request's rows are replaced."""
        took = f"{(now - job.sent_at) * 1000.0:.0f} ms"
        predicted = slices.prediction(job)
        log.warning(
            "worker %d (pid %s) has not answered its %d rows in %s (%s) and %s: the batch is given up, %d request(s) "
            "answered as hung (they hung alone too), %d queued again (the slice's each alone), %d worker(s) replaced",
            job.worker.id, job.worker.pid, job.rows, took, predicted, why, len(hang.hung), len(hang.again),
            len(hang.replace),
        )  # fmt: skip
        message = f"the model hung on this request (no answer in {took}, {predicted}, run alone; {why}): not retried"
        errors = [(request, ErrorCode.INTERNAL, message) for request in hang.hung]
        return Actions(errors=errors, requeue=hang.again, replace=hang.replace)

    def move_aside(self, now: float) -> list[Completed] | None:
        """Move the loop's batch aside once its unanswered slices are late (`aside_at`) and a serving worker is free
        for the next batch: the requests whose rows are all in are answered now (returned), the others wait for
        their slices where they are. None when nothing moved."""
        batch = self.batch
        if batch is None or now < batch.aside_at:
            return None
        if not self.idle_apart(self.serving):
            batch.aside_at = now + ASIDE_RECHECK_S  # no worker free on free cores: nothing to gain yet
            self.refresh_next_deadline()
            return None
        return self.set_aside()

    def part_answered(self, batch: InFlightBatch, shared_cores: bool, now: float) -> list[Completed]:
        """A slice of `batch` is answered, others are not: the loop's batch moves aside now (`set_aside`, its
        answered requests returned) if it was cut by cost and its rows still out are predicted back later than the
        batch has run so far (`holds_the_queue`). A cut by cost balances the slices' predicted costs, except that a
        long row cannot be divided: then the others answer early and the requests queued behind the batch would wait
        for its longest slice with workers free. Not where the plan's instances share cores (the next batch would
        run on the busy slice's)."""
        ragged = batch.ragged
        if batch is not self.batch or ragged is None or not ragged.cut_by_cost or shared_cores:
            return []
        out = [job for job in batch.jobs if job.output is None]
        if any(job.expected_ms is None for job in out):
            return []
        ends = [job.sent_at + (job.expected_ms or 0.0) / 1000.0 for job in out]
        return self.set_aside() if holds_the_queue(now, batch.started, ends) else []

    def free_for_next(
        self, workers: list[WorkerHandle], now: float, late_after: float, shared_cores: bool
    ) -> list[WorkerHandle]:
        """The workers the next batch goes to while some hold slices: a worker still computing one (of a batch
        aside, a hedge's loser, an abandoned batch) would take the batch's slice only after it, so it is left out
        while others can take the batch, and so are those on its cores (a plan's spare layouts are), unless the
        plan's instances share cores by design (`shared_cores`). With none free, those whose slice is late are left
        out (a hang's, maybe): the others answer theirs soon."""
        held = set() if shared_cores else self.held_cores(workers)
        free = on_free_cores(workers, {w.id for w in workers if w.outstanding}, held)
        if not free:
            late = self.late_workers(now, late_after)
            free = [w for w in workers if w.id not in late]
        return free or workers

    def set_aside(self) -> list[Completed]:
        """Move the loop's batch aside now: the requests whose rows are all in are answered (returned), the others
        wait for their slices where they are, and the next batch may start on the free workers."""
        batch = self.batch
        assert batch is not None
        self.batch = None
        self.late.clear()
        self.aside.append(batch)
        batch.aside_at = math.inf
        completed = slices.answered_in_part(batch)
        self.refresh_next_deadline()
        return completed

    def _move_aside(self, now: float) -> list[Completed]:
        """`move_aside`, logged."""
        batch = self.batch
        completed = self.move_aside(now)
        if completed is None or batch is None:
            return []
        waiting = [job for job in batch.jobs if job.output is None]
        log.info(
            "a batch's slice(s) on worker(s) %s are late (%.0f ms): the batch moves aside, %d request(s) answered now, "
            "the next batch starts on the free workers",
            [job.worker.id for job in waiting], (now - batch.started) * 1000.0, len(completed),
        )  # fmt: skip
        return completed

    def abandon(self) -> list[Request]:
        """Give up every batch in flight, aside too, and the parked requests (no worker left, or the daemon stops);
        the caller answers or re-queues the unanswered requests."""
        batches = [self.batch, *self.aside] if self.batch is not None else self.aside
        requests = [r for batch in batches for r in batch.requests if not r.answered] + self.parked
        for batch in batches:
            batch.jobs.clear()  # see slices.completions: no cycle may keep the request buffers alive
        self.batch, self.aside, self.parked = None, [], []
        self.late.clear()
        for job in self.jobs.values():
            slices.unlink(job)
        self.jobs.clear()
        return requests

    def let_go(self, jobs: list[Job]) -> None:
        """`jobs` (a lost worker's) leave: each hedge copy still computing elsewhere takes its place in its batch."""
        for job in jobs:
            del self.jobs[job.id]
            twin = job.twin
            if twin is not None and twin.output is None:
                twin.twin = None
                slices.put_in_place_of(job.batch.jobs, job, twin)
            slices.unlink(job)

    def drop(self, batch: InFlightBatch) -> None:
        """`batch` is answered or given up: neither the loop's nor aside any more."""
        if batch is self.batch:
            self.batch = None
            self.late.clear()
        else:
            self.aside = [aside for aside in self.aside if aside is not batch]

    def refresh_next_deadline(self) -> None:
        batches = [self.batch, *self.aside] if self.batch is not None else self.aside
        self.next_deadline = min(
            [min(job.deadline, job.hedge_at) for job in self.jobs.values()]
            + [batch.deadline for batch in batches]
            + ([self.batch.aside_at] if self.batch is not None else [])
            + [request.deadline for request in self.parked if request.deadline is not None],
            default=math.inf,
        )
