"""Several models on one machine: each its own simulated daemon, all on one virtual clock and one machine's cores.

Each model is a `Tenant` (simulate.machine), the single-model `Simulation` (the daemon's own loop core,
batcher, splitter and policy) with two differences: it shares the event loop with the others, and its slices
run on a `SharedMachine` instead of alone, where the slow-down comes from the busy threads of all models
together. One tenant is the single-model simulation (a test checks it).

A `Coordinator` divides the cores with `packrat coordinate`'s own loop (packrat_daemon.coordinate.core's
`LookCore`), ticked every `look_s` on the virtual clock with the tenants as its daemons: it reads each model's
batcher as its daemon's demand reply gives it (the requests and inputs queued since start, the queue now) and
the batches it started over the last `window_s` (their sizes: the daemon's live batch distribution), asks its
strategy for a split, and moves cores only when `packrat_daemon.coordinate.watch` says so: at once for a
backlogged model, else for a predicted gain, at most once per cool-down. Strategies
(packrat_daemon.coordinate.strategies): `joint` (policies.colocation.plan_jointly, what `packrat coordinate`
does), `every` (each model plans for all the machine's cores, as independent daemons do), `even` (a static
even split) and `proportional` (cores in proportion to each model's offered work, re-split with the same
hysteresis). Inside an unchanged share, a model's plan is re-picked for its live batch sizes under the same
gain, as its own adaptation would (tenants run with the daemon's adaptation off: the coordinator plans for them).
Results are a simulation and say so (`"simulated": true`).
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from packrat_daemon.config import ServeConfig
from packrat_daemon.coordinate.core import LookCore, finite
from packrat_daemon.coordinate.readings import Reading, WatchSettings
from packrat_daemon.coordinate.strategies import STRATEGIES, Strategy, even_counts
from packrat_daemon.coordinate.watch import Decision, Watch
from packrat_daemon.load.arrivals import BatchMix, PoissonCount, Trace
from packrat_daemon.measure.emulation import Interference
from packrat_daemon.simulate.clock import EventLoop, VirtualClock
from packrat_daemon.simulate.colocated_replay import Replay, ReplayModel, ReplaySettings
from packrat_daemon.simulate.costs import DaemonCosts
from packrat_daemon.simulate.machine import SentTally, SharedMachine, Tenant
from packrat_daemon.simulate.run import FREE, MAX_EVENTS, NO_INTERFERENCE, Traffic
from packrat_daemon.startup import distribution_for
from packrat_daemon.wire.errors import ConfigError
from policies.colocation import ModelDemand
from policies.packrat import PackratPolicy
from policies.planning.distribution import BatchDistribution
from policies.planning.profile import Profile

WEIGHT_STEP = 20  # the live batch sizes' weights are rounded to 1/20: noise alone never re-plans a model


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
    # The joint strategy's candidates scored by a replay of the traffic (simulate.colocated_replay); None:
    # by the closed-form prediction.
    replay: ReplaySettings | None = None

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
            **({} if self.replay is None else {"replay": dataclasses.asdict(self.replay)}),
        }


class Coordinator:
    """The tenants as `packrat coordinate`'s loop drives its daemons (`coordinate.core.Daemons`), looked at
    every `look_s` of the virtual clock. A simulated daemon always answers and always takes its share."""

    def __init__(
        self,
        tenants: Sequence[Tenant],
        cores: int,
        settings: CoordinatorSettings,
        interference: Interference = NO_INTERFERENCE,
    ) -> None:
        self.tenants = list(tenants)
        self.cores = cores
        self.settings = settings
        self.loop = tenants[0].loop
        self.moves: list[dict[str, Any]] = []
        self.replans: list[dict[str, Any]] = []
        self._last_distribution = {t.name: distribution_for(t.config) for t in tenants}
        self._predict = PackratPolicy()
        strategy = Strategy(settings.strategy, cores, settings.min_cores)
        self.replay: Replay | None = None
        self.replay_looks_s: list[float] = []  # per look that replayed: the replays' CPU seconds
        if settings.replay is not None and settings.strategy == "joint":
            models = [ReplayModel(t.name, t.config, t.profile, t.traffic.mix) for t in tenants if t.traffic]
            self.replay = Replay(models, cores, settings.replay, interference)
            replay = settings.replay
            strategy = dataclasses.replace(
                strategy, score=self.replay, mode_gain=replay.mode_gain, judge_bursts=replay.bursts
            )
        self.core = LookCore(self, strategy, settings.watch, self.loop.clock)

    @property
    def watch(self) -> Watch:
        return self.core.watch

    @property
    def looks(self) -> int:
        return self.core.looks

    @property
    def plans(self) -> int:
        """Looks that planned (the others saw no change)."""
        return self.core.plans

    # -- the looks, on the virtual clock ------------------------------------------------------------
    def begin(self) -> None:
        self.core.read()  # the counts at the start, so that the first look has a rate
        self.loop.at(self.settings.look_s, self._look)

    def _look(self) -> None:
        if all(t.done for t in self.tenants):
            return  # the traffic is over: no more looks, so the run ends
        now = self.loop.clock.now
        spent = len(self.replay.spent_s) if self.replay is not None else 0
        self.core.tick()
        if self.replay is not None and len(self.replay.spent_s) > spent:  # the replays' CPU seconds this look
            self.replay_looks_s.append(sum(self.replay.spent_s[spent:]))
        self.loop.at(now + self.settings.look_s, self._look)

    # -- coordinate.core.Daemons --------------------------------------------------------------------
    @property
    def names(self) -> list[str]:
        return [t.name for t in self.tenants]

    @property
    def split(self) -> tuple[int, ...]:
        return tuple(t.share for t in self.tenants)

    @property
    def down(self) -> tuple[str, ...]:
        return ()  # a simulated daemon never goes down

    def look(self) -> Mapping[str, Reading | None]:
        """Each model's reading, as its daemon's demand reply gives it: inputs queued since start, queue now."""
        now = self.loop.clock.now
        return {
            tenant.name: Reading(
                now, tenant.batcher.arrived_inputs, tenant.batcher.queued_inputs, tenant.batcher.arrived_requests
            )
            for tenant in self.tenants
        }

    def away(self, down: Sequence[str]) -> None:
        """Never called: a simulated daemon never goes down."""

    def bases(self) -> list[ModelDemand | None]:
        """Each model's demand but its rate (the watch's), as its daemon would report it: the batch sizes of
        its last `batches` batches (within `window_s`), rounded so that noise alone never re-plans it."""
        now = self.loop.clock.now
        found: list[ModelDemand | None] = []
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

    def move(self, now: float, decision: Decision) -> bool:
        current, proposed = decision.current, decision.proposed
        assert current is not None and proposed is not None
        gain = None if math.isinf(current.predicted_ms) else 1.0 - proposed.predicted_ms / current.predicted_ms
        self.moves.append({
            "t_s": round(now, 3),
            "rule": decision.rule,
            "backlogged": list(decision.backlogged),
            "from": list(self.split),
            "to": list(proposed.split),
            "predicted_ms_before": finite(current.predicted_ms),
            "predicted_ms_after": finite(proposed.predicted_ms),
            "predicted_gain": None if gain is None else round(gain, 4),
            "mode": None if decision.choice is None else decision.choice.mode,
            "choice": None if decision.choice is None else decision.choice.to_json(),
        })  # fmt: skip
        for tenant, share in zip(self.tenants, proposed.shares, strict=True):
            if share.cores != tenant.share or share.plan != tenant.plan:
                tenant.assign(share.cores, share.plan, f"coordinate: {share.cores} cores")
        return True

    def hold(self, now: float, decision: Decision) -> None:
        """Inside unchanged shares: a model's best plan for its live batch sizes, when it pays (as adaptation)."""
        current = decision.current
        assert current is not None
        for tenant, demand, share in zip(self.tenants, decision.demands, current.shares, strict=True):
            if share.plan == tenant.plan or demand.rate_per_s == 0:
                continue
            now_ms = self._predict.expected_latency(tenant.profile, tenant.plan, demand.distribution)
            if share.service_ms <= now_ms * (1.0 - self.settings.watch.min_gain):
                self.replans.append({"t_s": round(now, 3), "model": tenant.name, "plan": share.plan.describe()})
                tenant.assign(tenant.share, share.plan, "coordinate: re-plan in its share")

    def decline(self, why: str) -> None:
        """Nothing: the simulation keeps no status file."""


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
    start = [cores] * len(models) if settings.strategy in ("every", "joint") else even_counts(len(models), cores)
    tenants = []
    for model, share in zip(models, start, strict=True):
        if model.config.adapt:
            raise ConfigError(
                f"model {model.name}: the coordinator plans for co-located models; run them with adapt off"
            )
        tenant = Tenant(model.name, model.config, model.profile, machine, share, interference, costs)
        tenant.traffic = model.traffic
        tenants.append(tenant)
    coordinator = Coordinator(tenants, cores, settings, interference)
    for tenant, model in zip(tenants, models, strict=True):
        tenant.begin(model.traffic)
    coordinator.begin()
    loop.run(max_events)
    duration = max((t.tally.last_done for t in tenants), default=0.0)
    return ColocatedResult(cores, settings, tenants, coordinator, machine, duration)


__all__ = [
    "STRATEGIES",
    "ColocatedResult",
    "Coordinator",
    "CoordinatorSettings",
    "Model",
    "Phase",
    "SharedMachine",
    "Tenant",
    "phased",
    "simulate_colocated",
]
