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
`Watch` extends the readings (packrat_daemon.coordinate.readings); every decision is `policies.colocation`'s,
a pure function of the demands.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from packrat_daemon.coordinate import choosing
from packrat_daemon.coordinate.readings import RATE_FLOOR, Readings, WatchSettings, mean_batch
from packrat_daemon.wire.errors import ConfigError
from policies.colocation import JointPlan, ModelDemand, should_move, worth_moving
from policies.colocation_choice import Choice


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


class Watch(Readings):
    """Each model's readings (`Readings`), and the two rules of the module over them."""

    def __init__(self, names: Sequence[str], settings: WatchSettings) -> None:
        super().__init__(names, settings)
        self._planned: list[tuple[float, float]] | None = None  # (batch rate, mean batch) per model at the last plan
        self._recheck = math.inf  # plan again then, whatever changed: the rates after a change, read clean

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
        if not self.covered(now):
            return Decision("gathering", slow, served, None, backlogged)
        if burst:  # judged on the bursts' whole pattern: the rates over the history, not the last seconds
            slow = self.demands(now, bases, settings.history_s)
            served = rescore(slow)
        span = settings.history_s if burst else settings.arrivals_s
        settled = True  # the window holds one traffic: the start's, or the one after a change read clean
        if now >= self._recheck:
            self._recheck = math.inf
        elif self._changed(slow, span):
            # The window that showed the change still holds the traffic before it: plan once more when it
            # holds only the traffic after it, and until then move only to relieve a saturated model.
            settled = self._planned is None
            self._recheck = now + span
        else:
            return Decision("steady", slow, served, None, backlogged)
        self._planned = [(d.rate_per_s, mean_batch(d.distribution)) for d in slow]
        if choose is not None:
            judged = choosing.judge(self, now, slow, served, choose, burst, settled)
            if judged.again:
                self.replan()
            rule = "gain" if judged.move else "hold"
            return Decision(rule, slow, served, judged.choice.plan, backlogged, judged.choice)
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
        self._planned = [(d.rate_per_s, mean_batch(d.distribution)) for d in decision.demands]
        if decision.rule == "backlog":
            self._change_point = now

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
            arriving = demand.rate_per_s * mean_batch(demand.distribution) * share.service_ms / 1000.0
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

    def _changed(self, demands: Sequence[ModelDemand], span: float) -> bool:
        """Whether some model's offered inputs per second moved since the last plan by more than `change`, and
        by more than the noise of two rates counted over `span` (noise_z·√2/√n, n the inputs counted): the
        hysteresis sized from the rates' own noise. Inputs, not batches: the batches a daemon forms follow
        the split served, so a move would otherwise be the change that calls for the next."""
        if self._planned is None:
            return True
        settings = self.settings
        for demand, (rate, mean) in zip(demands, self._planned, strict=True):
            offered, before = demand.rate_per_s * mean_batch(demand.distribution), rate * mean
            counted = offered * span
            noise = settings.noise_z * math.sqrt(2.0 / counted) if counted > 0 else 0.0
            if abs(offered - before) > max(settings.change, noise) * max(before, RATE_FLOOR):
                return True
        return False

    def replan(self) -> None:
        """Plan at the next look whatever changed (a split that won one look waits for the next)."""
        self._planned = None
