"""Hang verdicts: whether the worker of an overdue slice is hung, and why, as a pure function of frozen inputs
(`judge`), as the policies are; it imports nothing of Packrat's. What a look reads of the worker's process (`Reading`:
its CPU time, its threads' schedstats, whether one waits for a CPU) is read in `fleet.proc`; what the earlier looks
at the slice read (`Looked`) comes in and goes out as a value; the dispatcher (`requests.dispatcher`) keeps it on the
slice (`Job.looked`) and acts on the verdict.

A worker past its slice's deadline (wall-clock time: margin x the prediction) may only be slow: a machine busy with
other work stretches the wall clock. Replacing it would add a fork and a warm-up to the wait (on a one-worker plan,
twice over, until every worker "died"), and give up its batch: a request slow twice alone would be answered as hung.
So past the deadline it is looked at again every PROGRESS_LOOK_S and hung only when
- its CPU time passed the slice's CPU budget (Job.cpu_limit: margin x the CPU its threads would use in the
  predicted time, and what its threads' siblings waited, below): computing that long without an answer is a spin;
- its CPU time advanced less than MIN_PROGRESS_CPU_S since the last look while none of its threads waited for a
  CPU (runnable, or in uninterruptible sleep): a sleeping, deadlocked or stopped worker; or
- the job timeout passed since the slice was sent, whatever its CPU time (the ceiling).
Earlier, from the spin floor (Deadlines.spin_floor_s; Job.deadline until Job.watched_at), looked at every
SPIN_LOOK_S, one rule alone: between two looks a thread of the worker was on a CPU or waiting for one throughout
(SPIN_SHARE of the time: it never slept, however loaded the machine) and its CPU time passed the slice's spin budget
(Job.spin_limit, and the siblings' waits): it spins. A worker that sleeps between bursts (waiting on something, or
a stand-in for a slow one) is left to the rules above.
A loaded machine stretches the work's CPU time too: the threads of an intra-op pool spin at its barriers while a
sibling waits for a CPU, so beside busy neighbours a slice's CPU time grows with the wall clock, by several times,
and a margin alone no longer tells a spin from a pool sharing its cores. So each look adds `sibling_waits` to both
budgets (per thread, at most the time its siblings waited for a CPU; before the first look, in the same share of
the CPU time), and a pool of more than one thread is judged from its second look. A thread that spins alone (a
hang in the model's Python, its siblings asleep) is judged as before; a pool whose threads all spin (a hang inside
a parallel region) on a machine that keeps them waiting is left to the ceiling.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

PROGRESS_LOOK_S = 0.2
SPIN_SHARE = 0.9
SPIN_LOOK_S = 0.1  # a spin is told at the first look past its budget, so looks before the deadline come this often
MIN_PROGRESS_CPU_S = 0.01
# A late slice whose worker used at least this share of a CPU since it was sent, or has a thread waiting for one, is
# computing it: not hedged (see Dispatcher.hedge). A stopped or blocked worker uses none and waits for none.
HEDGE_CPU_SHARE = 0.1

Stats = Mapping[str, tuple[float, float]]  # each thread's (time on a CPU, time waiting for one), s, by thread id


@dataclass(frozen=True)
class Reading:
    """What one look read of an overdue slice's worker (`fleet.proc.read`)."""

    at: float  # time.monotonic() of the look
    cpu: float | None  # its CPU seconds (WorkerHandle.cpu_seconds); None: it cannot be read (gone)
    stats: Stats | None  # its threads' schedstats; None where they cannot be read
    waiting: bool  # a thread of it is runnable or in uninterruptible sleep: it would advance given a CPU
    stopped: bool  # stopped by a signal or a tracer: hung, but not by its input


@dataclass(frozen=True)
class Looked:
    """What the earlier looks at one overdue slice read, as `judge` needs it at the next."""

    progress: float | None = None  # its run seconds (or CPU time) at the last look past the deadline proper
    stats: tuple[float, Stats] | None = None  # (when, schedstats) at the last look: a spin's
    cpu_at_first: float | None = None  # its CPU seconds at the first look that read its threads
    waited: float = 0.0  # sibling_waits summed over the looks since


@dataclass(frozen=True)
class Slice:
    """What `judge` needs of the overdue slice (a Job's fields, frozen: `Dispatcher.looked_at` makes it)."""

    sent_at: float
    watched_at: float  # its deadline proper: before it, only the spin's rule
    threads: int
    cpu_at_send: float | None
    cpu_limit: float
    cpu_budget: float
    spin_limit: float
    spin_budget: float


@dataclass(frozen=True)
class Verdict:
    why: str | None  # hung, and why (a log line's and an error's words); None: only slow
    looked: Looked  # what this look read, for the next
    next_look: float = 0.0  # when only slow: when to look again
    first_past_deadline: bool = False  # when only slow: the first look past its deadline proper (a log line says so)


def judge(job: Slice, reading: Reading, looked: Looked, job_timeout_s: float) -> Verdict:
    """Whether the worker of `job`, past the slice's first look, is hung (the module's rules); when only slow, the
    next look comes SPIN_LOOK_S later before its deadline proper, PROGRESS_LOOK_S after."""
    now, cpu, stats = reading.at, reading.cpu, reading.stats
    if now - job.sent_at >= job_timeout_s:
        return Verdict(f"the job timeout ({job_timeout_s:g} s) passed", looked)
    if cpu is None:
        return Verdict("its CPU time cannot be read", looked)  # gone: its exit is on its way
    earlier = None
    if stats is not None:
        earlier = looked.stats
        if earlier is None:
            looked = dataclasses.replace(looked, stats=(now, stats), cpu_at_first=cpu)
        else:
            looked = dataclasses.replace(
                looked, stats=(now, stats), waited=looked.waited + sibling_waits(earlier[1], stats)
            )
    waited = scaled_waits(looked, job.cpu_at_send, cpu)
    # A pool's first look only reads its threads: what its siblings waited is known from the next (a look later).
    judged = job.threads == 1 or earlier is not None
    if judged and cpu >= job.cpu_limit + waited:
        why = f"it used the slice's CPU budget ({_budget(job.cpu_budget, waited)}) without answering: it spins"
        return Verdict(why, looked)
    if (
        stats is not None
        and earlier is not None
        and cpu >= job.spin_limit + waited
        and never_paused(earlier, now, stats)
    ):
        why = (
            f"it computed without a pause and used the slice's CPU budget ({_budget(job.spin_budget, waited)}) "
            "without answering: it spins"
        )
        return Verdict(why, looked)
    past = now >= job.watched_at
    first = False
    if past:
        before = looked.progress
        progress = cpu if stats is None else sum(run for run, _ in stats.values())
        if before is not None and progress - before < MIN_PROGRESS_CPU_S and not reading.waiting:
            ran_s = progress - before
            why = f"its CPU time stopped ({ran_s:.3f} s in {PROGRESS_LOOK_S:g} s, no thread waiting for a CPU)"
            return Verdict(why, looked)
        first = before is None
        looked = dataclasses.replace(looked, progress=progress)
    return Verdict(None, looked, now + (PROGRESS_LOOK_S if past else SPIN_LOOK_S), first)


def scaled_waits(looked: Looked, cpu_at_send: float | None, cpu: float) -> float:
    """What the slice's pool may have spun for siblings that waited for a CPU since it was sent: summed from its first
    look on, and before it in the same share of the CPU time (its first look comes at the spin floor, and reading
    every thread at each sending would cost the request path a /proc read per thread)."""
    waited, first = looked.waited, looked.cpu_at_first
    if waited <= 0.0 or first is None or cpu_at_send is None or cpu <= first:
        return waited
    return waited * (cpu - cpu_at_send) / (cpu - first)


def sibling_waits(earlier: Stats, stats: Stats) -> float:
    """The CPU time, between two schedstats readings, that a pool's threads may have spent waiting at a barrier for
    siblings that waited for a CPU: for each thread, its time on a CPU, at most the time the others waited for one.
    0 for a single busy thread whose siblings sleep; on a machine shared with busy neighbours, up to all of it."""
    ran = {task: run - earlier[task][0] for task, (run, _) in stats.items() if task in earlier}
    waits = {task: waited - earlier[task][1] for task, (_, waited) in stats.items() if task in earlier}
    total_wait = sum(waits.values())
    return sum(min(ran[task], total_wait - waits[task]) for task in ran)


def never_paused(before: tuple[float, Stats], now: float, stats: Stats) -> bool:
    """Whether, since `before` (a look's time and schedstats), a thread was on a CPU or waiting for one for at least
    SPIN_SHARE of the time: it computed without a pause, however loaded the machine."""
    then, earlier = before
    elapsed = now - then
    for task, (run, waited) in stats.items():
        old = earlier.get(task)
        if old is not None and elapsed > 0 and (run + waited) - (old[0] + old[1]) >= SPIN_SHARE * elapsed:
            return True
    return False


def computing(cpu_used: float | None, elapsed: float, waiting: bool) -> bool:
    """Whether the worker of a late slice is computing it: it used `cpu_used` CPU seconds in the `elapsed` seconds
    since the slice was sent (None: unknown), at least HEDGE_CPU_SHARE of a CPU, or a thread of it waits for a CPU
    now. A stopped or blocked worker is not (a hedge elsewhere answers sooner). One starved of CPU on a loaded machine
    is: it may be spinning on its input, and a copy would hang the idle worker too (bench/faults.py --attack
    hanging_model saw it)."""
    return (cpu_used is not None and cpu_used >= HEDGE_CPU_SHARE * elapsed) or waiting


def _budget(budget: float, waited: float) -> str:
    extra = f", plus {waited:.2f} s its threads' siblings waited for a CPU" if waited >= 0.005 else ""
    return f"{budget:.2f} s of CPU{extra}"
