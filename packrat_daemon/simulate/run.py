"""The simulated daemon: the daemon's own loop core, batcher, splitter, policy and online adaptation
(estimator, production profile, tuner), driven by a virtual clock instead of sockets and workers.

What is the daemon's code and what is modelled:
- imported and run as the daemon runs them: `LoopCore` (each wake's phases in the daemon's order: expire,
  check, dispatch, adapt), `Batcher` (queueing, max_batch, max_delay, the bounded queue), `Splitter`
  (which layout takes a batch, the exact per-batch split), the policy's start-up plan, `OnlineAdaptation`
  (the live batch sizes, production timings, the tuner's hysteresis and cool-down), and the reconciler's
  core allocation of each plan;
- modelled: each slice's compute time (`service.ServiceModel`: the emulated workers' L̂ × slow-down), and
  what the daemon itself costs (`costs.DaemonCosts`: the transport to and from the client, and the work of
  its one loop, which reads requests, starts batches and answers them one piece at a time, so a batch
  waits while the loop takes in a large request, and the reconciler's switch time), all 0 unless given;
- as the daemon does it: the adaptation looks come every adapt_interval_s from the daemon's start, which
  is `Traffic.uptime_s` before the first request (so the same traffic can meet its first switch a whole
  interval later). The loop wakes when a request has been read, a batch answered, a batch falls due or a
  look is due, each time once the modelled loop is free; the simulation is `LoopCore`'s `Workers`.
One batch is in flight at a time, as in the daemon's loop, except that a batch cut by cost moves aside at its first
slice back (`simulate.lengths.answered_apart`), as the daemon's dispatcher moves it.
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from typing import Any

import numpy as np

from packrat_daemon.adapt.online import OnlineAdaptation
from packrat_daemon.config import ServeConfig
from packrat_daemon.fleet.pool import WorkerHandle, WorkerState
from packrat_daemon.fleet.reconciler import forks_for, plan_slots
from packrat_daemon.load.arrivals import within
from packrat_daemon.load.report import Tally
from packrat_daemon.loop import LoopCore
from packrat_daemon.measure.emulation import Interference
from packrat_daemon.requests.batcher import Batcher, Request, plan_latency
from packrat_daemon.requests.inflight import holds_the_queue
from packrat_daemon.requests.ragged import Ragged
from packrat_daemon.requests.splitter import Splitter
from packrat_daemon.simulate.clock import EventLoop, VirtualClock
from packrat_daemon.simulate.costs import DaemonCosts, LoopModel
from packrat_daemon.simulate.lengths import Cut, answered_apart, free_workers, ragged_model, sliced
from packrat_daemon.simulate.service import ServiceModel
from packrat_daemon.simulate.traffic import SimulationResult, Traffic
from packrat_daemon.startup import distribution_for, policy_for
from packrat_daemon.wire.codec import ErrorCode
from packrat_daemon.wire.errors import ConfigError
from policies.base import Plan
from policies.planning.cores import CoreAllocator
from policies.planning.profile import Profile
from policies.planning.topology import Topology

log = logging.getLogger("packrat.simulate")

NO_INTERFERENCE = Interference.named("none")
FREE = DaemonCosts()  # the daemon itself costs nothing: the bare simulation
MAX_EVENTS = 200_000_000  # bounds a run: about an hour of simulation time on this machine's slowest case


class Simulation:
    """One run of the simulated daemon; `config` is the serve configuration it would run with."""

    def __init__(
        self,
        config: ServeConfig,
        profile: Profile,
        cores: int,
        interference: Interference = NO_INTERFERENCE,
        costs: DaemonCosts = FREE,
        loop: EventLoop | None = None,
    ) -> None:
        self.config = config
        self.profile = profile
        self.topology = Topology.synthetic(cores)
        self.service = ServiceModel.of(profile, cores, config.max_batch, interference)
        self.costs = costs
        self.daemon_loop = LoopModel()
        # Several simulated daemons on one machine share one event loop and clock (simulate.colocated).
        self.loop = EventLoop(VirtualClock()) if loop is None else loop
        self.clock = self.loop.clock
        self.policy = policy_for(config)
        self.allocator = CoreAllocator(self.topology)
        predict = plan_latency(lambda: self.splitter, lambda: self.workers)  # as the daemon does
        self.batcher = Batcher(config.max_batch, config.max_delay_ms / 1000.0, config.max_queue, predict)
        self.adaptation = OnlineAdaptation(config, self.policy, profile, self.topology)
        if costs.switch_ms > 0:  # a switch costs what it forks, as the daemon's reconciler measures it (adapt.tuner)
            self.adaptation.costs(self)
        self.plan = self.policy.plan(profile, self.topology, distribution_for(config))
        self.plan_changes: list[dict[str, Any]] = []
        self._switch(self.plan, "start")
        self.busy = False
        self.core = LoopCore(self.batcher, self, self.adaptation, self._refuse, self._decided, self._served)
        self.tally = Tally(started=0.0)
        self.batches = self.batch_inputs = 0
        self.queue_wait_s = 0.0  # from each request's receipt by the daemon until its batch starts
        self._sent_at: dict[int, float] = {}  # each request in the daemon (by id) → when its client sent it
        self.last_send = 0.0
        self.adapt_wall_s: list[float] = []  # wall time of each look of online adaptation (outside the result)
        self._senders = 0  # arrival sources still sending (1 open-loop process, or N closed-loop clients)
        self._tick_at: float | None = None  # the batch-due wake-up already scheduled, if any
        self.ragged: Ragged | None = None  # traffic of many lengths: the model's free axis
        self._draw_length: Callable[[], int] = lambda: 0
        self._slice_lengths: list[int] | None = None  # the batch in flight's slices' padded lengths
        self._cut: Cut | None = None  # the batch in flight, when cut by cost: its slices answer apart
        self._busy_until: dict[int, float] = {}  # by id() of a worker handle: when its slice of a batch aside is back

    # -- the run --------------------------------------------------------------------------------
    def run(self, traffic: Traffic, max_events: int = MAX_EVENTS) -> SimulationResult:
        self.begin(traffic)
        self.loop.run(max_events)
        return self.result(traffic)

    def begin(self, traffic: Traffic) -> None:
        """Schedule the traffic's first sends and the daemon's first look; the event loop runs them."""
        if traffic.mix.largest > self.config.max_batch:
            raise ConfigError(
                f"requests of {traffic.mix.largest} samples exceed max_batch {self.config.max_batch}: the daemon "
                "would refuse every one; raise --max-batch or send smaller requests"
            )
        rng = random.Random(traffic.seed)
        if traffic.lengths is not None:
            lengths, drawn = traffic.lengths, np.random.default_rng(traffic.seed)
            self.ragged = ragged_model(self.config, lengths.longest, self.batcher)
            self._draw_length = lambda: int(lengths.sample(drawn, 1)[0])
        if traffic.process is not None:
            self._senders = 1
            arrivals = within(traffic.process, traffic.duration_s).arrivals(traffic.mix, rng)
            self._next_arrival(arrivals, traffic)
        else:
            assert traffic.concurrency is not None
            self._senders = traffic.concurrency
            for _ in range(traffic.concurrency):
                self._client_send(traffic, rng)
        # The daemon's first look comes as its loop starts, `uptime_s` before the traffic; then one every interval.
        interval_s = self.adaptation.interval_s
        self.adaptation.due = -traffic.uptime_s % interval_s if interval_s > 0 else 0.0
        self.loop.at(self.adaptation.due, self._look)

    def result(self, traffic: Traffic) -> SimulationResult:
        """What the run served, once the event loop has run out of events."""
        # As packrat load: an open loop's sending lasts at least the asked duration; a closed loop's, until
        # its clients stop (after their last answer).
        if traffic.process is not None:
            self.tally.send_window_s = max(self.last_send, traffic.duration_s or 0.0)
        else:
            self.tally.send_window_s = self.tally.last_done
        return SimulationResult(self.tally, self.batches, self.batch_inputs, self.plan_changes, self.queue_wait_s)

    def _may_send(self, traffic: Traffic, when: float) -> bool:
        if traffic.requests is not None and self.tally.sent >= traffic.requests:
            return False
        return traffic.duration_s is None or when < traffic.duration_s

    def _next_arrival(self, arrivals: Iterator[tuple[float, int]], traffic: Traffic) -> None:
        """Schedule the process's next arrival (one at a time: the process is endless and drawn lazily)."""
        arrival = next(arrivals, None)
        if arrival is None or not self._may_send(traffic, arrival[0]):
            self._senders = 0
            return
        when, samples = arrival

        def arrive() -> None:
            self._offer(samples, None)
            self._next_arrival(arrivals, traffic)

        self.loop.at(when, arrive)

    def _client_send(self, traffic: Traffic, rng: random.Random) -> None:
        """A closed-loop client sends its next request now, or stops for good."""
        if not self._may_send(traffic, self.clock.now):
            self._senders -= 1
            return
        self._offer(traffic.mix.draw(rng), lambda: self._client_send(traffic, rng))

    def _offer(self, samples: int, answered: Any) -> None:
        """A request reaches the daemon after half the transport cost; the loop takes it in when free (its
        receipt time, from which the daemon counts), then queues it or refuses it at once."""
        self.tally.sent += 1
        sent = self.last_send = self.clock.now
        request = Request(
            b"",
            None,
            answered,
            "float32",
            (samples,),
            None,
            arrived=sent + self.costs.transport_s(samples) / 2,
            length=self._draw_length(),
        )
        self._sent_at[id(request)] = sent

        def read() -> None:
            request.arrived, taken_in = self.daemon_loop.take(self.clock.now, self.costs.read_s(samples))
            self.loop.at(taken_in, queue)

        def queue() -> None:
            if not self.batcher.offer(request):
                self._answered(request, ErrorCode.OVERLOADED.value)
                return
            self._tick()

        self.loop.at(request.arrived, read)

    # -- the daemon's loop, on the virtual clock -------------------------------------------------------
    def _tick(self) -> None:
        """A wake of the daemon's loop: the loop core's tick once the modelled loop is free, then the next
        wake-up it asks for (as the daemon's poll timeout)."""
        now = self.clock.now
        if self.daemon_loop.free_at > now:
            self._wake_at(self.daemon_loop.free_at)  # the loop is still reading or answering
            return
        due = self.adaptation.due
        looking = now >= due
        started = time.perf_counter()
        self.core.tick(now)
        if looking:
            # Real seconds, not virtual: what each look costs the daemon's loop, which the virtual clock hides.
            self.adapt_wall_s.append(time.perf_counter() - started)
        if self.adaptation.due != due:
            self.loop.at(self.adaptation.due, self._look)
        wake = self.core.next_wake()
        if wake is not None and wake != math.inf:
            self._wake_at(wake)

    def _look(self) -> None:
        """The wake at which a look of online adaptation falls due; after the traffic, none (the run ends)."""
        if not self._senders and not self.busy and not self.batcher.queue:
            return
        self._tick()

    def _wake_at(self, when: float) -> None:
        """Tick again at `when`, unless an earlier tick is already due. A batch due "now" by the clock but not
        by the batcher's subtraction (float rounding) is looked at again a nanosecond later rather than left
        waiting for the next event."""
        now = self.clock.now
        if self._tick_at is None or self._tick_at <= now or when < self._tick_at:
            self._tick_at = when if when > now else now + 1e-9
            self.loop.at(self._tick_at, self._tick)

    # -- the workers, as the loop core drives them (loop.Workers) -------------------------------------
    @property
    def serving(self) -> Sequence[WorkerHandle]:
        return self.workers

    @property
    def next_deadline(self) -> float:
        return math.inf  # modelled workers neither hang nor die, and simulated requests have no timeout

    def check(self, now: float) -> None:
        """Nothing to look at: the modelled workers are always ready."""

    def start(self, batch: list[Request], now: float) -> None:
        """The batch's slices as the daemon's splitter divides them, computed in the service model's time;
        the loop starts them, and they come back after the trip to the workers."""
        self.queue_wait_s += sum(now - request.arrived for request in batch)
        rows = sum(request.samples for request in batch)
        if self.ragged is None:
            slices = [(worker.threads, part) for worker, part in self.splitter.choose(self.workers, rows)]
        else:  # sorted and cut by cost as the daemon does, each slice padded to its longest
            free = free_workers(self.workers, self._busy_until, now, self.splitter.oversubscribed)
            cut = sliced(batch, self.ragged, self.splitter, free)
            slices, self._slice_lengths = [(w.threads, part) for w, part, _ in cut.slices], [n for *_, n in cut.slices]
            self._cut = cut if self.ragged.cut_by_cost and not self.splitter.oversubscribed else None
        self.busy = True
        self.batches += 1
        self.batch_inputs += rows
        _, sent = self.daemon_loop.take(now, self.costs.dispatch_ms / 1000.0)
        self.compute(batch, slices, sent)

    def compute(self, batch: list[Request], slices: list[tuple[int, int]], sent: float) -> None:
        """The slices, sent at `sent`, computed alone on the machine (the batch in flight is the only one):
        `_finish` once the last is back. A daemon sharing the machine overrides this (simulate.colocated)."""
        reference = 0 if self.ragged is None else self.ragged.longest
        compute_ms = self.service.batch_ms(slices, self._slice_lengths, reference)
        done = sent + (max(compute_ms) + self.costs.hop_ms) / 1000.0
        if self._cut is not None and len(slices) > 1:
            first = sent + (min(compute_ms) + self.costs.hop_ms) / 1000.0
            if holds_the_queue(first, sent, [done]):  # as the dispatcher's part_answered decides
                self._apart(self._cut, compute_ms, sent)
                return
        self.loop.at(done, partial(self._finish, batch, slices, compute_ms, self._slice_lengths))

    def _apart(self, cut: Cut, compute_ms: list[float], sent: float) -> None:
        """A batch cut by cost: each slice is back at its own time, the batch moves aside at the first, and each
        worker is busy until its own slice is back (simulate.lengths.answered_apart, as the dispatcher does)."""
        ends = [sent + (ms + self.costs.hop_ms) / 1000.0 for ms in compute_ms]
        for (worker, _, _), end in zip(cut.slices, ends, strict=True):
            self._busy_until[id(worker)] = end
        for n, (end, requests, back) in enumerate(answered_apart(cut, ends)):
            slices = [(cut.slices[k][0].threads, cut.slices[k][1]) for k in back]
            lengths, times = [cut.slices[k][2] for k in back], [compute_ms[k] for k in back]
            self.loop.at(end, partial(self._finish, requests, slices, times, lengths, ends_batch=n == 0))

    def _finish(
        self,
        batch: list[Request],
        slices: list[tuple[int, int]],
        compute_ms: list[float],
        lengths: list[int] | None = None,
        ends_batch: bool = True,
    ) -> None:
        """Slices are back (the batch's last, or of a batch cut by cost, any): the loop answers the requests whose
        rows are in one after another when it is free; `lengths`: those slices' padded lengths. `ends_batch`: the
        loop's batch is over (its last slice, or the first of one cut by cost, which then moves aside)."""
        now = self.clock.now
        if ends_batch:
            self.busy = False
        self.batcher.answered(sum(request.samples for request in batch), now)  # as the daemon's replies tell it
        started, _ = self.daemon_loop.take(now, self.costs.answer_s(len(batch)))
        fixed_ms, per_request_ms = self.costs.answer_ms
        for k, request in enumerate(batch, start=1):
            self._answered(request, at=started + (fixed_ms + per_request_ms * k) / 1000.0)
        padded = lengths or [0] * len(slices)
        for (threads, rows), ms, length in zip(slices, compute_ms, padded, strict=True):
            if self.ragged is None or length == self.ragged.longest:  # production's table is the profile's length
                self.adaptation.production.observe(threads, rows, ms, now)
        self._tick()

    def _answered(self, request: Request, error: str | None = None, at: float | None = None) -> None:
        """The client has its answer (after the other half of the transport cost), counted as packrat load
        counts it; a closed-loop client then sends again. `at`: when the daemon replied (default now)."""
        when = (self.clock.now if at is None else at) + self.costs.transport_s(request.samples) / 2
        sent = self._sent_at.pop(id(request))
        if error is None:
            self.tally.answered(when - sent, request.samples, when)
        else:
            self.tally.failed(error, when)
        if request.request_id is not None:
            self.loop.at(when, request.request_id)

    def _served(self) -> tuple[Plan, Profile]:
        return self.plan, self.profile

    def _refuse(self, request: Request, code: ErrorCode, _message: str) -> None:
        self._answered(request, code.value)

    def _decided(self, plan: Plan, reason: str) -> None:
        """The reconciler's switch: the old plan's workers serve until the new plan's are ready (the tuner's
        cool-down keeps a second decision from coming meanwhile)."""
        self.loop.at(self.clock.now + self.costs.switch_ms / 1000.0, lambda: self._switch(plan, reason))

    @property
    def fork_s(self) -> float:
        """A fork's time, as the reconciler measures it: the switch's (adapt.tuner.SwitchCost)."""
        return self.costs.switch_ms / 1000.0

    def forks_needed(self, plan: Plan) -> list[int]:
        return forks_for(plan, self.allocator, Counter((w.threads, w.cores) for w in self.workers))

    def _switch(self, plan: Plan, reason: str) -> None:
        """As the daemon's switch: the new plan's layouts on cores, and the splitter for them."""
        self.plan = plan
        layouts = plan_slots(plan, self.allocator)
        needed: Counter[tuple[int, tuple[int, ...]]] = Counter()
        for layout in layouts:
            needed |= Counter(layout)  # a worker serves every layout with its exact (threads, cores)
        generation = len(self.plan_changes) + 1
        self.workers = [
            WorkerHandle(k, threads, cores, generation, WorkerState.READY) for k, (threads, cores) in
            enumerate(sorted(needed.elements(), key=lambda slot: (-slot[0], slot[1])))
        ]  # fmt: skip
        profile = self.adaptation.planning_profile(self.profile)
        self.splitter = Splitter(profile, plan.split, layouts, plan.oversubscribed, self.config.min_split_gain)
        self.plan_changes.append({"t_s": round(self.clock.now, 6), "reason": reason, "plan": plan.describe()})
        log.info("simulated %s at %.3f s: %s", reason, self.clock.now, plan.describe())
