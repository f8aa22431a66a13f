"""The workers' side of the daemon's loop: what the workers and the template send (results, failures,
exits), and the periodic look for workers that are overdue, hung or gone (gunicorn's arbiter calls
these reap and murder; the reconciler then forks replacements).

`pump` is on the request path (each result is answered from here), so it stays flat; `look` runs
every RECONCILE_INTERVAL_S, or at once after the pool or the plan changed. To the loop core the supervisor
is the daemon's `loop.Workers`. Its answers go to `Replies` (the frontend), and a batch that lost every
worker goes back to the queue through `requeue` (the batcher's): both are given at construction.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import psutil

from packrat_daemon.adapt.production import ProductionProfile
from packrat_daemon.fleet.pool import PoolEvent, WorkerHandle
from packrat_daemon.fleet.reconciler import Reconciler
from packrat_daemon.ops.metrics import Metrics
from packrat_daemon.requests.batcher import Request
from packrat_daemon.requests.dispatcher import Dispatcher, Hang
from packrat_daemon.requests.frontend import MAX_READS_PER_WAKE
from packrat_daemon.requests.jobs import Completed, Job
from packrat_daemon.wire.codec import ErrorCode
from packrat_daemon.wire.errors import ConfigError
from workers.worker import HEARTBEAT_SECONDS

log = logging.getLogger("packrat.daemon")

RECONCILE_INTERVAL_S = 0.1  # job timeouts are seconds long, and the loop wakes twice per request
# An idle worker heartbeats every HEARTBEAT_SECONDS, even on a busy machine: three missed, it is hung. Longer,
# and a worker stopped while idle goes unnoticed until a second fault finds no healthy worker to take over.
HEARTBEAT_TIMEOUT_S = 3 * HEARTBEAT_SECONDS
# A hedge goes only to an idle worker heard from within this (a heartbeat late at most): not to a hung one.
HEDGE_FRESH_S = 2 * HEARTBEAT_SECONDS
# A worker past its slice's deadline (wall-clock time: margin x the prediction) may only be slow: a machine busy
# with other work stretches the wall clock. Replacing it would add a fork and a warm-up to the wait (on a one-worker
# plan, twice over, until every worker "died"), and give up its batch: a request slow twice alone would be answered
# as hung. So past the deadline it is looked at again every PROGRESS_LOOK_S and hung only when
# - its CPU time passed the slice's CPU budget (Job.cpu_limit: margin x the CPU its threads would use in the
#   predicted time, and what its threads' siblings waited, below): computing that long without an answer is a spin;
# - its CPU time advanced less than MIN_PROGRESS_CPU_S since the last look while none of its threads waited for a
#   CPU (runnable, or in uninterruptible sleep): a sleeping, deadlocked or stopped worker; or
# - the job timeout passed since the slice was sent, whatever its CPU time (the ceiling).
# Earlier, from the spin floor (Dispatcher.spin_floor_s; Job.deadline until Job.watched_at), looked at every
# SPIN_LOOK_S, one rule alone: between two looks a thread of the worker was on a CPU or waiting for one throughout
# (SPIN_SHARE of the time: it never slept, however loaded the machine) and its CPU time passed the slice's spin budget
# (Job.spin_limit, and the siblings' waits): it spins. A worker that sleeps between bursts (waiting on something, or
# a stand-in for a slow one) is left to the rules above.
# A loaded machine stretches the work's CPU time too: the threads of an intra-op pool spin at its barriers while a
# sibling waits for a CPU, so beside busy neighbours a slice's CPU time grows with the wall clock, by several times,
# and a margin alone no longer tells a spin from a pool sharing its cores. So each look adds `sibling_waits` to both
# budgets (per thread, at most the time its siblings waited for a CPU; before the first look, in the same share of
# the CPU time), and a pool of more than one thread is judged from its second look. A thread that spins alone (a
# hang in the model's Python, its siblings asleep) is judged as before; a pool whose threads all spin (a hang inside
# a parallel region) on a machine that keeps them waiting is left to the ceiling.
PROGRESS_LOOK_S = 0.2
SPIN_SHARE = 0.9
SPIN_LOOK_S = 0.1  # a spin is told at the first look past its budget, so looks before the deadline come this often
# A late slice whose worker used at least this share of a CPU since it was sent, or has a thread waiting for one, is
# computing it: not hedged (see Dispatcher.hedge). A stopped or blocked worker uses none and waits for none.
HEDGE_CPU_SHARE = 0.1
MIN_PROGRESS_CPU_S = 0.01


def waiting_for_cpu(pid: int | None) -> bool:
    """True while a thread of the process is runnable or in uninterruptible sleep (a page fault, a disk read): it
    would advance given a CPU. A sleeping, blocked or stopped process has none."""
    if pid is None:
        return False
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return False
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/stat", "rb") as stat:
                state = stat.read().rsplit(b")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state in (b"R", b"D"):
            return True
    return False


def run_seconds(pid: int | None) -> float | None:
    """The time the process's threads have spent on a CPU, to the nanosecond (/proc/<pid>/task/*/schedstat); None
    where it cannot be read. /proc/<pid>/stat's CPU times are sampled at each timer tick: a thread that computes in
    bursts shorter than a tick between sleeps can show none for a long time, and would look stopped."""
    stats = schedstats(pid)
    return None if stats is None else sum(run for run, _ in stats.values())


def schedstats(pid: int | None) -> dict[str, tuple[float, float]] | None:
    """Each thread's (time on a CPU, time waiting for one) in seconds, to the nanosecond, by thread id
    (/proc/<pid>/task/*/schedstat); None where the process cannot be read."""
    if pid is None:
        return None
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    stats = {}
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/schedstat", "rb") as schedstat:
                run, waited = schedstat.read().split()[:2]
            stats[task] = (int(run) / 1e9, int(waited) / 1e9)
        except (OSError, ValueError):
            continue  # a thread that has just exited
    return stats


@dataclass
class Looked:
    """What the supervisor's looks read of one overdue slice's worker."""

    progress: float | None = None  # its run_seconds (or CPU time) at the last look past the deadline proper
    stats: tuple[float, dict[str, tuple[float, float]]] | None = None  # (when, schedstats) at the last look: a spin's
    cpu_at_first: float | None = None  # its CPU seconds at the first look that read its threads
    waited: float = 0.0  # sibling_waits summed over the looks since


def sibling_waits(earlier: dict[str, tuple[float, float]], stats: dict[str, tuple[float, float]]) -> float:
    """The CPU time, between two schedstats readings, that a pool's threads may have spent waiting at a barrier for
    siblings that waited for a CPU: for each thread, its time on a CPU, at most the time the others waited for one.
    0 for a single busy thread whose siblings sleep; on a machine shared with busy neighbours, up to all of it."""
    ran = {task: run - earlier[task][0] for task, (run, _) in stats.items() if task in earlier}
    waits = {task: waited - earlier[task][1] for task, (_, waited) in stats.items() if task in earlier}
    total_wait = sum(waits.values())
    return sum(min(ran[task], total_wait - waits[task]) for task in ran)


def _budget(budget: float, waited: float) -> str:
    extra = f", plus {waited:.2f} s its threads' siblings waited for a CPU" if waited >= 0.005 else ""
    return f"{budget:.2f} s of CPU{extra}"


def never_paused(
    before: tuple[float, dict[str, tuple[float, float]]], now: float, stats: dict[str, tuple[float, float]]
) -> bool:
    """Whether, since `before` (a look's time and schedstats), a thread was on a CPU or waiting for one for at least
    SPIN_SHARE of the time: it computed without a pause, however loaded the machine."""
    then, earlier = before
    elapsed = now - then
    for task, (run, waited) in stats.items():
        old = earlier.get(task)
        if old is not None and elapsed > 0 and (run + waited) - (old[0] + old[1]) >= SPIN_SHARE * elapsed:
            return True
    return False


def stopped(pid: int | None) -> bool:
    """True for a process stopped by a signal or a tracer (SIGSTOP, a debugger): hung, but not by its input."""
    try:
        return pid is not None and psutil.Process(pid).status() in (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP)
    except psutil.Error:
        return False


def computing(job: Job, now: float) -> bool:
    """Whether the worker of a late slice is computing it: it used at least HEDGE_CPU_SHARE of a CPU since the slice
    was sent, or a thread of it waits for a CPU now. A stopped or blocked worker is not (a hedge elsewhere answers
    sooner); one that cannot be read is taken as not. One starved of CPU on a loaded machine is: it may be spinning on
    its input, and a copy would hang the idle worker too (bench/faults.py --attack hanging_model saw it)."""
    cpu, sent = job.worker.cpu_seconds(), job.cpu_at_send
    if cpu is not None and sent is not None and cpu - sent >= HEDGE_CPU_SHARE * (now - job.sent_at):
        return True
    return waiting_for_cpu(job.worker.pid)


def _predicted(job: Job) -> str:
    """A slice's prediction, as a log line says it."""
    if job.predicted_ms is not None:
        return f"predicted {job.predicted_ms:.0f} ms"
    if job.learned_ms is not None:
        return f"{job.learned_ms:.0f} ms in production"
    return "no prediction"


class Replies(Protocol):
    """Where the supervisor's answers go: the frontend, which owns the clients' socket."""

    def reply_result(self, done: Completed) -> None: ...

    def reply_error(self, request: Request, code: ErrorCode, message: str) -> None: ...


class Supervisor:
    def __init__(
        self,
        reconciler: Reconciler,
        dispatcher: Dispatcher,
        metrics: Metrics,
        production: ProductionProfile,
        replies: Replies,
        requeue: Callable[[list[Request]], None],
        queued: Callable[[], int],
    ) -> None:
        self.pool = reconciler.pool
        self.reconciler = reconciler
        self.dispatcher = dispatcher
        self.metrics = metrics
        self.production = production  # learns from every computed slice
        self.replies = replies
        self.requeue = requeue  # a batch whose workers were all lost goes back to the head of the queue
        self.queued = queued  # the inputs waiting to be batched, for the gauge each look sets
        dispatcher.queued = queued  # while none wait, a batch aside keeps the dispatcher busy (Dispatcher.busy)
        self.changed = True  # the pool changed since the last look: look on this wake
        self.due = 0.0  # time.monotonic() of the next periodic look
        self._generation = -1  # the reconciler's generation at the last look: a new plan is looked at at once
        self._next_template_check = 0.0
        self._looked: dict[int, Looked] = {}  # job id -> what the looks at that overdue slice read

    def pump(self, timeout_ms: int, waiting: bool = False) -> None:
        """Handle what the workers and templates sent; `waiting`: a poll has just reported a message. Every
        template's socket is read (while a change of runtime is under way, the older one's workers still answer);
        only the one new workers fork from is waited on."""
        current, *older = self.pool.backends
        first = current.recv_waiting() if waiting else current.recv(timeout_ms)
        for backend in (current, *older):
            received = first if backend is current else backend.recv(0)
            reads = 0
            while received is not None and reads < MAX_READS_PER_WAKE:
                event = self.pool.handle(*received)
                if event is not None:
                    self._on_event(event)
                    self.changed = self.changed or event.kind != "result"
                reads += 1
                received = backend.recv(0)
        if time.monotonic() >= self._next_template_check:
            self._next_template_check = time.monotonic() + RECONCILE_INTERVAL_S
            self.pool.check_template()  # TemplateLost (fleet.backend), saying how the template ended

    def wait_converged(self, timeout_s: float, interrupted: Callable[[], bool]) -> None:
        """Start-up: step the reconciler until the plan's workers are all ready."""
        deadline = time.monotonic() + timeout_s
        while not self.reconciler.converged():
            if time.monotonic() > deadline:
                raise ConfigError(f"the workers did not become ready within {timeout_s:.0f} s")
            if interrupted():  # SIGTERM or Ctrl-C during start-up
                raise KeyboardInterrupt
            self.reconciler.step()
            self.pump(200)

    # -- the loop core's view (loop.Workers) ---------------------------------------------------------
    @property
    def busy(self) -> bool:
        return self.dispatcher.busy

    @property
    def serving(self) -> list[WorkerHandle]:
        return self.dispatcher.serving

    @property
    def next_deadline(self) -> float:
        return self.dispatcher.next_deadline

    def check(self, now: float) -> None:
        """The loop's check: the deadlines of the batch in flight, then a look at the workers every
        RECONCILE_INTERVAL_S, or at once when the pool or the plan changed."""
        if now >= self.dispatcher.next_deadline:
            self.on_deadline(now)
        if self.changed or now >= self.due or self.reconciler.generation != self._generation:
            self.look(now)
            self.metrics.queued.set(self.queued())
        if self.dispatcher.parked:
            self._start_parked()

    def start(self, batch: list[Request], now: float) -> None:
        """Send the loop's batch to the serving workers; a request to run alone (a suspect of a failure or a hang)
        is parked instead, to run aside on a worker the next batches can spare (_start_parked), unless the pool
        has only one worker."""
        if len(batch) == 1 and batch[0].alone and len(self.pool.live()) > 1:
            self.dispatcher.parked.append(batch[0])
            self._start_parked()
            return
        self.dispatcher.dispatch(batch, self.dispatcher.serving)

    def _start_parked(self) -> None:
        """Run each parked request on an idle serving worker while another serving worker, not running a batch
        aside, is left to the loop's batches, or while no batch waits or runs: a request that hangs the model then
        holds one worker, not every client. With one worker in the pool there is nothing to spare, and they run
        on it in turn."""
        dispatcher = self.dispatcher
        busy = {job.worker.id for job in dispatcher.jobs.values()}
        idle = [w for w in dispatcher.serving if w.id not in busy and not w.outstanding and w.pending is None]
        while dispatcher.parked and idle:
            worker = idle[0]
            aside = {job.worker.id for batch in dispatcher.aside for job in batch.jobs}
            kept = [w for w in dispatcher.serving if w.id not in aside and w.id != worker.id]
            if not kept and len(self.pool.live()) > 1 and (self.queued() or dispatcher.batch is not None):
                return  # the next batches' only worker: wait for another (starting, or answering a batch aside)
            idle.pop(0)
            request = dispatcher.parked.pop(0)
            log.info("request %s (%d inputs) runs alone on worker %d, aside from the batches", request.request_id,
                     request.samples, worker.id)  # fmt: skip
            dispatcher.run_aside(request, worker)

    # -- deadlines and looks ------------------------------------------------------------------------
    def on_deadline(self, now: float) -> None:
        """A deadline of the batch in flight passed: `timeout_ms` bounds the whole request, so one whose batch
        is still computing is answered now; a slice past its hedge time is sent to an idle worker too; a
        slice past its deadline makes the next look replace its worker."""
        self._hedge(now)
        for request in self.dispatcher.expire(now):
            self.replies.reply_error(request, ErrorCode.TIMEOUT, "the request's timeout passed while it was computed")
        self._move_aside(now)
        self.changed = self.changed or bool(self.dispatcher.overdue(now))

    def _move_aside(self, now: float) -> None:
        """The loop's batch moves aside once its unanswered slices are late and a worker is free for the next batch
        (Dispatcher.move_aside): the requests whose rows are all in are answered now."""
        batch = self.dispatcher.batch
        completed = self.dispatcher.move_aside(now)
        if completed is None or batch is None:
            return
        waiting = [job for job in batch.jobs if job.output is None]
        log.info(
            "a batch's slice(s) on worker(s) %s are late (%.0f ms): the batch moves aside, %d request(s) answered now, "
            "the next batch starts on the free workers",
            [job.worker.id for job in waiting], (now - batch.started) * 1000.0, len(completed),
        )  # fmt: skip
        for done in completed:
            self.replies.reply_result(done)

    def look(self, now: float) -> None:
        """Replace overdue and hung workers, let the reconciler converge, refresh `serving`.

        Raises WorkerBootError (from the reconciler) when workers keep failing before they are ready.
        """
        self.changed = False
        self.due = now + RECONCILE_INTERVAL_S
        self._generation = self.reconciler.generation
        for job in self.dispatcher.overdue(now):
            worker = job.worker
            why = self._hung(job, now)
            if why is None:  # slow, not hung: looked at again PROGRESS_LOOK_S later
                continue
            hang = None if stopped(worker.pid) else self.dispatcher.hang(job)
            if hang is not None:  # a stopped worker is not its input's doing: its slice is re-sent below
                self._on_hang(job, hang, now, why)
                continue
            predicted = _predicted(job)
            log.warning(
                "worker %d (pid %s, %d threads) has not answered its %d rows in %.0f ms (%s) and %s: presumed hung, "
                "replacing it and sending the rows to another worker",
                worker.id, worker.pid, worker.threads, job.rows, (now - job.sent_at) * 1000.0, predicted, why,
            )  # fmt: skip
            self.reconciler.replace(worker)
            self._on_lost(worker)
        # An idle worker heartbeats every second. One busy with a slice cannot (it computes on its only
        # Python thread); the slice's deadline above covers that case.
        busy = {job.worker.id for job in self.dispatcher.jobs.values()}
        for worker in self.pool.ready():
            if worker.id not in busy and now - worker.last_seen > HEARTBEAT_TIMEOUT_S:
                log.warning("worker %d sent no heartbeat for %.0f s; replacing it", worker.id, now - worker.last_seen)
                self.reconciler.replace(worker)
        self.reconciler.step()
        self.dispatcher.serving = self.reconciler.serving()
        self.metrics.workers_serving({worker.id: worker.pid for worker in self.dispatcher.serving})
        if self.dispatcher.late:  # a late slice waits for an idle worker: a new one may have come
            self._hedge(now)
        self._move_aside(now)  # a new worker may be the free one it waited for

    def _on_hang(self, job: Job, hang: Hang, now: float, why: str) -> None:
        """A slice of the batch in flight is hung (Dispatcher.hang): the hang's requests are answered, the others
        queued again; the slice's worker and those holding a hung request's rows are replaced."""
        took = f"{(now - job.sent_at) * 1000.0:.0f} ms"
        predicted = _predicted(job)
        log.warning(
            "worker %d (pid %s) has not answered its %d rows in %s (%s) and %s: the batch is given up, %d request(s) "
            "answered as hung (they hung alone too), %d queued again (the slice's each alone), %d worker(s) replaced",
            job.worker.id, job.worker.pid, job.rows, took, predicted, why, len(hang.hung), len(hang.again),
            len(hang.replace),
        )  # fmt: skip
        for request in hang.hung:
            message = f"the model hung on this request (no answer in {took}, {predicted}, run alone; {why})"
            message += ": not retried"
            self.replies.reply_error(request, ErrorCode.INTERNAL, message)
        self.requeue(hang.again)
        for worker in hang.replace:
            self.reconciler.replace(worker)
            self._on_lost(worker)

    def _sibling_waits(self, job: Job, cpu: float) -> float:
        """What `job`'s pool may have spun for siblings that waited for a CPU since it was sent: summed from its first
        look on, and before it in the same share of the CPU time (its first look comes at the spin floor, and reading
        every thread at each sending would cost the request path a /proc read per thread)."""
        looked = self._looked[job.id]
        waited, first = looked.waited, looked.cpu_at_first
        if waited <= 0.0 or first is None or job.cpu_at_send is None or cpu <= first:
            return waited
        return waited * (cpu - job.cpu_at_send) / (cpu - first)

    def _hung(self, job: Job, now: float) -> str | None:
        """Why the worker of `job`, past the slice's first look, is hung (the rules above PROGRESS_LOOK_S); None while
        it is only slow, with the job's deadline moved on for the next look (SPIN_LOOK_S before its deadline proper,
        PROGRESS_LOOK_S after)."""
        # Looks of answered jobs are dropped here, so the tables hold only overdue ones.
        jobs = self.dispatcher.jobs
        self._looked = {i: looked for i, looked in self._looked.items() if i in jobs}
        if now - job.sent_at >= self.dispatcher.job_timeout_s:
            return f"the job timeout ({self.dispatcher.job_timeout_s:g} s) passed"
        worker = job.worker
        cpu = worker.cpu_seconds()
        if cpu is None:
            return "its CPU time cannot be read"  # gone: its exit is on its way
        looked = self._looked.setdefault(job.id, Looked())
        stats, earlier = schedstats(worker.pid), None
        if stats is not None:
            earlier, looked.stats = looked.stats, (now, stats)
            if earlier is None:
                looked.cpu_at_first = cpu
            else:
                looked.waited += sibling_waits(earlier[1], stats)
        waited = self._sibling_waits(job, cpu)
        # A pool's first look only reads its threads: what its siblings waited is known from the next (a look later).
        judged = worker.threads == 1 or earlier is not None
        if judged and cpu >= job.cpu_limit + waited:
            return f"it used the slice's CPU budget ({_budget(job.cpu_budget, waited)}) without answering: it spins"
        if (
            stats is not None
            and earlier is not None
            and cpu >= job.spin_limit + waited
            and never_paused(earlier, now, stats)
        ):
            return (
                f"it computed without a pause and used the slice's CPU budget ({_budget(job.spin_budget, waited)}) "
                "without answering: it spins"
            )
        if now >= job.watched_at:
            before = looked.progress
            progress = cpu if stats is None else sum(run for run, _ in stats.values())
            if before is not None and progress - before < MIN_PROGRESS_CPU_S and not waiting_for_cpu(worker.pid):
                ran_s = progress - before
                return f"its CPU time stopped ({ran_s:.3f} s in {PROGRESS_LOOK_S:g} s, no thread waiting for a CPU)"
            if before is None:
                log.info(
                    "worker %d has not answered its %d rows in %.0f ms; replaced only once its CPU time stops or "
                    "passes the slice's CPU budget",
                    worker.id, job.rows, (now - job.sent_at) * 1000.0,
                )  # fmt: skip
            looked.progress = progress
        job.deadline = now + (PROGRESS_LOOK_S if now >= job.watched_at else SPIN_LOOK_S)
        self.dispatcher.next_deadline = min(self.dispatcher.next_deadline, job.deadline)
        return None

    def _hedge(self, now: float) -> None:
        fresh = [worker for worker in self.serving if now - worker.last_seen <= HEDGE_FRESH_S]
        for copy in self.dispatcher.hedge(now, fresh, computing):
            late = copy.twin
            assert late is not None and late.predicted_ms is not None  # only a predicted slice is hedged
            log.info(
                "worker %d (pid %s) has not answered its %d rows in %.0f ms (predicted %.0f ms): also sent to "
                "worker %d; the first answer is used",
                late.worker.id, late.worker.pid, late.rows, (now - late.sent_at) * 1000.0, late.predicted_ms,
                copy.worker.id,
            )  # fmt: skip

    def _on_event(self, event: PoolEvent) -> None:
        worker = event.worker
        assert worker is not None
        if event.kind == "result":
            # Answer first, learn after: the client's reply must not wait for bookkeeping.
            for done in self.dispatcher.on_result(worker, event.header, event.payload):
                self.replies.reply_result(done)
            if self.dispatcher.late:  # a late slice waits for an idle worker: this one may be it
                self._hedge(time.monotonic())
            compute_ms = float(event.header["compute_ms"])
            self.metrics.observe_compute(worker.threads, compute_ms)
            self.production.observe(worker.threads, int(event.header["batch"]), compute_ms, time.monotonic())
        elif event.kind == "failed":
            self._on_failed(worker, event.header)
        elif event.kind == "lost":
            self._on_lost(worker)
        elif event.kind == "reconfigured":
            log.info("worker %d now runs %d thread(s) on cores %s", worker.id, worker.threads, list(worker.cores))
        elif event.kind == "ready":
            log.info("worker %d ready: %d thread(s) on cores %s", worker.id, worker.threads, list(worker.cores))
            # Its warm-up's times: production's first prediction of slices the profile predicts nothing for, before
            # any is answered (a model may hang on the first batch it is sent).
            for timed in event.header.get("warmup_ms") or ():
                try:
                    self.dispatcher.learn(worker.threads, int(timed[0]), float(timed[1]))
                except (TypeError, ValueError, IndexError):
                    continue

    def _on_failed(self, worker: WorkerHandle, header: dict[str, object]) -> None:
        """A slice failed (the model raised). One bad input must not fail other clients' requests: the requests
        whose rows were in that slice are run again each alone, the rest batched again as usual; a request that
        fails alone (or was its batch's only one) is answered INTERNAL."""
        message = header.get("message", "the model failed")
        given_up = self.dispatcher.fail(header.get("job"))
        if given_up is None:
            log.warning("worker %d failed job %s, of a batch already answered or given up: ignored (%s)",
                        worker.id, header.get("job"), message)  # fmt: skip
            return
        suspects, others = given_up
        log.error("worker %d failed a batch (%d request(s) in its slice): %s", worker.id, len(suspects), message)
        again = []
        for request in suspects:
            if request.alone or len(suspects) + len(others) == 1:  # it failed on its own: it is the bad input
                self.replies.reply_error(request, ErrorCode.INTERNAL, f"the model failed on this request: {message}")
            else:
                request.alone = True
                again.append(request)
        self.requeue(others + again)  # the innocents first: their rows were never in the failed slice

    def _on_lost(self, worker: WorkerHandle) -> None:
        # Also when no batch is in flight: the worker may hold a hedge's losing copy, which is dropped.
        if not self.dispatcher.reassign(worker, self.reconciler.serving()):
            # No worker left to take the slice (the others died too, or their replacements are still
            # starting): the batch goes back to the head of the queue and waits for the replacements, once.
            # A batch that loses its workers twice may be what kills them: it is answered INTERNAL.
            again = []
            for request in self.dispatcher.abandon():
                if request.retried:
                    self.replies.reply_error(
                        request, ErrorCode.INTERNAL, "every worker died while serving this batch, twice"
                    )
                else:
                    request.retried = True
                    again.append(request)
            self.requeue(again)
