"""One machine's cores shared by several simulated daemons: the processor sharing of their slices, and a
model's daemon (`Tenant`) that runs its slices there.

The machine is processor sharing with the emulated workers' rules (`service.ServiceModel`): every busy slice
progresses at 1 / slowdown(busy threads), where the busy threads are those of ALL models' slices running at
that moment; so when every model has planned for every core and two are busy together, each runs at half
speed or worse, and when their shares are disjoint, none slows another beyond the interference of a busier
machine. A lone batch on the machine finishes exactly when `ServiceModel.batch_ms` says (a test checks it),
so one tenant is the single-model simulation. `simulate.colocated` puts tenants under a coordinator.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from packrat_daemon.config import ServeConfig
from packrat_daemon.load.report import Tally
from packrat_daemon.measure.emulation import Interference
from packrat_daemon.requests.batcher import Request
from packrat_daemon.simulate.clock import EventLoop
from packrat_daemon.simulate.costs import DaemonCosts
from packrat_daemon.simulate.run import FREE, NO_INTERFERENCE, Simulation, Traffic
from packrat_daemon.simulate.service import ServiceModel
from packrat_daemon.wire.errors import ConfigError
from policies.base import Plan
from policies.planning.cores import CoreAllocator
from policies.planning.profile import Profile
from policies.planning.topology import Topology

FINISHED = 1e-9  # ms of work left below which a slice has finished (float rounding of the processor sharing)


@dataclass
class _Batch:
    started: float
    finished: list[float]  # ms after `started`, per slice
    pending: int
    done: Callable[[list[float]], None]


@dataclass
class _Slice:
    left_ms: float  # work left, in ms at no slow-down
    threads: int
    service: ServiceModel
    batch: _Batch
    index: int


class SharedMachine:
    """One machine's cores on the virtual clock: processor sharing over every model's busy slices."""

    def __init__(self, cores: int, loop: EventLoop) -> None:
        if cores < 1:
            raise ConfigError(f"the machine needs at least one core, got {cores}")
        self.cores = cores
        self.loop = loop
        self._active: list[_Slice] = []
        self._last = loop.clock.now
        self._generation = 0  # the completion event scheduled last; earlier ones are stale
        self.peak_busy = 0  # most threads busy at once
        self.oversubscribed_s = 0.0  # time with more threads busy than cores
        self.busy_thread_s = 0.0  # ∫ busy threads dt

    @property
    def busy_threads(self) -> int:
        return sum(s.threads for s in self._active)

    def run(self, service: ServiceModel, slices: list[tuple[int, int]], done: Callable[[list[float]], None]) -> None:
        """Start one batch's (threads, rows) slices now; `done(ms after now, per slice)` once all have finished."""
        self._advance()
        batch = _Batch(self.loop.clock.now, [0.0] * len(slices), len(slices), done)
        for index, (threads, rows) in enumerate(slices):
            self._active.append(_Slice(service.alone_ms(threads, rows), threads, service, batch, index))
        self.peak_busy = max(self.peak_busy, self.busy_threads)
        self._schedule()

    def _advance(self) -> None:
        now = self.loop.clock.now
        elapsed = now - self._last
        if elapsed > 0 and self._active:
            busy = self.busy_threads
            self.busy_thread_s += busy * elapsed
            if busy > self.cores:
                self.oversubscribed_s += elapsed
            for piece in self._active:
                piece.left_ms -= elapsed * 1000.0 / piece.service.numbers.slowdown(busy)
        self._last = now

    def _schedule(self) -> None:
        self._generation += 1
        if not self._active:
            return
        busy = self.busy_threads
        next_ms = min(max(0.0, p.left_ms) * p.service.numbers.slowdown(busy) for p in self._active)
        generation = self._generation
        self.loop.at(self.loop.clock.now + next_ms / 1000.0, lambda: self._finish(generation))

    def _finish(self, generation: int) -> None:
        if generation != self._generation:
            return  # a slice started or finished since: this completion was re-timed
        self._advance()
        now = self.loop.clock.now
        done = [p for p in self._active if p.left_ms <= FINISHED]
        self._active = [p for p in self._active if p.left_ms > FINISHED]
        complete = []
        for piece in done:
            batch = piece.batch
            batch.finished[piece.index] = (now - batch.started) * 1000.0
            batch.pending -= 1
            if batch.pending == 0:
                complete.append(batch)
        self._schedule()
        for batch in complete:
            batch.done(batch.finished)


@dataclass
class SentTally(Tally):
    """`packrat load`'s counts, with when each answered request was sent (to split a run into its phases)."""

    sent_s: list[float] = field(default_factory=list)

    def answered(self, latency_s: float, samples: int, now: float, length: int | None = None) -> None:
        super().answered(latency_s, samples, now, length)
        self.sent_s.append(now - latency_s)


class Tenant(Simulation):
    """One model's simulated daemon on a shared machine, planning inside the cores it is given: the
    single-model `Simulation` (the daemon's own loop core, batcher, splitter and policy) sharing the event
    loop with the others, its slices run on the `SharedMachine` instead of alone."""

    def __init__(
        self,
        name: str,
        config: ServeConfig,
        profile: Profile,
        machine: SharedMachine,
        share: int,
        interference: Interference = NO_INTERFERENCE,
        costs: DaemonCosts = FREE,
    ) -> None:
        super().__init__(config, profile, share, interference, costs, loop=machine.loop)
        self.name = name
        self.machine = machine
        self.share = share
        # The slow-down is the machine's: f(threads busy on all its cores), time-shared past them.
        self.service = ServiceModel.of(profile, machine.cores, config.max_batch, interference)
        self.started: list[tuple[float, int]] = []  # (virtual s, inputs) of each batch started
        self.busy_s = 0.0  # time with a batch in flight
        self.traffic: Traffic | None = None  # what its clients send
        self.tally = SentTally(started=0.0)

    def compute(self, batch: list[Request], slices: list[tuple[int, int]], sent: float) -> None:
        started, lengths = self.clock.now, self._slice_lengths
        self.started.append((started, sum(rows for _, rows in slices)))

        def finished(compute_ms: list[float]) -> None:
            self.busy_s += self.clock.now - started
            back = self.clock.now + self.costs.hop_ms / 1000.0
            self.loop.at(back, lambda: self._finish(batch, slices, compute_ms, lengths))

        self.loop.at(sent, lambda: self.machine.run(self.service, slices, finished))

    def assign(self, cores: int, plan: Plan, reason: str) -> None:
        """Serve `plan` on `cores` once the reconciler's switch time has passed (the old plan serves meanwhile)."""
        self.share = cores

        def switch() -> None:
            self.topology = Topology.synthetic(cores)
            self.allocator = CoreAllocator(self.topology)
            self._switch(plan, reason)

        self.loop.at(self.clock.now + self.costs.switch_ms / 1000.0, switch)

    @property
    def done(self) -> bool:
        return not self._senders and not self.busy and not self.batcher.queue
