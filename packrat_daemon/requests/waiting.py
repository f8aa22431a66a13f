"""When a batch starts: at once, unless waiting is predicted to pay.

A batch is due when `max_batch` inputs are queued, when the oldest request has waited `max_delay`, or
at once when waiting is not predicted to pay. The delay's only use is to let a request that is about
to arrive join the batch. Whether it pays is decided from the measured arrival rate and, when the
daemon has a profile, the latency L(b) of a batch of b inputs: the profile's compute time under the
plan, plus the daemon's own cost per batch (the hops to and from the workers, gathering, replying),
measured on every answer as its time from dispatch to reply less the workers' compute time:

- the next request is expected after g, the mean gap between arrivals (an exponentially weighted
  mean); if g is longer than what is left of the delay, or its s inputs (the mean request size) would
  not fit in the batch, waiting cannot pay, so the batch starts now. So a lone request on an idle
  daemon never waits;
- otherwise the two choices are compared by their total predicted latency. Starting now: the q queued
  inputs take L(q), and the request that comes at g waits for the worker until L(q), then takes L(s).
  Waiting: all q + s start at g and take L(q + s). Waiting pays when
  q·(g + L(q+s) − L(q)) + s·(L(q+s) − L(s) − max(0, L(q) − g)) < 0,
  that is, when the batch's fixed cost that the newcomer saves is worth more than the wait.
- Without a prediction (no profile) the rate alone decides: wait when a request is expected within
  the delay.

Under load, batches also form without any delay: requests queue while a batch is in flight, and the
next batch takes them together (see docs/serving.md).

The rule is a base of the batcher (`packrat_daemon.requests.batcher.Batcher`), which owns the queue it reads,
so that the queue's bookkeeping and the decision of when to start a batch are read and changed apart.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Protocol

# Weight of the newest gap (and request size) in the running means. A fifth forgets an idle spell within
# a dozen requests of a burst, and one long gap after a burst is enough to stop waiting.
ARRIVAL_WEIGHT = 0.2

Predictor = Callable[[int], "float | None"]  # the predicted latency in seconds of a batch of that many inputs


class Queued(Protocol):
    """What the rule reads of a queued request (`batcher.Request`)."""

    @property
    def arrived(self) -> float: ...

    @property
    def samples(self) -> int: ...


class WaitingRule:
    """The running means of arrivals and of the daemon's own cost per batch, and the decision they feed: whether
    the queued requests start now or wait for company (the module's docstring)."""

    # The batcher's: its queue and limits, which the rule reads and never changes.
    queue: Sequence[Queued]
    queued_inputs: int
    max_batch: int
    max_delay_s: float

    def __init__(self, predict: Predictor | None) -> None:
        self.predict = predict  # the daemon's L(b) under its current plan (plan_latency); None: the rate alone decides
        self.mean_gap_s = math.inf  # between two requests' arrivals: no arrivals yet, no rate
        self.mean_samples = 1.0
        # Every request and input queued since start: a coordinator differences two readings for the rate its
        # clients offer, which the batches formed hide once the model is short of cores (it batches more).
        self.arrived_requests = 0
        self.arrived_inputs = 0
        self.overhead_s = 0.0  # the daemon's own cost per batch, beyond the workers' compute
        self._last_arrival: float | None = None
        self._holding = False  # the last `due` chose to wait for the next arrival

    def _arrived(self, request: Queued) -> None:
        """Update the running means of the gap between arrivals and of the request size."""
        self.arrived_requests += 1
        self.arrived_inputs += request.samples
        last, self._last_arrival = self._last_arrival, request.arrived
        if last is not None:
            gap = max(0.0, request.arrived - last)
            mean = self.mean_gap_s
            self.mean_gap_s = gap if mean == math.inf else mean + ARRIVAL_WEIGHT * (gap - mean)
        self.mean_samples += ARRIVAL_WEIGHT * (request.samples - self.mean_samples)

    def served(self, overhead_s: float) -> None:
        """An answer's time from dispatch to reply less its batch's compute time: the running mean of the
        daemon's own cost per batch."""
        self.overhead_s += ARRIVAL_WEIGHT * (max(0.0, overhead_s) - self.overhead_s)

    def due(self, now: float) -> bool:
        """A batch should start now: enough inputs, the oldest request has waited max_delay, or waiting
        is not predicted to pay (a lone request never waits)."""
        if not self.queue:
            return False
        if self.queued_inputs >= self.max_batch or now - self.queue[0].arrived >= self.max_delay_s:
            self._holding = False
        else:
            self._holding = self.waiting_pays(now)
        return not self._holding

    def waiting_pays(self, now: float) -> bool:
        """Whether holding the queued requests for the next arrival is predicted to lower their total
        latency (the rule is in the module's docstring)."""
        gap = self.mean_gap_s
        if not self.queue or gap > self.queue[0].arrived + self.max_delay_s - now:
            return False  # the next request is not expected before the delay runs out
        queued = self.queued_inputs
        size = max(1, round(self.mean_samples))
        if queued + size > self.max_batch:
            return False  # the next request would not fit: it starts a batch of its own anyway
        predict = self.predict
        if predict is None:
            return True
        now_q, alone, together = predict(queued), predict(size), predict(queued + size)
        if now_q is None or alone is None or together is None:
            return True
        overhead = self.overhead_s
        now_q, alone, together = now_q + overhead, alone + overhead, together + overhead
        change = queued * (gap + together - now_q) + size * (together - alone - max(0.0, now_q - gap))
        return change < 0.0

    def next_due(self) -> float | None:
        """When the head of the queue falls due, as the last `due` decided: after max_delay if it chose to
        wait, else at once (its arrival, already past). On the caller's clock, real or simulated."""
        if not self.queue:
            return None
        return self.queue[0].arrived + (self.max_delay_s if self._holding else 0.0)
