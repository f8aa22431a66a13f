"""What a simulation's clients send (`Traffic`) and what came back (`SimulationResult`): the simulated daemon
(`run.Simulation`), the co-located one and the benches build their runs from these."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from packrat_daemon.load.arrivals import ArrivalProcess, BatchMix
from packrat_daemon.load.lengths import Lengths
from packrat_daemon.load.report import Tally, summarize
from packrat_daemon.wire.errors import ConfigError


@dataclass(frozen=True)
class Traffic:
    """What the clients send: open loop (`process`) or closed loop (`concurrency` clients, each sending its
    next request when the last is answered); `mix` samples per request; until `duration_s` or `requests`."""

    mix: BatchMix
    process: ArrivalProcess | None = None
    concurrency: int | None = None
    duration_s: float | None = None
    requests: int | None = None
    seed: int = 0
    # How long the daemon has been serving when the first request comes: its adaptation looks come every
    # adapt_interval_s from its own start, so this decides which look first sees enough batches.
    uptime_s: float = 0.0
    # Each request's length along a model's free axis (a text model's tokens), as packrat load's --lengths: the
    # model is then one of that free axis, its longest the distribution's (simulate.lengths). None: fixed shape.
    lengths: Lengths | None = None

    def __post_init__(self) -> None:
        if self.uptime_s < 0:
            raise ConfigError(f"the daemon's uptime when the traffic starts cannot be negative, got {self.uptime_s}")
        if (self.process is None) == (self.concurrency is None):
            raise ConfigError("give the traffic either an arrival process (open loop) or a concurrency (closed loop)")
        if self.concurrency is not None and self.concurrency < 1:
            raise ConfigError(f"the concurrency must be at least 1 client, got {self.concurrency}")
        finite = self.process is not None and self.process.finite
        if self.duration_s is None and self.requests is None and not finite:
            raise ConfigError("the traffic never ends by itself: give a duration or a number of requests")

    def describe(self) -> str:
        sender = self.process.describe() if self.process is not None else f"closed loop, {self.concurrency} client(s)"
        lengths = "" if self.lengths is None else f", lengths {self.lengths.describe()}"
        return f"{sender}, batch {self.mix.describe()}{lengths}"


@dataclass
class SimulationResult:
    tally: Tally = field(repr=False)  # as packrat load counts, in virtual seconds from 0
    batches: int
    batch_inputs: int
    plan_changes: list[dict[str, Any]]
    queue_wait_s: float = 0.0  # summed over the requests batched: what the daemon's packrat_queue_wait_seconds sums

    def to_json(self) -> dict[str, Any]:
        """`packrat load`'s report (its one home: load.report.summarize), then the simulation's own fields."""
        batched = self.tally.ok  # every answered request was batched; refusals never wait
        return summarize(
            self.tally,
            simulated=True,
            batches=self.batches,
            mean_batch=round(self.batch_inputs / self.batches, 4) if self.batches else 0.0,
            queue_wait_mean_ms=round(1000.0 * self.queue_wait_s / batched, 3) if batched else None,
            plan_changes=self.plan_changes,
        )
