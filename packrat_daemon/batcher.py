"""Dynamic batching: group requests until `max_batch` inputs or `max_delay`, in a bounded queue."""

from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Request:
    """One client's inference request, waiting for or in a batch."""

    identity: bytes
    delimiter: bytes | None
    request_id: Any
    dtype: str
    shape: tuple[int, ...]
    payload: Any  # buffer of the raw rows (a ZeroMQ frame's memoryview: no copy)
    arrived: float = field(default_factory=time.monotonic)
    deadline: float | None = None  # monotonic time (from timeout_ms) past which it is answered TIMEOUT
    answered: bool = False  # answered (TIMEOUT) while its batch was in flight: the result skips it
    retried: bool = False  # its batch lost every worker once and was queued again

    @property
    def samples(self) -> int:
        return self.shape[0]


class Batcher:
    def __init__(self, max_batch: int, max_delay_s: float, max_queued_inputs: int) -> None:
        self.configure(max_batch, max_delay_s, max_queued_inputs)
        self.queue: deque[Request] = deque()
        self.queued_inputs = 0
        # No queued request's deadline is earlier (it may be stale-early after take(): the next expire
        # then walks the queue once for nothing and corrects it). Saves that walk on every loop.
        self._earliest_deadline = math.inf

    def configure(self, max_batch: int, max_delay_s: float, max_queued_inputs: int) -> None:
        """The limits; a reload changes them between two loop wakes, what is queued stays queued."""
        self.max_batch = max_batch
        self.max_delay_s = max_delay_s
        self.max_queued_inputs = max_queued_inputs

    def offer(self, request: Request) -> bool:
        """Queue a request; False when the queue is full (the caller answers OVERLOADED)."""
        if self.queued_inputs + request.samples > self.max_queued_inputs:
            return False
        self.queue.append(request)
        self.queued_inputs += request.samples
        if request.deadline is not None and request.deadline < self._earliest_deadline:
            self._earliest_deadline = request.deadline
        return True

    def due(self, now: float) -> bool:
        """A batch should start now: enough inputs, or the oldest request has waited max_delay."""
        if not self.queue:
            return False
        return self.queued_inputs >= self.max_batch or now - self.queue[0].arrived >= self.max_delay_s

    def take(self) -> list[Request]:
        """Whole requests in arrival order, up to max_batch inputs (a request is never split)."""
        batch: list[Request] = []
        inputs = 0
        while self.queue and inputs + self.queue[0].samples <= self.max_batch:
            request = self.queue.popleft()
            inputs += request.samples
            batch.append(request)
        self.queued_inputs -= inputs
        return batch

    def requeue(self, requests: list[Request]) -> None:
        """Put a batch whose workers were lost back at the head of the queue, in its order (it was admitted
        once, so the queue's bound does not refuse it)."""
        self.queue.extendleft(reversed(requests))
        self.queued_inputs += sum(r.samples for r in requests)
        for request in requests:
            if request.deadline is not None and request.deadline < self._earliest_deadline:
                self._earliest_deadline = request.deadline

    def next_due(self) -> float | None:
        return self.queue[0].arrived + self.max_delay_s if self.queue else None

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
