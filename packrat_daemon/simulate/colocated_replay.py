"""A candidate split scored by replaying the recent traffic on it: the joint strategy's choice among splits
(policies.colocation_choice.choose) with the simulation's own daemons in place of the closed-form model.

The closed-form score (`predicted_delay`: each model's M/G/1 sojourn, slowed on shared cores by a fixed point
of independent collisions) misses what the daemons do when they collide: each batches more, which shortens
the queue a collision would grow. A `Replay` asks the simulation instead: for a candidate split and a rate
history, it starts one simulated daemon per model (`Tenant`: the daemon's loop core, batcher, splitter and
policy) on a fresh `SharedMachine`, each on its share of the candidate with its plan, sends each model
Poisson requests at the history's rates (its clients' request sizes, `ReplayModel.mix`) and scores the
candidate by the mean latency of every request, answered or refused (a refusal counts as the whole replay).

Every candidate is replayed on the same requests (common random numbers: the same seed per model), so the
choice compares splits, not draws. The cost per replay is bounded: at most `requests` requests over all the
models and at most `horizon_s` of traffic; one `choose` scores at most five splits on two histories, and
identical ones (the even and proportional splits often are) are replayed once (`spent_s` records each
replay's CPU seconds). A history of several stretches (bursty traffic) is replayed stretch by stretch,
its last `horizon_s` only. Starting empty, a replay sees the steady state of a split and the queue it grows
over the horizon, not the queue already there.
"""

from __future__ import annotations

import math
import random
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from packrat_daemon.config import ServeConfig
from packrat_daemon.load.arrivals import BatchMix, PoissonCount, Trace
from packrat_daemon.measure.emulation import DEFAULT_FULL_LOAD, Interference
from packrat_daemon.simulate.clock import EventLoop, VirtualClock
from packrat_daemon.simulate.machine import SentTally, SharedMachine, Tenant
from packrat_daemon.simulate.run import NO_INTERFERENCE, Traffic
from packrat_daemon.wire.errors import ConfigError, PackratError
from policies.colocation import JointPlan, ModelDemand
from policies.colocation_choice import MODE_GAIN, RateHistory, predicted_delay
from policies.planning.profile import Profile

MEMO = 64  # replays kept (a look scores the same splits on the same histories more than once)
MAX_REPLAY_EVENTS = 2_000_000  # a bound on one replay's events, far above what `requests` asks


@dataclass(frozen=True)
class ReplaySettings:
    horizon_s: float = 4.0  # the recent traffic replayed: at most this many seconds …
    requests: int = 400  # … and at most this many requests over all the models
    seed: int = 7
    statistic: str = "mean"  # what a candidate is scored by: "mean" latency, or a percentile ("p95", "p99")
    bursts: bool = False  # replay a bursty history too (else it keeps the closed-form score)
    mode_gain: float = MODE_GAIN  # the least gain of a move between every model on all cores and a split

    def __post_init__(self) -> None:
        if not (self.horizon_s > 0 and self.requests >= 1):
            raise ConfigError("a replay needs a positive horizon and at least one request")
        if self.statistic != "mean" and not (self.statistic.startswith("p") and self.statistic[1:].isdigit()):
            raise ConfigError(f"a replay's statistic is mean or pNN; got {self.statistic!r}")


@dataclass(frozen=True)
class ReplayModel:
    """What a replay needs of one model beyond its demand: its daemon's configuration, its profile and the
    request sizes its clients send (a daemon sees each request's size)."""

    name: str
    config: ServeConfig
    profile: Profile
    mix: BatchMix


class Replay:
    """`policies.colocation_choice.Scorer`: a split's mean latency (ms) on a short replay of a rate history."""

    def __init__(
        self,
        models: Sequence[ReplayModel],
        cores: int,
        settings: ReplaySettings | None = None,
        interference: Interference = NO_INTERFERENCE,
        full_load: float = DEFAULT_FULL_LOAD,
    ) -> None:
        self.full_load = full_load  # the closed-form score's, for the histories not replayed
        self.models = {model.name: model for model in models}
        self.cores = cores
        self.settings = ReplaySettings() if settings is None else settings
        self.interference = interference
        self.spent_s: list[float] = []  # CPU seconds of each replay run (memo hits cost none)
        self._memo: OrderedDict[tuple[object, ...], float] = OrderedDict()

    def __call__(self, plan: JointPlan, demands: Sequence[ModelDemand], history: RateHistory) -> float:
        if len(history.rates) > 1 and not self.settings.bursts:
            return predicted_delay(plan, history, self.full_load)
        rates = self.request_rates(demands, history)
        key = (tuple((s.name, s.cores, s.plan) for s in plan.shares), plan.shared, history.bin_s, rates)
        if key in self._memo:
            self._memo.move_to_end(key)
            return self._memo[key]
        started = time.process_time()
        score = self.replay(plan, history.bin_s, rates)
        self.spent_s.append(time.process_time() - started)
        self._memo[key] = score
        if len(self._memo) > MEMO:
            self._memo.popitem(last=False)
        return score

    def request_rates(self, demands: Sequence[ModelDemand], history: RateHistory) -> tuple[tuple[float, ...], ...]:
        """Each stretch's requests per second, per model: the history's batch rates × the mean batch (inputs),
        over the clients' mean request; rounded so that a memo hit is not missed for float noise."""
        per_batch = [mean_of(d.distribution.weights) / mix_mean(self.models[d.name].mix) for d in demands]
        return tuple(
            tuple(round(rate * k, 3) for rate, k in zip(stretch, per_batch, strict=True)) for stretch in history.rates
        )

    def replay(self, plan: JointPlan, bin_s: float, rates: tuple[tuple[float, ...], ...]) -> float:
        """The candidate's score on the stretches (each bin_s long, the last `horizon_s` of them), replayed."""
        settings = self.settings
        stretches = list(rates)
        keep = max(1, math.ceil(settings.horizon_s / bin_s - 1e-9)) if len(stretches) > 1 else 1
        stretches = stretches[-keep:]
        total = sum(sum(stretch) for stretch in stretches) * (bin_s if len(stretches) > 1 else 1.0)
        if len(stretches) > 1:
            length = bin_s * min(1.0, settings.requests / total) if total > 0 else bin_s
        else:
            length = min(settings.horizon_s, settings.requests / total) if total > 0 else settings.horizon_s
        loop = EventLoop(VirtualClock())
        machine = SharedMachine(self.cores, loop)
        tenants = []
        for m, share in enumerate(plan.shares):
            model = self.models[share.name]
            rng = random.Random(settings.seed * 1000 + m)
            rows: list[tuple[float, int]] = []
            for k, stretch in enumerate(stretches):
                if stretch[m] * length >= 0.5:  # PoissonCount sends round(rate × length), at least one
                    arrivals = PoissonCount(stretch[m], length).arrivals(model.mix, rng)
                    rows.extend((k * length + t, samples) for t, samples in arrivals)
            if not rows:
                continue  # no request to replay for this model: it only idles
            # Started on one core (its own start-up plan there costs nothing), then given the candidate's
            # share and plan at once, as the simulated move would (the switch is free: before any arrival).
            try:
                tenant = Tenant(model.name, model.config, model.profile, machine, 1, self.interference)
            except PackratError:
                tenant = Tenant(model.name, model.config, model.profile, machine, share.cores, self.interference)
            tenant.assign(share.cores, share.plan, "replay")
            tenant.traffic = Traffic(model.mix, process=Trace(tuple(rows), source="replay"))
            tenant.begin(tenant.traffic)
            tenants.append(tenant)
        if not tenants:
            return 0.0
        loop.run(MAX_REPLAY_EVENTS)
        return score_of(tenants, length * len(stretches), settings.statistic)

    @property
    def cost_s(self) -> float:
        return sum(self.spent_s)


def score_of(tenants: Sequence[Tenant], seconds: float, statistic: str) -> float:
    """Every request's latency (ms) over all the tenants, a refused one counting as the whole replay."""
    latencies: list[float] = []
    for tenant in tenants:
        tally = tenant.tally
        assert isinstance(tally, SentTally)
        latencies.extend(1000.0 * s for s in tally.latencies_s)
        latencies.extend([1000.0 * seconds] * sum(tally.errors.values()))
    if not latencies:
        return 0.0
    if statistic == "mean":
        return float(np.mean(latencies))
    return float(np.percentile(latencies, float(statistic[1:])))


def mean_of(weights: Sequence[tuple[int, float]]) -> float:
    return sum(batch * weight for batch, weight in weights)


def mix_mean(mix: BatchMix) -> float:
    total = sum(mix.weights)
    return sum(size * weight for size, weight in zip(mix.sizes, mix.weights, strict=True)) / total
