"""When to move cores: one demand estimate and one move rule for `packrat coordinate` and its simulation.

The co-location loop (packrat_daemon.coordinate.core's `LookCore`, which `packrat coordinate` and its
simulation both tick) feeds a `Watch` the same readings of each model at each look: the
requests and inputs its daemon has queued since start (cumulative counts, so that two readings give the rate
its clients offer over the time between them, whatever the split) and the inputs queued at that instant.
The `Watch` turns them into each model's demand and decides whether to move, by two rules:

- **The slow rule**, for drifting traffic: each model's rate over the last `arrivals_s`; the models are
  re-planned only when some rate or mean batch moved by more than `change` since the last plan (so noise
  alone does not re-plan a steady phase), and cores move only when `policies.colocation.should_move` says
  so: a predicted gain of `min_gain` or more (and, if `noise_gain` is set, of more than the noise of the
  rates it was predicted from), at most once per `cooldown_s` unless the current split cannot carry the load.
- **The fast rule**, for a model whose traffic jumped: a rate that moved from half to four fifths of a
  model's capacity takes one and a half to two seconds of arrivals to tell apart at 3σ, and a model left
  that long on a share too small for it builds a queue that decides the p99 of the whole run. So the fast
  rule acts on one second, and asks three things of it at once: the model's queue holds more than
  `backlog` times what arrives during one batch's service on its share (a share that carries its arrivals
  takes what is queued into its next batch), at `backlog_looks` looks in a row; its share cannot carry the
  rate of the last `fast_s` (`saturating`); and that second's requests exceed the rate of the `arrivals_s`
  before it by `rise_z` standard deviations. A model that passes all three is backlogged: the models are
  planned at once for each one's rate over the last `fast_s` and cores move to that split, with no
  cool-down and no gain threshold beyond `worth_moving`'s, when it gives the backlogged model more cores
  and the traffic shifted: every model that gives cores up had its requests over that second fall by
  `fall_z` standard deviations. A rise the donors do not mirror waits until the backlog has held one look
  more; one second of Poisson arrivals cannot tell a clump from a phase change, but a clump rarely comes
  just as the other models' traffic falls.
  That moment is the traffic's change point: until `arrivals_s` have passed, every rate (the slow rule's
  too) is read over the time since `fast_s` before it, so the slow rule does not move the cores back on a
  rate that still averages the phase before.

docs/colocation.md measures what each test costs and saves.
`Watch` holds the readings; every decision is `policies.colocation`'s, a pure function of the demands.
"""

from __future__ import annotations

import dataclasses
import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from packrat_daemon.coordinate import choosing
from packrat_daemon.wire.errors import ConfigError
from policies.colocation import JointPlan, ModelDemand, should_move, worth_moving
from policies.colocation_choice import Choice
from policies.planning.distribution import BatchDistribution

RATE_FLOOR = 1.0  # batches per second: below it a rate's change is judged against 1/s
KEPT_S = 30.0  # readings older than this (and than every window) are dropped


@dataclass(frozen=True)
class Reading:
    """One model's traffic at one look: its daemon's cumulative count of inputs queued and its queue now."""

    t_s: float  # when it was read, on the watcher's clock (seconds)
    arrived_inputs: int  # every input queued since the daemon started
    queued_inputs: int  # inputs waiting to be batched at that instant
    arrived_requests: int | None = None  # every request queued since start (None: count the inputs instead)

    @property
    def requests(self) -> int:
        return self.arrived_inputs if self.arrived_requests is None else self.arrived_requests


@dataclass(frozen=True)
class WatchSettings:
    arrivals_s: float = 3.0  # the slow rule's rate: the inputs that arrived over this last stretch
    min_gain: float = 0.1  # predicted gain a move must bring (the hysteresis)
    cooldown_s: float = 4.0  # least time between two moves of the slow rule
    # A look plans only when some model's batch rate or mean batch moved by more than this fraction since the
    # last plan: a change detector before the planner, so a steady phase is not re-planned for noise.
    change: float = 0.15
    fast_s: float = 1.0  # the fast rule's rate: the inputs that arrived over this last stretch
    backlog: float = 3.0  # a queue past this many times one batch's arrivals is a backlog …
    backlog_inputs: int = 4  # … and past this many inputs at least (a model at rest queues none)
    backlog_looks: int = 1  # … at this many looks in a row (0: the fast rule is off)
    saturating: bool = True  # … and only a model its share cannot carry at the last fast_s's rate
    # … and only a model whose requests over the last fast_s exceed, by rise_z standard deviations, what the
    # rate over the arrivals_s before them predicts (0: not asked): a jump, not a Poisson clump.
    rise_z: float = 2.0
    # … and, to move at one look, the models whose cores it takes must show the other side of a shift: their
    # requests over the last fast_s fell by fall_z standard deviations (0: not asked). A rise the donors do not
    # mirror (a clump, or new traffic on top of theirs) waits for the backlog to hold one look more.
    fall_z: float = 1.0
    # The slow rule's gain must also exceed noise_gain / √n, n the fewest inputs a model with traffic had in its window:
    # a rate counted from n Poisson arrivals is off by about 1/√n, and so is a gain predicted from it.
    noise_gain: float = 0.0
    # The choice among splits (the joint strategy's; policies.colocation_choice): a candidate must also win at
    # each model's rate noise_z standard deviations (Poisson) above its estimate; bursts are read in stretches
    # of bin_s over the last history_s, and while some model's traffic is bursty the fast rule stands down.
    noise_z: float = 2.0
    history_s: float = 20.0
    bin_s: float = 1.0

    def __post_init__(self) -> None:
        if not (self.arrivals_s > 0 and self.fast_s > 0 and self.cooldown_s >= 0 and self.change >= 0):
            raise ConfigError(
                "the coordinator's rate windows must be positive seconds, its cool-down and change threshold >= 0"
            )
        if not 0 <= self.min_gain < 1:
            raise ConfigError(f"the min gain is a fraction in [0, 1), e.g. 0.1; got {self.min_gain!r}")
        if self.backlog_looks < 0 or self.backlog <= 0 or self.backlog_inputs < 0 or self.noise_gain < 0:
            raise ConfigError(
                "the backlog test needs a positive factor, a number of inputs >= 0 and a number of looks >= 0 "
                "(0 turns the fast rule off), and a noise gain >= 0"
            )
        if self.noise_z < 0 or not (0 < self.bin_s <= self.history_s):
            raise ConfigError("noise_z is standard deviations >= 0; bin_s a positive stretch no longer than history_s")
        if self.rise_z < 0 or self.fall_z < 0:
            raise ConfigError(f"rise_z and fall_z are standard deviations >= 0; got {self.rise_z!r}, {self.fall_z!r}")

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class Decision:
    """What one look decided: `rule` is "backlog" (the fast rule moves), "gain" (the slow rule moves),
    "hold" (planned, not worth a move), "steady" (nothing changed enough to plan) or "gathering" (some model's
    readings do not span the slow rule's window yet: its rate is not planned for)."""

    rule: str
    demands: tuple[ModelDemand, ...]  # the demands planned for (the fast rule's when it moves)
    current: JointPlan | None  # the split served, scored under `demands`
    proposed: JointPlan | None
    backlogged: tuple[str, ...] = ()
    choice: Choice | None = None  # the choice among splits, when the strategy makes one

    @property
    def move(self) -> bool:
        return self.rule in ("backlog", "gain")

    @property
    def planned(self) -> bool:
        return self.rule in ("backlog", "gain", "hold")


Planner = Callable[[Sequence[ModelDemand]], JointPlan]


class Watch:
    """Each model's readings, and the two rules of the module over them."""

    def __init__(self, names: Sequence[str], settings: WatchSettings) -> None:
        if len(set(names)) != len(names) or not names:
            raise ConfigError(f"a watch needs one or more models, each its own name; got {list(names)}")
        self.names = tuple(names)
        self.settings = settings
        self._readings: dict[str, deque[Reading]] = {name: deque() for name in names}
        self._planned: list[tuple[float, float]] | None = None  # (batch rate, mean batch) per model at the last plan
        self.last_move = -math.inf
        self._change_point = -math.inf  # the fast rule's last move: rates are read from fast_s before it

    def read(self, name: str, reading: Reading) -> None:
        readings = self._readings[name]
        if readings and reading.t_s <= readings[-1].t_s:
            return  # the same instant read twice
        if readings and reading.arrived_inputs < readings[-1].arrived_inputs:
            readings.clear()  # its daemon restarted: its count starts again
        readings.append(reading)
        keep = max(KEPT_S, self.settings.arrivals_s, self.settings.fast_s) + 1.0
        while len(readings) > 2 and readings[1].t_s < reading.t_s - keep:
            readings.popleft()

    def forget(self, name: str) -> None:
        """A model whose daemon went down: its readings end there (its count restarts with it)."""
        self._readings[name].clear()

    def inputs_per_s(self, name: str, now: float, span: float) -> float:
        """The inputs offered per second over the last `span` (from the newest reading at least `span` old,
        else the oldest; never before the last change point's window); 0 without two readings."""
        readings = self._readings[name]
        if len(readings) < 2:
            return 0.0
        last = readings[-1]
        start = max(now - span, self._change_point - self.settings.fast_s)
        first = readings[0]
        for reading in readings:
            if reading.t_s > start:
                break
            first = reading
        if first is last:
            first = readings[-2]
        elapsed = last.t_s - first.t_s
        return (last.arrived_inputs - first.arrived_inputs) / elapsed if elapsed > 0 else 0.0

    def demands(self, now: float, bases: Sequence[ModelDemand], span: float) -> tuple[ModelDemand, ...]:
        """`bases` (each model's profile, live batch sizes, target) with the batch rate its arrivals over `span`
        give: inputs per second over the mean batch."""
        return tuple(
            dataclasses.replace(base, rate_per_s=self.inputs_per_s(base.name, now, span) / _mean(base.distribution))
            for base in bases
        )

    def decide(
        self,
        now: float,
        bases: Sequence[ModelDemand],
        propose: Planner,
        rescore: Planner,
        choose: choosing.Chooser | None = None,
    ) -> Decision:
        """One look's decision (the module's two rules). `bases`: each model's demand but its rate, in the
        watch's order; `propose`: the strategy's split for demands; `rescore`: the split served, under them;
        `choose`: the strategy's choice among splits for the slow rule (None: `propose` and should_move)."""
        if tuple(base.name for base in bases) != self.names:
            raise ConfigError(f"the demands must name the watched models in order: {', '.join(self.names)}")
        settings = self.settings
        slow = self.demands(now, bases, settings.arrivals_s)
        served = rescore(slow)
        burst = choose is not None and choosing.bursts(self, now)
        backlogged = () if burst else self.backlogged(served, slow)
        if backlogged:  # the fast rule (never while the traffic comes in bursts it cannot follow)
            fast_move = self._fast(now, bases, slow, served, backlogged, propose, rescore)
            if fast_move.move:
                return fast_move
            backlogged = fast_move.backlogged
        if not self._covered(now):
            return Decision("gathering", slow, served, None, backlogged)
        if burst:  # judged on the bursts' whole pattern: the rates over the history, not the last seconds
            slow = self.demands(now, bases, settings.history_s)
            served = rescore(slow)
        if not self._changed(slow):
            return Decision("steady", slow, served, None, backlogged)
        self._planned = [(d.rate_per_s, _mean(d.distribution)) for d in slow]
        if choose is not None:
            move, choice = choosing.judge(self, now, bases, slow, served, choose, burst)
            return Decision("gain" if move else "hold", slow, served, choice.plan, backlogged, choice)
        proposed = propose(slow)
        gain = settings.min_gain
        counts = [self.inputs_per_s(d.name, now, settings.arrivals_s) * settings.arrivals_s for d in slow]
        counted = [n for n in counts if n > 0]  # a model with no arrivals has no rate to be wrong about
        if settings.noise_gain > 0 and counted:
            gain = min(0.9, max(gain, settings.noise_gain / math.sqrt(max(min(counted), 1.0))))
        if should_move(served, proposed, gain, now - self.last_move, settings.cooldown_s):
            return Decision("gain", slow, served, proposed, backlogged)
        return Decision("hold", slow, served, proposed, backlogged)

    def _fast(
        self,
        now: float,
        bases: Sequence[ModelDemand],
        slow: Sequence[ModelDemand],
        served: JointPlan,
        backlogged: tuple[str, ...],
        propose: Planner,
        rescore: Planner,
    ) -> Decision:
        """The fast rule on the models backlogged at the slow rates: a "backlog" decision, or a "hold" one
        that names the models still backlogged after its tests."""
        settings = self.settings
        fast = self.demands(now, bases, settings.fast_s)
        current = rescore(fast)
        if settings.saturating:
            backlogged = tuple(name for name in backlogged if current.share(name).saturated)
        if settings.rise_z > 0:
            backlogged = tuple(name for name in backlogged if self.rise(name, now) >= settings.rise_z)
        if backlogged:
            proposed = propose(fast)
            grows = any(proposed.share(name).cores > current.share(name).cores for name in backlogged)
            # A rise the donors do not mirror waits for the backlog to hold one look more.
            confirmed = self._shifted(now, current, proposed) or bool(
                self.backlogged(served, slow, settings.backlog_looks + 1, among=backlogged)
            )
            if grows and confirmed and worth_moving(current, proposed, settings.min_gain):
                return Decision("backlog", fast, current, proposed, backlogged)
        return Decision("hold", fast, current, None, backlogged)

    def moved(self, now: float, decision: Decision) -> None:
        """The cores moved as `decision` said, at `now`."""
        self.last_move = now
        self._planned = [(d.rate_per_s, _mean(d.distribution)) for d in decision.demands]
        if decision.rule == "backlog":
            self._change_point = now

    def rise(self, name: str, now: float) -> float:
        """How far the requests of the last fast_s exceed what the rate over the arrivals_s before them
        predicts, in standard deviations of the difference (Poisson counts); 0 without the readings."""
        fast_s, before_s = self.settings.fast_s, self.settings.arrivals_s
        recent = self.count(name, now - fast_s, now)
        earlier = self.count(name, now - fast_s - before_s, now - fast_s)
        if recent is None or earlier is None:
            return 0.0
        (n_recent, s_recent), (n_earlier, s_earlier) = recent, earlier
        if s_recent <= 0 or s_earlier <= 0:
            return 0.0
        rate = n_earlier / s_earlier
        expected = rate * s_recent
        spread = math.sqrt(max(rate, 1.0 / s_earlier) * (s_recent + s_recent**2 / s_earlier))
        return (n_recent - expected) / spread

    def count(self, name: str, start: float, end: float, inputs: bool = False) -> tuple[int, float] | None:
        """Requests (or inputs) counted between the readings nearest `start` and `end` (at or before each),
        and the seconds between those readings; None when no reading is that old."""
        readings = self._readings[name]
        first = last = None
        for reading in readings:
            if reading.t_s <= start + 1e-9:
                first = reading
            if reading.t_s <= end + 1e-9:
                last = reading
        if first is None or last is None:
            return None
        if inputs:
            return last.arrived_inputs - first.arrived_inputs, last.t_s - first.t_s
        return last.requests - first.requests, last.t_s - first.t_s

    def backlogged(
        self, served: JointPlan, demands: Sequence[ModelDemand], looks: int | None = None, among: Sequence[str] = ()
    ) -> tuple[str, ...]:
        """The models (of `among`, if given) whose queue, at each of the last `looks` (`backlog_looks`) readings
        since the last move, held more than `backlog` × the inputs arriving during one batch's service on their
        share (and `backlog_inputs`)."""
        settings = self.settings
        looks = settings.backlog_looks if looks is None else looks
        if settings.backlog_looks == 0:
            return ()
        found = []
        for share, demand in zip(served.shares, demands, strict=True):
            if among and share.name not in among:
                continue
            readings = [r for r in self._readings[share.name] if r.t_s > self.last_move]
            if len(readings) < looks:
                continue
            arriving = demand.rate_per_s * _mean(demand.distribution) * share.service_ms / 1000.0
            limit = max(settings.backlog_inputs, settings.backlog * arriving)
            if all(r.queued_inputs > limit for r in readings[-looks:]):
                found.append(share.name)
        return tuple(found)

    def _shifted(self, now: float, current: JointPlan, proposed: JointPlan) -> bool:
        """Whether every model the move takes cores from shows a fall of `fall_z` over the last fast_s: the
        traffic moved between the models, rather than one model's clump on top of the others' steady load."""
        if self.settings.fall_z <= 0:
            return True
        donors = [share.name for share in proposed.shares if share.cores < current.share(share.name).cores]
        return bool(donors) and all(-self.rise(name, now) >= self.settings.fall_z for name in donors)

    def _covered(self, now: float) -> bool:
        """Whether every model's readings span at least fast_s: a rate over the first half second of a model's
        traffic is noise, and a move made on it is undone; one that waits for the whole slow window leaves a
        model that its first share cannot carry queueing for those seconds."""
        need = self.settings.fast_s
        return all(readings and readings[0].t_s <= now - need for readings in self._readings.values())

    def _changed(self, demands: Sequence[ModelDemand]) -> bool:
        """Whether some model's batch rate or mean batch moved by more than `change` since the last plan."""
        if self._planned is None:
            return True
        change = self.settings.change
        for demand, (rate, mean) in zip(demands, self._planned, strict=True):
            if abs(demand.rate_per_s - rate) > change * max(rate, RATE_FLOOR):
                return True
            if abs(_mean(demand.distribution) - mean) > change * mean:
                return True
        return False

    def replan(self) -> None:
        """Plan at the next look whatever changed (a split that won one look waits for the next)."""
        self._planned = None


def _mean(distribution: BatchDistribution) -> float:
    return sum(batch * weight for batch, weight in distribution.weights)
