"""The main loop's core: what one wake of the loop does, in order, whatever the clock and the sockets.

`LoopCore.tick(now)` runs the phases of a wake (as gunicorn's arbiter reaps, murders and manages its
workers from one loop):

1. **expire**: answer the queued requests whose timeout passed, TIMEOUT;
2. **check**: the workers' deadlines and, when due, a look at the workers (`Workers.check`);
3. **dispatch**: start the next batch if one is due, none is in flight and a worker serves;
4. **periodic**: the hooks that run on every wake (the watchdog, the control channel, the state file);
5. **adapt**: once `adapt_interval_s` has passed, ask online adaptation for a plan and switch to it.

The daemon (`daemon.Daemon`) ticks it after each poll on the monotonic clock, with the supervisor as its
`Workers`; `packrat simulate` (`simulate.run.Simulation`) ticks it on a virtual clock, with modelled
workers. So a change to the order, or to when a phase runs, is made here, once, for both.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

from packrat_daemon.wire.codec import ErrorCode

if TYPE_CHECKING:
    from packrat_daemon.adapt.online import OnlineAdaptation
    from packrat_daemon.fleet.pool import WorkerHandle
    from packrat_daemon.requests.batcher import Batcher, Request
    from policies.base import Plan
    from policies.planning.profile import Profile

# Answer a request with an error: the frontend's reply in the daemon, a refusal counted in the simulation.
ReplyError = Callable[["Request", ErrorCode, str], None]
Hook = Callable[[float], object]  # something done on every wake, given the time of the tick (what it returns is unused)


class Workers(Protocol):
    """The workers as the loop drives them: the supervisor in the daemon, the modelled ones in the simulation.
    One batch is in flight at a time."""

    @property
    def busy(self) -> bool:
        """A batch is in flight."""
        ...

    @property
    def serving(self) -> Sequence[WorkerHandle]:
        """The workers that take batches now."""
        ...

    @property
    def next_deadline(self) -> float:
        """When a deadline of the batch in flight next passes (a slice's or a request's), math.inf if none."""
        ...

    def check(self, now: float) -> None:
        """Act on the deadlines that passed, and look at the workers when that is due."""
        ...

    def start(self, batch: list[Request], now: float) -> None:
        """Send `batch` to the serving workers."""
        ...


class LoopCore:
    def __init__(
        self,
        batcher: Batcher,
        workers: Workers,
        adaptation: OnlineAdaptation,
        reply_error: ReplyError,
        switch: Callable[[Plan, str], object],
        served: Callable[[], tuple[Plan, Profile | None]],
        periodic: Sequence[Hook] = (),
        dispatched: Callable[[int, float], None] | None = None,
    ) -> None:
        self.batcher = batcher
        self.workers = workers
        self.adaptation = adaptation
        self.reply_error = reply_error
        self.switch = switch  # hands adaptation's plan over, with its reason ("adapt")
        self.served = served  # the plan served now and the offline profile it was planned from
        self.periodic = periodic
        # After each batch start: its inputs and the seconds the start held the loop (the daemon's metrics).
        self.dispatched = dispatched

    def tick(self, now: float) -> None:
        """One wake's work, phase by phase (the module's docstring)."""
        self.expire(now)
        self.workers.check(now)
        self.dispatch(now)
        for hook in self.periodic:
            hook(now)
        self.adapt(now)

    def expire(self, now: float) -> None:
        if self.batcher.oversized:  # a reload shrank max_batch below these queued requests: no batch can take them
            for request in self.batcher.take_oversized():
                message = f"{request.samples} inputs, over max_batch {self.batcher.max_batch} (reloaded); send fewer"
                self.reply_error(request, ErrorCode.TOO_LARGE, message)
        if self.batcher.queue:
            for request in self.batcher.expire(now):
                self.reply_error(request, ErrorCode.TIMEOUT, "the request's timeout passed while it was queued")

    def dispatch(self, now: float) -> None:
        workers, batcher = self.workers, self.batcher
        # The batcher is asked only while no batch is in flight: `due` decides whether to hold for company.
        if workers.busy or not batcher.due(now) or not workers.serving:
            return
        started = time.perf_counter()
        batch = batcher.take()
        if not batch:  # nothing queued after all: the dispatcher is never handed an empty batch
            return
        workers.start(batch, now)
        rows = sum(request.samples for request in batch)  # bookkeeping after the send: the workers start meanwhile
        self.adaptation.estimator.observe(rows, now)
        if self.dispatched is not None:
            self.dispatched(rows, time.perf_counter() - started)

    def adapt(self, now: float) -> None:
        if now >= self.adaptation.due:
            plan, profile = self.served()
            proposed = self.adaptation.propose(plan, profile, now)
            if proposed is not None:
                self.switch(proposed, "adapt")

    def next_wake(self) -> float | None:
        """When the loop must wake for its next batch or deadline, on the tick's clock: the in-flight batch's
        next deadline, else when the queue's head falls due (None: nothing queued; math.inf: no deadline)."""
        return self.workers.next_deadline if self.workers.busy else self.batcher.next_due()
