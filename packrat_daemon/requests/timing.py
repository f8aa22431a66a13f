"""The clocks of work in flight: the slices' bounds as one value (`Deadlines`, from the settings table), what each
slice sent is given from them (`Timing.clocks`: its hedge time, first look and deadline proper; `Timing.budget`: its
CPU budgets), and what production taught of the slices' times (`learn`, `learned_ms`, `typical_slice_s`).

It holds no slice: the dispatcher owns those, and asks it what each one's clocks are.
"""

from __future__ import annotations

import dataclasses
import math
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from packrat_daemon.config import ServeConfig
    from packrat_daemon.fleet.pool import WorkerHandle
    from packrat_daemon.requests.jobs import InFlightBatch, Job

# Weight of the newest answer in the running mean of a slice's time from dispatch to answer (`typical_slice_s`).
TYPICAL_WEIGHT = 0.2
# Production's prediction of a slice the profile predicts nothing for (`learned_ms`): the longest of the last this many
# compute times of slices of its shape (threads, rows), its workers' warm-ups included.
LEARNED_KEEP = 8


@dataclass(frozen=True)
class Deadlines:
    """The bounds of a slice's time, as the settings give them (`from_config`); a reload replaces the whole value
    (slices sent from then on get it, those out keep theirs)."""

    job_timeout_s: float  # the ceiling: a slice unanswered this long is hung, whatever its worker does
    margin: float  # slice_deadline_margin: a slice's deadline is this many times its prediction...
    floor_s: float  # ...at least this (slice_deadline_floor_ms)
    hedge_margin: float = math.inf  # past this many times its prediction a slice is also sent elsewhere (inf: never)
    hedge_floor_s: float = 0.0  # ...at least this
    # The least time and CPU time a slice is given before a worker computing it without a pause is taken for a spin
    # (fleet.verdicts; before the deadline, only that). None: the deadline floor (no earlier look).
    spin_floor_s: float | None = None

    @classmethod
    def from_config(cls, config: ServeConfig) -> Deadlines:
        """The settings' six bounds (milliseconds made seconds): the one place they are read."""
        return cls(
            config.job_timeout_s, config.slice_deadline_margin, config.slice_deadline_floor_ms / 1000.0,
            config.slice_hedge_margin, config.slice_hedge_floor_ms / 1000.0, config.slice_spin_floor_ms / 1000.0,
        )  # fmt: skip

    @classmethod
    def of(cls, value: Deadlines | float, *bounds: float, spin_floor_s: float | None = None) -> Deadlines:
        """`value` itself, or the bounds in the fields' order (the job timeout first), as reload.py passes them."""
        if isinstance(value, Deadlines):
            return value
        deadlines = cls(value, *bounds)
        return deadlines if spin_floor_s is None else dataclasses.replace(deadlines, spin_floor_s=spin_floor_s)

    @property
    def spin_s(self) -> float:
        """The spin floor in force: the deadline floor when none was given."""
        return self.floor_s if self.spin_floor_s is None else self.spin_floor_s


class Clocks(NamedTuple):
    """What a slice sent now is given (`Timing.clocks`)."""

    hedge_at: float  # when its rows are also sent to an idle worker (inf: never)
    deadline: float  # its deadline proper (Job.watched_at): past it every rule of the hang applies
    predicted: float | None  # the profile's prediction, ms
    learned: float | None  # production's, where the profile has none, ms
    first_look: float  # its first look (Job.deadline): the spin floor or the margin times the prediction
    clock_from: float  # when its clocks start: now, or behind the slices its worker holds


class Timing:
    """The deadlines in force, and what production taught of slices' times."""

    def __init__(self, deadlines: Deadlines) -> None:
        self.deadlines = deadlines
        # The compute times of the last LEARNED_KEEP slices of each shape (threads, rows), newest last.
        self.timed: dict[tuple[int, int], deque[float]] = {}
        self.typical_slice_s = math.inf  # a running mean of the slices' times from dispatch to answer; none yet

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

    def answered(self, took: float) -> None:
        """A slice was answered `took` seconds after it was sent: into the running mean."""
        typical = self.typical_slice_s
        self.typical_slice_s = took if typical == math.inf else typical + TYPICAL_WEIGHT * (took - typical)

    def clocks(
        self, worker: WorkerHandle, rows: int, now: float, predicted: float | None, held: Iterable[Job], hedged: bool
    ) -> Clocks:
        """The clocks of a slice of `rows` sent to `worker` now, `predicted` by the profile (ms; production's
        prediction stands in where it has none), behind the slices `held` by the worker (it runs them one after
        another). `hedged`: whether the plan hedges at all. No hedge without the profile's prediction, nor one that
        would come no earlier than the deadline. The deadline is the margin times the prediction, at least the floor,
        at most the job timeout; without a prediction, the job timeout. The first look is the spin floor or the margin
        times the prediction, whichever is later, and no later than the deadline."""
        d = self.deadlines
        # What slices of this shape took here, where the profile predicts nothing. It is not hedged, as before (a copy
        # would send the rows to a second worker): it sets the deadline and the CPU budgets only.
        learned = None if predicted is not None else self.learned_ms(worker.threads, rows)
        expected = predicted if predicted is not None else learned
        allowed = first_look = d.job_timeout_s
        hedge_after = math.inf
        if expected is not None:
            allowed = min(allowed, max(d.floor_s, d.margin * expected / 1000.0))
            first_look = min(allowed, max(d.spin_s, d.margin * expected / 1000.0))
        # Instances that share cores run slower than their profiled cells by a factor nobody predicts, and a hedge
        # would only put more work on the same cores: such plans are never hedged.
        if predicted is not None and hedged:
            hedge_after = max(d.hedge_floor_s, d.hedge_margin * predicted / 1000.0)
        start = max([now, *(max(job.deadline, job.watched_at) for job in held)])
        hedge_at = start + hedge_after if hedge_after < allowed else math.inf
        return Clocks(hedge_at, start + allowed, predicted, learned, start + first_look, start)

    def budget(self, job: Job, cpu: float, held: list[Job]) -> None:
        """Set the CPU budgets of `job`, just sent to a worker whose CPU time is `cpu` and which holds `held`.

        A slice needs at most its threads' CPU for its predicted time, however loaded the machine (a loaded machine
        slows the wall clock, not the work): a worker that used `margin` times that, still with no answer, spins
        (fleet.verdicts). After the budgets of the slices it already holds, as the deadline. Two budgets: the spin
        floor's for a worker that computes without a pause, the deadline floor's for any."""
        expected = job.expected_ms
        assert expected is not None
        d = self.deadlines
        needs = d.margin * job.worker.threads * expected / 1000.0
        job.cpu_at_send = cpu
        job.cpu_budget = max(d.floor_s, needs)
        job.spin_budget = min(job.cpu_budget, max(d.spin_s, needs))
        job.cpu_limit = max([cpu, *(j.cpu_limit for j in held)]) + job.cpu_budget
        job.spin_limit = max([cpu, *(j.spin_limit for j in held)]) + job.spin_budget

    def late_after(self) -> float:
        """How long after its sending a slice is late: the hedge margin times a typical slice's time, at least the
        hedge floor; inf with hedging off or before any slice was answered."""
        d = self.deadlines
        if self.typical_slice_s == math.inf or math.isinf(d.hedge_margin):
            return math.inf
        return max(d.hedge_floor_s, d.hedge_margin * self.typical_slice_s)

    def late_at(self, batch: InFlightBatch, hedged: bool) -> float:
        """When the slices of `batch`, just sent, are late: after the hedge margin times a typical slice's time (at
        least the hedge floor), and not before their hedge times (a hedge answers sooner where the model is not at
        fault). Never with hedging off, before any slice was answered or predicted, or on plans whose instances share
        cores (`hedged` False): the next batch would run on the late slice's cores."""
        typical = self.typical_slice_s
        if typical == math.inf:  # nothing answered yet: the profile's prediction, or production's, if any
            predicted = [job.expected_ms for job in batch.jobs if job.expected_ms is not None]
            typical = max(predicted) / 1000.0 if predicted else math.inf
        d = self.deadlines
        if math.isinf(d.hedge_margin) or typical == math.inf or not hedged:
            return math.inf
        wait = max(d.hedge_floor_s, d.hedge_margin * typical)
        hedges = [job.hedge_at for job in batch.jobs if job.hedge_at < math.inf]
        return max([max(job.sent_at for job in batch.jobs) + wait, *hedges])


def restart_clocks(held: list[Job], now: float, cpu_seconds: Callable[[], float | None]) -> float | None:
    """A worker answered a slice: the slices `held` behind it (oldest first) start their clocks now. They were set at
    sending, stacked behind the answered one's deadline proper, so a spin on the next slice after a quick one was
    told a deadline late (`bench/faults.py --attack hanging_model`: after the job timeout, not at its first look).
    `cpu_seconds`: the worker's CPU time, read only when a clock moves. Returns the earliest of the head's new
    deadline and hedge time, or None when nothing moved."""
    if not held:
        return None
    head = held[0]
    early = head.clock_from - now
    if early <= 0.0:
        return None  # its clock runs already: those behind it are stacked on it, as they should be
    cpu, cpu_early, spin_early = cpu_seconds(), 0.0, 0.0
    if cpu is not None and head.cpu_at_send is not None:
        cpu_early, spin_early = head.cpu_limit - head.cpu_budget - cpu, head.spin_limit - head.spin_budget - cpu
    for job in held:
        job.clock_from -= early
        job.deadline -= early
        job.watched_at -= early
        job.hedge_at -= early
        job.cpu_limit -= max(0.0, cpu_early)
        job.spin_limit -= max(0.0, spin_early)
    return min(head.deadline, head.hedge_at)
