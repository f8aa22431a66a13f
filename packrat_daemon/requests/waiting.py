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

**The clients just answered** (`cohort_pays`). The rule above waits only for a next arrival that the mean gap
predicts, so it cannot see that closed-loop clients answered a moment ago send again within a round trip. Without
that, c such clients at batch 1 split into groups that take turns: each request waits for the other group's batch,
then runs its own (at c=2 on one instance, 2 × L(1) per request). So when a batch is answered (`answered`, from the
daemon's reply path and from the simulation's) and the queued q inputs would start without its k inputs' clients,
the queue is held for them when the merged batch, started once they are back (after r, the running mean of an
answer to the next arrival), is predicted to end before the two batches back to back would:
L(q + k) + r < L(q) + L(k) (one batch's own cost saved on the right). In a closed loop every client waits for the
round's last batch, so that end, not each request's wait, is what the next round starts from. Only for a closed
loop, where answered clients come back in under CLOSED_LOOP_SHARE of the mean gap between arrivals (after an
answer, open-loop traffic sends no sooner than at any time); only while the merged batch fits `max_batch`; never
with `max_delay` 0 (it never waits); and never past twice r after the answer (`hold_until`, when the loop wakes
next), so that clients that do not come back stall nothing.

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

# Answered clients that send again within this share of the mean gap between arrivals are a closed loop's: after an
# answer, open-loop (Poisson) traffic comes no sooner than at any other time, a mean gap later.
CLOSED_LOOP_SHARE = 0.25
# Returns seen before the rule trusts their mean: one quick return of Poisson traffic (a tenth of them come within a
# tenth of the mean gap) would make it hold; the mean of five is under a quarter of the gap for 1 in 100 such starts.
RETURNS_TO_TELL = 5

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
        self._holding = False  # the last `due` chose to wait: for the next arrival, or for the clients just answered
        # The clients of the requests last answered (`answered`): in a closed loop they send again within a round trip.
        self._returning = 0  # their inputs not yet back (every arrival counts: the simulation's clients are nameless)
        self._answered_at = 0.0
        self._first_back = False  # the next arrival is the first since that answer: it times the return
        self.return_s = math.inf  # running mean of an answer to the first arrival after it
        self._returns = 0  # how many returns it has seen: a closed loop is told from RETURNS_TO_TELL of them
        self.hold_until = math.inf  # holding for the clients just answered: until then at most

    def _arrived(self, request: Queued) -> None:
        """Update the running means of the gap between arrivals, of the request size and of an answer's return."""
        if self._returning > 0:
            if self._first_back:  # the plain mean of the first few, then a running mean like the gap's
                took, self._returns = max(0.0, request.arrived - self._answered_at), self._returns + 1
                mean = 0.0 if self._returns == 1 else self.return_s
                self.return_s = mean + max(ARRIVAL_WEIGHT, 1.0 / self._returns) * (took - mean)
                self._first_back = False
            self._returning = max(0, self._returning - request.samples)
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
        self.hold_until = math.inf
        if self.cohort_pays(now):
            self._holding, self.hold_until = True, self._answered_at + 2 * self.return_s
        elif self.queued_inputs >= self.max_batch or now - self.queue[0].arrived >= self.max_delay_s:
            self._holding = False
        else:
            self._holding = self.waiting_pays(now)
        return not self._holding

    def answered(self, inputs: int, now: float) -> None:
        """Requests of `inputs` inputs were answered at `now`: a closed loop's clients send again within a round trip,
        and the next batch may wait for them (`cohort_pays`). Answers that come while the last ones' clients are
        still out (the requests of one batch answered one by one, or a batch's slices answered apart) add up."""
        if self._returning > 0 and now <= self._answered_at + 2 * self.return_s:
            self._returning += inputs
        else:
            self._returning = inputs
        self._answered_at, self._first_back = now, True

    def cohort_pays(self, now: float) -> bool:
        """Whether to hold the queued requests for the clients just answered: the merged batch, once they are back,
        is predicted to end before the two batches back to back (the module's docstring); at most until twice their
        usual return time after the answer."""
        k, r = self._returning, self.return_s
        predict = self.predict
        if k <= 0 or predict is None or self._returns < RETURNS_TO_TELL or self.max_delay_s <= 0.0:
            return False
        if now > self._answered_at + 2 * r or not r < CLOSED_LOOP_SHARE * self.mean_gap_s:
            return False  # past the bound, or they come back no sooner than anyone: not a closed loop
        queued = self.queued_inputs
        if queued + k > self.max_batch:
            return False
        now_q, theirs, together = predict(queued), predict(k), predict(queued + k)
        if now_q is None or theirs is None or together is None:
            return False
        return together + max(0.0, self._answered_at + r - now) < now_q + theirs + self.overhead_s

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
        wait for the next arrival, at `hold_until` if for the clients just answered, else at once (its arrival,
        already past). On the caller's clock, real or simulated."""
        if not self.queue:
            return None
        if self._holding and self.hold_until < math.inf:
            return self.hold_until
        return self.queue[0].arrived + (self.max_delay_s if self._holding else 0.0)
