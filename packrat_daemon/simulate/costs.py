"""The daemon's own costs, which the simulation adds to the workers' compute.

The daemon serves from one loop in one thread: taking in a request, starting a batch and answering one
each hold that loop, so while it answers one batch it neither reads the next request nor starts the next
batch. The simulation keeps the same single loop (`LoopModel`): every piece of the loop's work starts when
both its event has come and the loop is free. All costs are in ms and 0 unless given; each is measured on
a running daemon (its /metrics `packrat_loop_seconds_total` by phase, see docs/simulation.md), never fitted
to the latencies a simulation is compared with.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from packrat_daemon.wire.errors import ConfigError


@dataclass(frozen=True)
class DaemonCosts:
    # Client to daemon and back, outside the daemon: fixed, per sample (a request's rows travel in and its
    # outputs out, so a bigger request's trip is longer). Half on the way in, half on the way out.
    transport_ms: tuple[float, float] = (0.0, 0.0)
    # Taking in one request (receive, parse, copy its rows into shared memory): fixed, per sample. The
    # daemon's queue wait counts it, as it stamps a request on receipt.
    read_ms: tuple[float, float] = (0.0, 0.0)
    # Starting a batch: choosing its split and sending each slice.
    dispatch_ms: float = 0.0
    # Answering a batch once its last slice is back: fixed, per request (gather, reply, metrics).
    answer_ms: tuple[float, float] = (0.0, 0.0)
    # A slice's trip to its worker and back beyond its compute; the loop is free meanwhile.
    hop_ms: float = 0.0
    # The reconciler's time from a re-plan until the new plan serves (the old plan serves meanwhile); also a
    # fork's time, which adaptation weighs a switch that forks against (adapt.tuner).
    switch_ms: float = 0.0

    def __post_init__(self) -> None:
        for spec in fields(self):
            value = getattr(self, spec.name)
            if min(value if isinstance(value, tuple) else (value,)) < 0:
                raise ConfigError(
                    f"the daemon's cost {spec.name} (--{spec.name.replace('_', '-')}) must be zero or more, got {value}"
                )

    def to_json(self) -> dict[str, Any]:
        return {spec.name: list(value) if isinstance(value := getattr(self, spec.name), tuple) else value
                for spec in fields(self)}  # fmt: skip

    def transport_s(self, samples: int) -> float:
        return (self.transport_ms[0] + self.transport_ms[1] * samples) / 1000.0

    def read_s(self, samples: int) -> float:
        return (self.read_ms[0] + self.read_ms[1] * samples) / 1000.0

    def answer_s(self, requests: int) -> float:
        return (self.answer_ms[0] + self.answer_ms[1] * requests) / 1000.0


class LoopModel:
    """The daemon's one loop on the virtual clock: work is served in the order its events come, each piece
    starting once the loop has finished the one before."""

    def __init__(self) -> None:
        self.free_at = 0.0  # virtual time at which the loop finishes the work it has taken

    def take(self, now: float, seconds: float) -> tuple[float, float]:
        """Hold the loop for `seconds` from `now` or when it is next free: (start, end)."""
        start = max(now, self.free_at)
        self.free_at = start + seconds
        return start, self.free_at
