"""What a coordinator reads of each model: its daemon's cumulative counts at each look, and the rates they give.

`Readings` keeps each model's readings (the requests and inputs its daemon has queued since start, and its
queue at that instant) and reads from them what the rules of packrat_daemon.coordinate.watch and the choice
among splits of packrat_daemon.coordinate.choosing both need: the inputs offered per second over a window
(whatever the split served: the batches a daemon forms follow its share, its clients' arrivals do not), the
requests counted between two instants, and how far the last second's requests rose above the seconds before.
`WatchSettings` are the rules' settings. Both rule modules build on this one, and it on neither.
"""

from __future__ import annotations

import dataclasses
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from packrat_daemon.wire.errors import ConfigError
from policies.colocation import ModelDemand
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


class Readings:
    """Each model's readings, and the rates and counts read from them."""

    def __init__(self, names: Sequence[str], settings: WatchSettings) -> None:
        if len(set(names)) != len(names) or not names:
            raise ConfigError(f"a watch needs one or more models, each its own name; got {list(names)}")
        self.names = tuple(names)
        self.settings = settings
        self._readings: dict[str, deque[Reading]] = {name: deque() for name in names}
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
        found = []
        for base in bases:
            per_s = self.inputs_per_s(base.name, now, span)
            found.append(dataclasses.replace(base, rate_per_s=per_s / mean_batch(base.distribution)))
        return tuple(found)

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

    def covered(self, now: float, span: float | None = None) -> bool:
        """Whether every model's readings span at least `span` (default fast_s): a rate over the first half
        second of a model's traffic is noise, and a move made on it is undone; one that waits for the whole
        slow window leaves a model that its first share cannot carry queueing for those seconds."""
        need = self.settings.fast_s if span is None else span
        return all(readings and readings[0].t_s <= now - need for readings in self._readings.values())


def mean_batch(distribution: BatchDistribution) -> float:
    """The mean batch of `distribution` (inputs per batch)."""
    return sum(batch * weight for batch, weight in distribution.weights)
