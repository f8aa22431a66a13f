"""What the dispatcher makes of a batch: its slices on the workers (`Job`), the batch in flight, and each
request's answer once every slice is back (`Completed`, which the frontend replies with and the metrics,
tallies and request log read).

They live apart from the dispatcher so that what reads an answer need not import what makes it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from packrat_daemon.fleet.pool import WorkerHandle
    from packrat_daemon.fleet.verdicts import Looked
    from packrat_daemon.requests.batcher import Request
    from packrat_daemon.requests.ragged import Ragged


@dataclass
class Job:
    id: int
    batch: InFlightBatch
    offset: int  # first row of the batch this job covers
    rows: int
    worker: WorkerHandle
    sent_at: float
    # Monotonic time past which its worker is looked at, maybe hung: at first the spin floor or the margin times the
    # prediction (Timing.clocks), then each look's next.
    deadline: float
    predicted_ms: float | None  # the profile's latency for this slice; None when it has none
    hedge_at: float = math.inf  # monotonic time past which its rows are also sent to an idle worker
    twin: Job | None = None  # the same rows on another worker once hedged: the first answer is used
    output: np.ndarray | None = None
    compute_ms: float = 0.0
    # The worker's CPU seconds (WorkerHandle.cpu_seconds) past which, still unanswered, it spins on this slice: the
    # CPU the prediction implies times the margin, after that of the slices it already held. math.inf: no budget
    # (no prediction, or its CPU time could not be read).
    cpu_limit: float = math.inf
    cpu_budget: float = math.inf  # this slice's own part of it, in CPU seconds
    cpu_at_send: float | None = None  # the worker's CPU seconds when it was sent, where a budget was set
    # As cpu_limit and cpu_budget, with the spin floor: a worker that used this while computing without a pause spins.
    spin_limit: float = math.inf
    spin_budget: float = math.inf
    # The deadline proper (Dispatcher.deadline): past it every rule of the hang applies; before it (from `deadline`),
    # only the spin's. 0: from `deadline` on (a job built elsewhere, as the tests do).
    watched_at: float = 0.0
    # When its clocks (deadline, first look, hedge, CPU budgets) start: its sending, or, queued behind the worker's
    # earlier slices, their deadlines; moved to the earlier slice's answer when that comes first (Dispatcher.on_result).
    clock_from: float = 0.0
    # Production's prediction where the profile has none (Timing.learned_ms): it sets the deadline and the CPU
    # budget as the profile's would (with the learned floor), never a hedge, and is not the profile's in the metrics.
    learned_ms: float | None = None
    # What the looks at it read once it was overdue (verdicts.judge's memory from one look to the next).
    looked: Looked | None = None
    length: int = 0  # the slice's padded length along the model's free axis (0: the model has none)

    @property
    def expected_ms(self) -> float | None:
        """The slice's predicted time: the profile's, else production's, else None."""
        return self.learned_ms if self.predicted_ms is None else self.predicted_ms


@dataclass
class InFlightBatch:
    requests: list[Request]
    dtype: np.dtype
    sample_shape: tuple[int, ...]
    started: float = field(default_factory=time.monotonic)
    jobs: list[Job] = field(default_factory=list)
    unanswered: int = 0  # jobs sent and not answered yet
    deadline: float = math.inf  # the earliest of its requests' deadlines (timeout_ms bounds the whole request)
    aside_at: float = math.inf  # when its unanswered slices are late: it may move aside (Dispatcher.move_aside)
    ragged: Ragged | None = None  # a model of a free axis: its requests sorted by length, each slice padded apart

    @property
    def rows(self) -> int:
        return sum(r.samples for r in self.requests)

    def done(self) -> bool:
        return self.unanswered == 0


@dataclass(slots=True)  # not frozen: one is built per request answered
class Completed:
    request: Request
    output: np.ndarray
    queue_ms: float
    compute_ms: float
    jobs: Sequence[Job]  # the batch's slices (worker, rows, predicted and measured ms): the request log, metrics

    @property
    def instances(self) -> int:
        """How many workers shared the batch."""
        return len(self.jobs)
