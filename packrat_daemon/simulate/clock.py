"""A virtual clock and the discrete-event loop that advances it.

Time jumps from one event to the next instead of passing, so an hour of traffic costs only the work of
handling its events. Events due at the same instant run in the order they were scheduled, which keeps a
run a pure function of its inputs (the same seed gives the same result).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable

from packrat_daemon.wire.errors import ConfigError

Action = Callable[[], None]


class VirtualClock:
    """Seconds since the start of the run; callable, so it stands in wherever time.monotonic is injected."""

    def __init__(self, start: float = 0.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now


class EventLoop:
    def __init__(self, clock: VirtualClock) -> None:
        self.clock = clock
        self._queue: list[tuple[float, int, Action]] = []
        self._order = itertools.count()  # ties at one instant: first scheduled, first run
        self.handled = 0

    def at(self, when: float, action: Action) -> None:
        """Run `action` at virtual time `when` (now, if `when` has passed: events never run in the past)."""
        heapq.heappush(self._queue, (max(when, self.clock.now), next(self._order), action))

    def run(self, max_events: int) -> None:
        """Handle events in time order until none is left. `max_events` bounds the loop: a run that would
        handle more raises ConfigError instead of running for ever."""
        while self._queue:
            if self.handled >= max_events:
                raise ConfigError(
                    f"the simulation handled {max_events:,} events without finishing; shorten the duration, "
                    "lower the rate or give a number of requests"
                )
            when, _, action = heapq.heappop(self._queue)
            self.clock.now = when
            self.handled += 1
            action()
