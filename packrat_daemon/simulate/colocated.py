"""Several models on one machine: each its own simulated daemon, all on one virtual clock and one machine's cores.

Each model is a `Tenant`, the single-model `Simulation` (the daemon's own loop core, batcher, splitter and
policy) with two differences: it shares the event loop with the others, and its slices run on a
`SharedMachine` instead of alone. The machine is processor sharing with the emulated workers' rules
(`service.ServiceModel`): every busy slice progresses at 1 / slowdown(busy threads), where the busy
threads are those of ALL models' slices running at that moment; so when every model has planned for every
core and two are busy together, each runs at half speed or worse, and when their shares are disjoint,
none slows another beyond the interference of a busier machine. A lone batch on the machine finishes
exactly when `ServiceModel.batch_ms` says (a test checks it), so one tenant is the single-model simulation.

A `Coordinator` divides the cores: it looks every `look_s` at each model's batcher as its daemon's demand
reply gives it (the requests and inputs queued since start, the queue now) and at the batches it started
over the last `window_s` (their sizes: the daemon's live batch distribution), asks its strategy for a
split, and moves cores only when `packrat_daemon.coordinate.watch` (the estimate and rule `packrat
coordinate` applies too) says so: at once for a backlogged model, else for a predicted gain, at most once
per cool-down. Strategies: `joint`
(policies.colocation.plan_jointly), `every` (each model plans for all the machine's cores, as independent
daemons do), `even` (a static even split) and `proportional` (cores in proportion to each model's offered
work, re-split with the same hysteresis). Inside an unchanged
share, a model's plan is re-picked for its live batch sizes under the same gain, as its own adaptation
would (tenants run with the daemon's adaptation off: the coordinator plans for them).
Results are a simulation and say so (`"simulated": true`).
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from packrat_daemon.config import ServeConfig
from packrat_daemon.coordinate.watch import Decision, Reading, Watch, WatchSettings
from packrat_daemon.load.arrivals import BatchMix, PoissonCount, Trace
from packrat_daemon.load.report import Tally
from packrat_daemon.measure.emulation import Interference
from packrat_daemon.requests.batcher import Request
from packrat_daemon.simulate.clock import EventLoop, VirtualClock
from packrat_daemon.simulate.costs import DaemonCosts
from packrat_daemon.simulate.run import FREE, MAX_EVENTS, NO_INTERFERENCE, Simulation, Traffic
from packrat_daemon.simulate.service import ServiceModel
from packrat_daemon.startup import distribution_for
from packrat_daemon.wire.errors import ConfigError
from policies.base import Plan
from policies.colocation import JointPlan, ModelDemand, evaluate, plan_jointly
from policies.packrat import PackratPolicy
from policies.planning.cores import CoreAllocator
from policies.planning.distribution import BatchDistribution
from policies.planning.profile import Profile
from policies.planning.topology import Topology

STRATEGIES = ("joint", "every", "even", "proportional")
WEIGHT_STEP = 20  # the live batch sizes' weights are rounded to 1/20: noise alone never re-plans a model
FINISHED = 1e-9  # ms of work left below which a slice has finished (float rounding of the processor sharing)


# -- traffic whose rate moves ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Phase:
    seconds: float
    rate_rps: float  # 0: silence


def phased(phases: Sequence[Phase], mix: BatchMix, duration_s: float, rng: random.Random) -> Trace:
    """Poisson arrivals whose rate follows `phases`, cycled until `duration_s` (each phase a fixed count,
    as `packrat load` sends a set duration)."""
    if not phases or any(p.seconds <= 0 or p.rate_rps < 0 for p in phases):
        raise ConfigError("each phase needs a positive length and a rate of zero or more requests per second")
    rows: list[tuple[float, int]] = []
    start = 0.0
    while start < duration_s:
        for phase in phases:
            length = min(phase.seconds, duration_s - start)
            if length <= 0:
                break
            if phase.rate_rps > 0:
                process = PoissonCount(phase.rate_rps, length)
                rows.extend((start + t, samples) for t, samples in process.arrivals(mix, rng))
            start += length
    if not rows:
        raise ConfigError("the phases send nothing: give at least one phase a positive rate")
    return Trace(tuple(rows), source="phases")


# -- the machine's cores, shared by every model's slices -------------------------------------------------


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


# -- one model on the machine ---------------------------------------------------------------------------


@dataclass
class SentTally(Tally):
    """`packrat load`'s counts, with when each answered request was sent (to split a run into its phases)."""

    sent_s: list[float] = field(default_factory=list)

    def answered(self, latency_s: float, samples: int, now: float) -> None:
        super().answered(latency_s, samples, now)
        self.sent_s.append(now - latency_s)


class Tenant(Simulation):
    """One model's simulated daemon on a shared machine, planning inside the cores it is given."""

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
        started = self.clock.now
        self.started.append((started, sum(rows for _, rows in slices)))

        def finished(compute_ms: list[float]) -> None:
            self.busy_s += self.clock.now - started
            back = self.clock.now + self.costs.hop_ms / 1000.0
            self.loop.at(back, lambda: self._finish(batch, slices, compute_ms))

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


# -- the coordinator ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CoordinatorSettings:
    strategy: str = "joint"
    look_s: float = 0.5  # how often the coordinator looks at the models' traffic
    batches: int = 100  # each model's last this many batches started …
    window_s: float = 10.0  # … within this last stretch of time give its batch sizes
    min_cores: int = 1
    # The demand estimate and the move rule, packrat coordinate's own (packrat_daemon.coordinate.watch).
    watch: WatchSettings = field(default_factory=WatchSettings)

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ConfigError(f"unknown co-location strategy {self.strategy!r}; choose one of {', '.join(STRATEGIES)}")
        if not (self.look_s > 0 and self.window_s > 0):
            raise ConfigError("the coordinator's look interval and window must be positive")

    def to_json(self) -> dict[str, Any]:
        return {
            "strategy": self.strategy,
            "look_s": self.look_s,
            "batches": self.batches,
            "window_s": self.window_s,
            "min_cores": self.min_cores,
            **self.watch.to_json(),
        }


def even_split(models: int, cores: int) -> list[int]:
    """The cores as evenly as they divide, the first models taking the remainder."""
    base, extra = divmod(cores, models)
    return [base + (1 if k < extra else 0) for k in range(models)]


def proportional_split(loads: Sequence[float], cores: int, min_cores: int = 1) -> list[int]:
    """min_cores each, the rest in proportion to `loads` by largest remainder (even when there is no load)."""
    spare = cores - min_cores * len(loads)
    if spare < 0:
        raise ConfigError(f"{len(loads)} models need {min_cores} core(s) each; the machine has {cores}")
    total = sum(loads)
    if total <= 0:
        return [min_cores + extra for extra in even_split(len(loads), spare)]
    exact = [spare * load / total for load in loads]
    given = [math.floor(x) for x in exact]
    order = sorted(range(len(loads)), key=lambda k: (-(exact[k] - given[k]), k))
    for k in order[: spare - sum(given)]:
        given[k] += 1
    return [min_cores + g for g in given]


def every_core(demands: Sequence[ModelDemand], cores: int) -> JointPlan:
    """Each model planned for all `cores` as if alone: what independent daemons do (the shares overlap)."""
    shares = tuple(evaluate([demand], [cores]).shares[0] for demand in demands)
    total = sum(d.rate_per_s for d in demands)
    weights = [d.rate_per_s / total if total else 1 / len(demands) for d in demands]
    predicted = sum(w * s.predicted_ms for w, s in zip(weights, shares, strict=True) if w > 0)
    return JointPlan(shares, cores, predicted)


class Coordinator:
    """Divides the machine's cores among the tenants by its strategy, looking at their live traffic."""

    def __init__(self, tenants: Sequence[Tenant], cores: int, settings: CoordinatorSettings) -> None:
        self.tenants = list(tenants)
        self.cores = cores
        self.settings = settings
        self.loop = tenants[0].loop
        self.moves: list[dict[str, Any]] = []
        self.replans: list[dict[str, Any]] = []
        self.looks = 0
        self._last_distribution = {t.name: distribution_for(t.config) for t in tenants}
        self._predict = PackratPolicy()
        self.watch = Watch([t.name for t in tenants], settings.watch)
        self.plans = 0  # looks that planned (the others saw no change)

    def begin(self) -> None:
        self._read(0.0)
        self.loop.at(self.settings.look_s, self._look)

    def split(self) -> tuple[int, ...]:
        return tuple(t.share for t in self.tenants)

    def bases(self, now: float) -> list[ModelDemand]:
        """Each model's demand but its rate (the watch's), as its daemon would report it: the batch sizes of
        its last `batches` batches (within `window_s`), rounded so that noise alone never re-plans it."""
        found = []
        for tenant in self.tenants:
            recent = [rows for t, rows in tenant.started if now - self.settings.window_s < t <= now]
            recent = recent[-self.settings.batches :]
            distribution = self._last_distribution[tenant.name]
            if recent:
                counts = Counter(recent)
                rounded = {b: round(WEIGHT_STEP * n / len(recent)) for b, n in counts.items()}
                if not any(rounded.values()):
                    rounded = {max(counts, key=lambda b: (counts[b], b)): 1}
                distribution = self._last_distribution[tenant.name] = BatchDistribution.from_counts(rounded)
            found.append(ModelDemand(tenant.name, tenant.profile, distribution, 0.0))
        return found

    def demands(self, now: float) -> tuple[ModelDemand, ...]:
        """Each model's demand at the slow rule's rate (the watch's estimate from its arrivals)."""
        return self.watch.demands(now, self.bases(now), self.settings.watch.arrivals_s)

    def propose(self, demands: Sequence[ModelDemand]) -> JointPlan:
        strategy, cores = self.settings.strategy, self.cores
        if strategy == "joint":
            return plan_jointly(demands, cores, self.settings.min_cores)
        if strategy == "every":
            return every_core(demands, cores)
        if strategy == "even":
            return evaluate(demands, even_split(len(demands), cores))
        loads = [evaluate([d], [cores]).shares[0].busy_fraction for d in demands]
        return evaluate(demands, proportional_split(loads, cores, self.settings.min_cores))

    def rescore(self, demands: Sequence[ModelDemand]) -> JointPlan:
        if self.settings.strategy == "every":
            return every_core(demands, self.cores)
        return evaluate(demands, self.split(), total_cores=self.cores)

    def _read(self, now: float) -> None:
        """Each model's reading, as its daemon's demand reply gives it: inputs queued since start, queue now."""
        for tenant in self.tenants:
            batcher = tenant.batcher
            reading = Reading(now, batcher.arrived_inputs, batcher.queued_inputs, batcher.arrived_requests)
            self.watch.read(tenant.name, reading)

    def _look(self) -> None:
        if all(t.done for t in self.tenants):
            return  # the traffic is over: no more looks, so the run ends
        now = self.loop.clock.now
        self.looks += 1
        self._read(now)
        # The rule packrat coordinate applies too (packrat_daemon.coordinate.watch): a backlog moves at once to
        # the split for the last second's rates; else worth_moving, at most once per cool-down.
        decision = self.watch.decide(now, self.bases(now), self.propose, self.rescore)
        if decision.planned:
            self.plans += 1
        if decision.move:
            assert decision.current is not None and decision.proposed is not None
            self._move(now, decision)
        elif decision.rule == "hold":
            assert decision.current is not None
            self._replan(now, decision.demands, decision.current)
        self.loop.at(now + self.settings.look_s, self._look)

    def _move(self, now: float, decision: Decision) -> None:
        current, proposed = decision.current, decision.proposed
        assert current is not None and proposed is not None
        before = self.split()
        gain = None if math.isinf(current.predicted_ms) else 1.0 - proposed.predicted_ms / current.predicted_ms
        self.moves.append({
            "t_s": round(now, 3),
            "rule": decision.rule,
            "backlogged": list(decision.backlogged),
            "from": list(before),
            "to": list(proposed.split),
            "predicted_ms_before": _finite(current.predicted_ms),
            "predicted_ms_after": _finite(proposed.predicted_ms),
            "predicted_gain": None if gain is None else round(gain, 4),
        })  # fmt: skip
        self.watch.moved(now, decision)
        for tenant, share in zip(self.tenants, proposed.shares, strict=True):
            if share.cores != tenant.share or share.plan != tenant.plan:
                tenant.assign(share.cores, share.plan, f"coordinate: {share.cores} cores")

    def _replan(self, now: float, demands: Sequence[ModelDemand], current: JointPlan) -> None:
        """Inside unchanged shares: a model's best plan for its live batch sizes, when it pays (as adaptation)."""
        for tenant, demand, share in zip(self.tenants, demands, current.shares, strict=True):
            if share.plan == tenant.plan or demand.rate_per_s == 0:
                continue
            now_ms = self._predict.expected_latency(tenant.profile, tenant.plan, demand.distribution)
            if share.service_ms <= now_ms * (1.0 - self.settings.watch.min_gain):
                self.replans.append({"t_s": round(now, 3), "model": tenant.name, "plan": share.plan.describe()})
                tenant.assign(tenant.share, share.plan, "coordinate: re-plan in its share")


# -- a run ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Model:
    """One model on the machine: its name, serve configuration, profile and what its clients send."""

    name: str
    config: ServeConfig
    profile: Profile
    traffic: Traffic


@dataclass
class ColocatedResult:
    cores: int
    settings: CoordinatorSettings
    tenants: list[Tenant] = field(repr=False)
    coordinator: Coordinator = field(repr=False)
    machine: SharedMachine = field(repr=False)
    duration_s: float = 0.0

    def steady(self, changes: Sequence[float], settle_s: float) -> dict[str, Any]:
        """Percentiles of the requests sent at least `settle_s` after every change of the traffic in `changes`:
        the steady phases, apart from the transients that follow each change."""
        out: dict[str, Any] = {}
        kept_all = []
        for tenant in self.tenants:
            assert isinstance(tenant.tally, SentTally)
            sent = np.asarray(tenant.tally.sent_s)
            near = np.zeros(sent.shape, dtype=bool)
            for change in changes:
                near |= (sent >= change) & (sent < change + settle_s)
            kept = np.asarray(tenant.tally.latencies_s)[~near] * 1000.0
            kept_all.append(kept)
            out[tenant.name] = percentiles(kept)
        out["overall"] = percentiles(np.concatenate(kept_all))
        return out

    def to_json(self) -> dict[str, Any]:
        everything = np.concatenate([np.asarray(t.tally.latencies_s) for t in self.tenants]) * 1000.0
        models = {}
        for tenant in self.tenants:
            assert tenant.traffic is not None  # simulate_colocated gave every tenant its traffic
            report = tenant.result(tenant.traffic).to_json()
            models[tenant.name] = {
                "sent": report["sent"],
                "ok": report["ok"],
                "errors": report["errors"],
                **percentiles(np.asarray(tenant.tally.latencies_s) * 1000.0),
                "busy_fraction": round(tenant.busy_s / self.duration_s, 4) if self.duration_s else None,
                "batches": report["batches"],
                "mean_batch": report["mean_batch"],
                "final_cores": tenant.share,
                "final_plan": tenant.plan.describe(),
            }
        return {
            "simulated": True,
            "cores": self.cores,
            "coordinator": self.settings.to_json(),
            "overall": percentiles(everything),
            "models": models,
            "moves": self.coordinator.moves,
            "moves_made": len(self.coordinator.moves),
            "replans": len(self.coordinator.replans),
            "looks": self.coordinator.looks,
            "plans": self.coordinator.plans,
            "peak_busy_threads": self.machine.peak_busy,
            "oversubscribed_fraction": round(self.machine.oversubscribed_s / self.duration_s, 4)
            if self.duration_s
            else None,
        }


def percentiles(latencies_ms: np.ndarray) -> dict[str, float | None]:
    if not latencies_ms.size:
        return {"p50_ms": None, "p99_ms": None, "mean_ms": None}
    p50, p99 = np.percentile(latencies_ms, [50.0, 99.0]).tolist()
    return {"p50_ms": round(p50, 3), "p99_ms": round(p99, 3), "mean_ms": round(float(latencies_ms.mean()), 3)}


def simulate_colocated(
    models: Sequence[Model],
    cores: int,
    settings: CoordinatorSettings,
    interference: Interference = NO_INTERFERENCE,
    costs: DaemonCosts = FREE,
    max_events: int = MAX_EVENTS,
) -> ColocatedResult:
    """Run the models together on one machine of `cores` under the coordinator's strategy."""
    if not models:
        raise ConfigError("a co-located run needs at least one model")
    if len({m.name for m in models}) != len(models):
        raise ConfigError(f"each co-located model needs its own name; got {[m.name for m in models]}")
    if settings.min_cores * len(models) > cores:
        raise ConfigError(
            f"{len(models)} models need {settings.min_cores} core(s) each, more than the machine's {cores}; "
            "serve fewer models or give more cores"
        )
    loop = EventLoop(VirtualClock())
    machine = SharedMachine(cores, loop)
    start = [cores] * len(models) if settings.strategy == "every" else even_split(len(models), cores)
    tenants = []
    for model, share in zip(models, start, strict=True):
        if model.config.adapt:
            raise ConfigError(
                f"model {model.name}: the coordinator plans for co-located models; run them with adapt off"
            )
        tenant = Tenant(model.name, model.config, model.profile, machine, share, interference, costs)
        tenant.traffic = model.traffic
        tenants.append(tenant)
    coordinator = Coordinator(tenants, cores, settings)
    for tenant, model in zip(tenants, models, strict=True):
        tenant.begin(model.traffic)
    coordinator.begin()
    loop.run(max_events)
    duration = max((t.tally.last_done for t in tenants), default=0.0)
    return ColocatedResult(cores, settings, tenants, coordinator, machine, duration)


def _mean(distribution: BatchDistribution) -> float:
    return sum(batch * weight for batch, weight in distribution.weights)


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


__all__ = [
    "STRATEGIES",
    "ColocatedResult",
    "Coordinator",
    "CoordinatorSettings",
    "Model",
    "Phase",
    "SharedMachine",
    "Tenant",
    "even_split",
    "every_core",
    "phased",
    "proportional_split",
    "simulate_colocated",
]
