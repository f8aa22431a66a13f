"""One plan change and how long it took, as the reconciler measures it (`fleet.reconciler`): the history `packrat
status` shows, and what the metrics' histogram is handed."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from policies.base import Plan


@dataclass
class Reconfiguration:
    """One plan change and how long it took (time.monotonic() stamps; `wall` is the decision's time.time())."""

    generation: int
    reason: str  # what asked for it: "start", "adapt", "reload", "control: …"
    old: Plan | None
    new: Plan
    decided: float
    wall: float
    predicted_ms: tuple[float, float] | None = None  # expected latency (old plan, new plan) when predicted
    first_serving: float | None = None  # the first worker re-threaded or forked for it took batches
    serving: float | None = None  # every slot of the new plan serves
    retired: float | None = None  # no worker of an older plan is left serving
    superseded: bool = False  # a later plan came before this one was served

    @property
    def done(self) -> bool:
        return self.retired is not None or self.superseded

    def seconds(self, stamp: float | None) -> float | None:
        return None if stamp is None else stamp - self.decided

    def to_json(self) -> dict[str, Any]:
        gain = None
        if self.predicted_ms is not None and self.predicted_ms[0] > 0:
            gain = 1.0 - self.predicted_ms[1] / self.predicted_ms[0]
        return {
            "generation": self.generation,
            "time": self.wall,
            "reason": self.reason,
            "from": None if self.old is None else self.old.describe(),
            "to": self.new.describe(),
            "why": self.new.reason,
            "predicted_ms": None if self.predicted_ms is None else list(self.predicted_ms),
            "predicted_gain": gain,
            "first_serving_s": self.seconds(self.first_serving),
            "serving_s": self.seconds(self.serving),
            "retired_s": self.seconds(self.retired),
            "superseded": self.superseded,
        }
