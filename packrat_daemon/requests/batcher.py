"""Dynamic batching in a bounded queue: requests are queued, taken in batches of whole requests up to `max_batch`
inputs, shared fairly between clients, and expired past their deadline.

When a batch starts (at once, unless waiting is predicted to pay) is the waiting rule's, in its own module
(`packrat_daemon.requests.waiting`); `Batcher` is one, and owns the queue the rule reads.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from packrat_daemon.requests.waiting import Predictor, WaitingRule
from workers.arena import Inbox

if TYPE_CHECKING:
    from packrat_daemon.fleet.pool import WorkerHandle
    from packrat_daemon.requests.splitter import Splitter

# take() remembers when each client was last served; past this many (far more than max_queue lets wait at once),
# those with nothing queued are forgotten, so that clients coming and going do not grow the table.
REMEMBERED_CLIENTS = 4096


@dataclass
class Request:
    """One client's inference request, waiting for or in a batch."""

    identity: bytes
    delimiter: bytes | None
    request_id: Any
    dtype: str
    shape: tuple[int, ...]
    payload: Any  # the raw rows: a ZeroMQ frame's memoryview, or once queued, if big, a view of the inbox
    arrived: float = field(default_factory=time.monotonic)
    deadline: float | None = None  # monotonic time (from timeout_ms) past which it is answered TIMEOUT
    answered: bool = False  # answered (TIMEOUT) while its batch was in flight: the result skips it
    retried: bool = False  # its batch lost every worker once and was queued again
    # Its batch failed with its rows in the failing slice: it runs in a batch of its own, so that a bad input fails
    # only its own request (the supervisor answers INTERNAL if it fails alone).
    alone: bool = False
    named: bool = False  # a version-2 request: answered with every output by name (packrat_daemon.requests.tensors)
    client: str | None = None  # the end client a gateway named: fairness goes round end clients, not connections
    length: int = 0  # along the model's free axis (a text model's tokens); 0: the model has none (requests.ragged)

    @property
    def fair_key(self) -> bytes | str:
        """Whom `take` goes round: the end client a gateway named, else the connection (a gateway multiplexes many
        end clients on one connection, and each gRPC handler thread has its own: by connection alone, 6 REST
        clients behind one connection had a seventh of the turns of 6 gRPC clients)."""
        return self.identity if self.client is None else self.client

    @property
    def samples(self) -> int:
        return self.shape[0]


class Batcher(WaitingRule):
    def __init__(
        self, max_batch: int, max_delay_s: float, max_queued_inputs: int, predict: Predictor | None = None
    ) -> None:
        super().__init__(predict)  # the waiting rule's running means (requests.waiting)
        self.oversized: list[Request] = []  # queued before a reload shrank max_batch below them (configure)
        self.configure(max_batch, max_delay_s, max_queued_inputs)
        self.queue: deque[Request] = deque()
        self.queued_inputs = 0
        # No queued request's deadline is earlier (it may be stale-early after take(): the next expire
        # then walks the queue once for nothing and corrects it). Saves that walk on every loop.
        self._earliest_deadline = math.inf
        # take()'s fairness between clients: the number of the batch each client was last served in (those with
        # requests queued, and a few more), and how many batches have been taken.
        self._served_at: dict[bytes | str, int] = {}
        self._batches = 0
        # Big payloads are copied into shared memory as they are queued, so that a worker reads its slice
        # there and dispatch copies nothing (workers.arena).
        self.inbox = Inbox()
        # A model of a free axis (`lengths`): the most padded tokens a batch may hold (0: no such model), and whether
        # only requests of one length may share a batch (a model without an attention mask answers padding).
        self.max_tokens = 0
        self.one_length = False

    def lengths(self, max_tokens: int, masked: bool) -> None:
        """A model of a free axis: a batch holds at most `max_tokens` padded tokens (its samples times its longest
        request), and, unless the model is `masked`, requests of one length only."""
        self.max_tokens = max_tokens
        self.one_length = not masked

    def fits(self, request: Request, inputs: int, longest: int, first: Request | None) -> bool:
        """Whether `request` joins a batch of `inputs` inputs whose longest is `longest` and whose first is `first`."""
        if inputs + request.samples > self.max_batch:
            return False
        if not self.max_tokens:
            return True
        if self.one_length and first is not None and request.length != first.length:
            return False
        return (inputs + request.samples) * max(longest, request.length) <= self.max_tokens

    def configure(self, max_batch: int, max_delay_s: float, max_queued_inputs: int) -> None:
        """The limits; a reload changes them between two loop wakes. What is queued stays queued, except a
        request of more inputs than a smaller max_batch: no batch could ever take it (take() returned an empty
        batch and the dispatcher raised), so it is moved to `oversized` for the loop to answer TOO_LARGE."""
        self.max_batch = max_batch
        self.max_delay_s = max_delay_s
        self.max_queued_inputs = max_queued_inputs
        queue: deque[Request] | None = getattr(self, "queue", None)  # None while __init__ runs
        if queue is not None and any(request.samples > max_batch for request in queue):
            self.oversized += [request for request in queue if request.samples > max_batch]
            self.queue = deque(request for request in queue if request.samples <= max_batch)
            self.queued_inputs = sum(request.samples for request in self.queue)

    def take_oversized(self) -> list[Request]:
        """The queued requests a reload's smaller max_batch left too large for any batch (configure), once."""
        oversized, self.oversized = self.oversized, []
        return oversized

    def reserve_inbox(self, sample_bytes: int) -> int:
        """Page in the inbox's places for requests of 1 to max_batch inputs before any arrives, so that
        the first of each size is not slower (workers.arena); returns the bytes newly reserved."""
        return self.inbox.reserve(samples * sample_bytes for samples in range(1, self.max_batch + 1))

    def offer(self, request: Request) -> bool:
        """Queue a request; False when the queue is full (the caller answers OVERLOADED)."""
        if self.queued_inputs + request.samples > self.max_queued_inputs:
            return False
        placed = self.inbox.place(request.payload, request)
        if placed is not None:
            request.payload = placed
        self.queue.append(request)
        self.queued_inputs += request.samples
        if request.deadline is not None and request.deadline < self._earliest_deadline:
            self._earliest_deadline = request.deadline
        self._arrived(request)
        return True

    def take(self) -> list[Request]:
        """Whole requests up to max_batch inputs (a request is never split), shared fairly between the clients that
        have requests queued. Never empty while anything is queued: no queued request is larger than max_batch
        (offer's caller and configure see to it), and the first is taken even so, for the workers to refuse, rather
        than hand the dispatcher nothing.

        When everything queued fits in one batch, it is taken in arrival order. Otherwise the batch goes round the
        clients (by connection: a request's `identity`), one request each per round, each client's in its own order,
        starting with the client served least recently: a client with many queued requests (say, inputs that make
        the model fail, each costing a failed batch and a run alone) delays another's by a batch and not by its
        whole backlog. A request to run alone is a batch of its own, taken when its client's turn comes first."""
        queue = self.queue
        if len(queue) == 1 or (self.queued_inputs <= self.max_batch and not queue[0].alone):
            batch = self._take_in_order()
        else:
            batch = self._take_fairly()
        self._batches += 1
        served = self._served_at
        for request in batch:
            served[request.fair_key] = self._batches
        if len(served) > REMEMBERED_CLIENTS:  # forget clients with nothing queued (they come back first)
            queued = {request.fair_key for request in self.queue}
            self._served_at = {key: batch_number for key, batch_number in served.items() if key in queued}
        return batch

    def _take_in_order(self) -> list[Request]:
        if self.max_tokens:
            return self._take_by_tokens()
        batch: list[Request] = []
        inputs = 0
        while self.queue and (not batch or inputs + self.queue[0].samples <= self.max_batch):
            if batch and self.queue[0].alone:
                break
            request = self.queue.popleft()
            inputs += request.samples
            batch.append(request)
            if request.alone:
                break
        self.queued_inputs -= inputs
        return batch

    def _take_by_tokens(self) -> list[Request]:
        """In arrival order, every queued request that fits the batch's inputs and tokens (`fits`): one that does not
        is passed over, and heads the queue for the next batch."""
        batch: list[Request] = []
        inputs = longest = 0
        for request in self.queue:
            if batch and (request.alone or batch[0].alone or not self.fits(request, inputs, longest, batch[0])):
                continue
            batch.append(request)
            inputs += request.samples
            longest = max(longest, request.length)
            if inputs >= self.max_batch:
                break
        taken = {id(request) for request in batch}
        self.queue = deque(request for request in self.queue if id(request) not in taken)
        self.queued_inputs -= inputs
        return batch

    def _take_fairly(self) -> list[Request]:
        # Each client's queued requests, in order (a batch's worth at most).
        clients: dict[bytes | str, list[Request]] = {}
        for request in self.queue:
            mine = clients.get(request.fair_key)
            if mine is None:
                clients[request.fair_key] = [request]
            elif len(mine) < self.max_batch:
                mine.append(request)
        if len(clients) == 1:
            return self._take_in_order()
        served = self._served_at
        # Least recently served first; among equals, the one whose oldest request came first (dicts keep order).
        order = sorted(clients, key=lambda key: served.get(key, 0))
        first = clients[order[0]][0]
        batch: list[Request] = [first]
        inputs, longest = first.samples, first.length
        if not first.alone:
            at = dict.fromkeys(order, 0)
            at[order[0]] = 1
            turn = order[1:] + order[:1]  # the first client's next request comes after every other client's first
            while turn and inputs < self.max_batch:
                still = []
                for key in turn:
                    mine, k = clients[key], at[key]
                    while k < len(mine) and mine[k].alone:  # it runs in a batch of its own, when its turn comes
                        k += 1
                    if k == len(mine) or not self.fits(mine[k], inputs, longest, first):
                        continue  # nothing left, or its next does not fit: its later ones do not overtake it
                    batch.append(mine[k])
                    inputs += mine[k].samples
                    longest = max(longest, mine[k].length)
                    at[key] = k + 1
                    still.append(key)
                    if inputs >= self.max_batch:
                        break
                turn = still
        taken = {id(request) for request in batch}
        self.queue = deque(request for request in self.queue if id(request) not in taken)
        self.queued_inputs -= inputs
        return batch

    def cancel(self, identity: bytes, request_id: Any) -> Request | None:
        """Remove the queued request of this id from this connection (its client cancelled it), if it is still
        queued; None when it is not (computing, answered, or never sent)."""
        for request in self.queue:
            if request.identity == identity and request.request_id == request_id and not request.answered:
                self.queue.remove(request)
                self.queued_inputs -= request.samples
                return request
        return None

    def drop(self, identities: set[bytes]) -> list[Request]:
        """Remove the queued requests of these clients (gone: no reply could reach them); those removed."""
        dropped = [request for request in self.queue if request.identity in identities]
        if dropped:
            self.queue = deque(request for request in self.queue if request.identity not in identities)
            self.queued_inputs -= sum(request.samples for request in dropped)
        return dropped

    def requeue(self, requests: list[Request]) -> None:
        """Put a batch whose workers were lost back at the head of the queue, in its order (it was admitted
        once, so the queue's bound does not refuse it)."""
        self.queue.extendleft(reversed(requests))
        self.queued_inputs += sum(r.samples for r in requests)
        for request in requests:
            if request.deadline is not None and request.deadline < self._earliest_deadline:
                self._earliest_deadline = request.deadline

    def expire(self, now: float) -> list[Request]:
        """Remove requests whose client deadline passed before they could start."""
        if now <= self._earliest_deadline:
            return []
        expired = [r for r in self.queue if r.deadline is not None and r.deadline < now]
        self.queue = deque(r for r in self.queue if r.deadline is None or r.deadline >= now)
        self.queued_inputs -= sum(r.samples for r in expired)
        self._earliest_deadline = min((r.deadline for r in self.queue if r.deadline is not None), default=math.inf)
        return expired

    def drain(self) -> list[Request]:
        drained = list(self.queue)
        self.queue.clear()
        self.queued_inputs = 0
        self._earliest_deadline = math.inf
        return drained


def plan_latency(splitter: Callable[[], Splitter], workers: Callable[[], Sequence[WorkerHandle]]) -> Predictor:
    """L(b) in seconds under the daemon's current plan: the slowest slice of the split its splitter picks
    for b inputs on the serving workers (both read at each call: plans and workers change); None where
    the profile does not predict it."""

    def predict(batch: int) -> float | None:
        serving, split = workers(), splitter()
        if not serving:
            return None
        slowest = 0.0
        for worker, rows in split.choose(serving, batch):
            predicted = split.predicted_ms(worker.threads, rows)
            if predicted is None:
                return None
            slowest = max(slowest, predicted)
        return slowest / 1000.0

    return predict
