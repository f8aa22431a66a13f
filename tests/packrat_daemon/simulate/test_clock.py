"""The virtual clock and event loop: time order, ties in scheduling order, no event in the past, a bound."""

from __future__ import annotations

import pytest

from packrat_daemon.simulate.clock import EventLoop, VirtualClock
from packrat_daemon.wire.errors import ConfigError


def test_events_run_in_time_order_and_ties_in_the_order_scheduled():
    clock = VirtualClock()
    loop = EventLoop(clock)
    seen: list[tuple[str, float]] = []
    for name, when in [("c", 2.0), ("a", 1.0), ("b1", 1.5), ("b2", 1.5)]:
        loop.at(when, lambda name=name: seen.append((name, clock())))
    loop.run(max_events=10)
    assert seen == [("a", 1.0), ("b1", 1.5), ("b2", 1.5), ("c", 2.0)]


def test_an_event_scheduled_in_the_past_runs_now():
    clock = VirtualClock()
    loop = EventLoop(clock)
    times: list[float] = []
    loop.at(5.0, lambda: loop.at(1.0, lambda: times.append(clock.now)))
    loop.run(max_events=10)
    assert times == [5.0]


def test_a_run_that_never_ends_is_stopped_with_a_typed_error():
    clock = VirtualClock()
    loop = EventLoop(clock)

    def again() -> None:
        loop.at(clock.now + 1.0, again)

    loop.at(0.0, again)
    with pytest.raises(ConfigError, match="without finishing"):
        loop.run(max_events=100)
    assert loop.handled == 100
