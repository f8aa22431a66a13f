"""Which endpoint a client sends its next request to."""

from __future__ import annotations

import time
from typing import Any

from packrat_daemon.wire.codec import ErrorCode


class EndpointRing:
    """Round-robin over endpoints, skipping those in back-off (after a timeout, or a SHUTTING_DOWN reply: that
    daemon is draining) while others remain."""

    def __init__(self, count: int, backoff: float) -> None:
        self._backoff = backoff
        self._skip_until = [0.0] * count
        self._next = 0

    def pick(self) -> int:
        count = len(self._skip_until)
        if count == 1:
            return 0  # one endpoint: nothing to balance or skip
        now = time.monotonic()
        for step in range(count):
            index = (self._next + step) % count
            if self._skip_until[index] <= now:
                self._next = index + 1
                return index
        # Every endpoint is in back-off: the one that has waited longest is the best remaining bet.
        index = min(range(count), key=self._skip_until.__getitem__)
        self._next = index + 1
        return index

    def timed_out(self, index: int) -> None:
        self._skip_until[index] = time.monotonic() + self._backoff

    def answered(self, index: int, header: dict[str, Any]) -> None:
        """A reply came; one that says the daemon is draining sends the next requests to the others first."""
        error = header.get("error")
        draining = isinstance(error, dict) and error.get("code") == ErrorCode.SHUTTING_DOWN
        self._skip_until[index] = time.monotonic() + self._backoff if draining else 0.0
