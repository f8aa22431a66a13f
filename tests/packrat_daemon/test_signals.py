"""The signal table and its queue: a handler only appends an event and wakes the loop."""

from __future__ import annotations

import os
import signal

from packrat_daemon.signals import SIGNALS, SignalQueue
from tests.helpers.signals import HANDLED, own_handlers


def test_signal_queue_turns_signals_into_events_and_restores_the_handlers() -> None:
    assert set(SIGNALS) == set(HANDLED)
    queue = SignalQueue()
    with own_handlers() as ours:
        with queue.installed():
            os.kill(os.getpid(), signal.SIGHUP)
            os.kill(os.getpid(), signal.SIGTERM)
            os.kill(os.getpid(), signal.SIGINT)
            assert list(queue.events) == ["reload", "stop", "stop"]
            assert queue.wake_r.recv(16)  # the loop's poll would have woken
        assert {signum: signal.getsignal(signum) for signum in HANDLED} == ours
    assert queue.wake_r.fileno() == -1  # the wake-up pipe lives as long as the handlers
