"""The co-location loop's core: what one look of a coordinator does, in order, whatever the daemons and the clock.

`LookCore.tick()` runs the phases of a look (as `packrat_daemon.loop.LoopCore` runs a daemon's wake):

1. **read**: each daemon's reading (the inputs and requests queued since it started, its queue now) into the
   `Watch` (`Daemons.look`); a daemon that does not answer has its readings dropped;
2. **away**: while a daemon is down no core moves, and its first share is kept free for its restart
   (`Daemons.away`);
3. **demand**: each model's demand but its rate (profile, live batch sizes, target: `Daemons.bases`); a model
   without a profile keeps the split as it is;
4. **decide**: the watch's two rules (packrat_daemon.coordinate.watch) over the strategy's split
   (packrat_daemon.coordinate.strategies): a backlog moves at once, else a predicted gain worth a move;
5. **move** the cores as decided (`Daemons.move`, which says whether every daemon took its share), or, when the
   split holds, let the daemons re-plan inside their shares (`Daemons.hold`).

`packrat coordinate` (`coordinate.loop.Coordinator`) ticks it every interval on the monotonic clock, with
the daemons over their control sockets (`coordinate.links.ControlDaemons`) as its `Daemons`; its simulation
(`simulate.colocated.Coordinator`) ticks it every `look_s` on a virtual clock, with simulated daemons on one
shared machine. So a change to what a look does, or in which order, is made here, once, for both.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from packrat_daemon.coordinate.readings import Reading, WatchSettings
from packrat_daemon.coordinate.strategies import Strategy
from packrat_daemon.coordinate.watch import Decision, Watch
from packrat_daemon.wire.errors import PackratError
from policies.colocation import JointPlan, ModelDemand
from policies.colocation_choice import Choice

log = logging.getLogger("packrat.coordinate")


class Daemons(Protocol):
    """The co-located daemons as the loop drives them: real ones over their control sockets, or simulated ones
    on a virtual clock. Models are named, and listed, in one order throughout."""

    @property
    def names(self) -> Sequence[str]:
        """The models, in order."""
        ...

    @property
    def split(self) -> Sequence[int]:
        """The cores each model is served on now, in order."""
        ...

    @property
    def down(self) -> Sequence[str]:
        """The models whose daemon is down (did not answer at the last look, or during a move)."""
        ...

    def look(self) -> Mapping[str, Reading | None]:
        """Ask every daemon for its demand: each model's reading, None for one that did not answer (its count
        restarts with it); a model that answered without its counts is left out."""
        ...

    def away(self, down: Sequence[str]) -> None:
        """The daemons of `down` are down: keep their first shares free for their restart."""
        ...

    def bases(self) -> list[ModelDemand | None]:
        """Each model's demand but its rate, in order; None for a model without a profile."""
        ...

    def move(self, now: float, decision: Decision) -> bool:
        """Give each model its share (and plan) of `decision.proposed`, shrinks first; whether all took it."""
        ...

    def hold(self, now: float, decision: Decision) -> None:
        """The split holds: let a model re-plan inside its share for its live batch sizes, when it pays."""
        ...

    def decline(self, why: str) -> None:
        """Why this look moved no cores ("": it moved them)."""
        ...


class LookCore:
    def __init__(
        self, daemons: Daemons, strategy: Strategy, settings: WatchSettings, clock: Callable[[], float]
    ) -> None:
        self.daemons = daemons
        self.strategy = strategy
        self.clock = clock
        self.watch = Watch(list(daemons.names), settings)
        self.joint: JointPlan | None = None  # the split served, scored at the last look that planned
        self.looks = 0
        self.plans = 0  # looks that planned (the others saw no change, or could not plan)
        self.choice: Choice | None = None  # the last choice among splits (the joint strategy's): what it serves

    def tick(self) -> None:
        """One look, phase by phase (the module's docstring)."""
        self.looks += 1
        self.read()
        self.plan()

    def read(self) -> None:
        for name, reading in self.daemons.look().items():
            if reading is None:
                self.watch.forget(name)
            else:
                self.watch.read(name, reading)

    def plan(self) -> None:
        daemons = self.daemons
        down = list(daemons.down)
        if down:
            daemons.away(down)
            daemons.decline(f"{', '.join(down)} down: no core moves until every model is up")
            return
        try:
            found = daemons.bases()
        except PackratError as exc:
            daemons.decline(f"no joint plan: {exc}")
            return
        bases = [base for base in found if base is not None]
        if len(bases) < len(found):
            missing = [name for name, base in zip(daemons.names, found, strict=True) if base is None]
            daemons.decline(f"{', '.join(missing)} serve(s) without a profile: the split stays as it is")
            return
        now, split, strategy = self.clock(), daemons.split, self.strategy
        try:
            # A backlog moves at once, else a predicted gain of min_gain, at most once per cool-down.
            chooser = strategy.choose if strategy.name == "joint" else None
            decision = self.watch.decide(now, bases, strategy.propose, lambda d: strategy.rescore(d, split), chooser)
        except PackratError as exc:
            daemons.decline(f"no joint plan: {exc}")
            log.warning("coordinator: no joint plan: %s", exc)
            return
        self.plans += decision.planned
        self.joint = decision.current
        if decision.choice is not None:
            self.choice = decision.choice
        if decision.move:
            if daemons.move(now, decision):
                self.joint = decision.proposed
                daemons.decline("")
                self.watch.moved(now, decision)
            return
        if decision.rule == "hold":
            daemons.hold(now, decision)
        daemons.decline(declined(decision, self.watch.settings))


def declined(decision: Decision, settings: WatchSettings) -> str:
    """Why a look did not move cores, for the status file."""
    current, proposed = decision.current, decision.proposed
    if decision.backlogged:
        waiting = ", ".join(decision.backlogged)
        return (
            f"{waiting} backlogged, not moved yet: a rise the other models' traffic does not mirror by a fall of "
            f"{settings.fall_z:g}σ waits for the backlog to hold one look more (or the move gains too little)"
        )
    if decision.rule == "gathering":
        return f"waiting for {settings.fast_s:g} s of every model's arrivals before planning on them"
    if current is None or proposed is None:
        return "the traffic has not changed enough since the last plan to plan again"
    if decision.choice is not None:
        return f"serving {decision.choice.describe()}; not worth a move (min gain {settings.min_gain:.0%})"
    return (
        f"the split {list(current.split)} is predicted at {ms(current.predicted_ms)}, the best "
        f"{list(proposed.split)} at {ms(proposed.predicted_ms)}: not worth a move (min gain "
        f"{settings.min_gain:.0%}, at most once per {settings.cooldown_s:g} s)"
    )


def finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def ms(value: float | None) -> str:
    return "saturated" if value is None or math.isinf(value) else f"{value:.3g} ms"
