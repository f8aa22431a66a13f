"""The signal table and its queue: a handler only appends an event and wakes the loop; every catchable signal
that would kill the daemon by default is handled, or left at a default chosen on purpose."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from pathlib import Path

import numpy as np
import pytest

from packrat_daemon.signals import DEFAULTS, IGNORE, SIGNALS, SILENT, STATUS, SignalQueue
from packrat_daemon.wire.client import AsyncClient
from tests.helpers.daemons import running_daemon
from tests.helpers.signals import HANDLED, own_handlers


def test_signal_queue_turns_signals_into_events_and_restores_the_handlers() -> None:
    assert set(HANDLED) == set(SIGNALS) | set(SILENT)
    queue = SignalQueue()
    with own_handlers() as ours:
        with queue.installed():
            os.kill(os.getpid(), signal.SIGHUP)
            os.kill(os.getpid(), signal.SIGTERM)
            os.kill(os.getpid(), signal.SIGINT)
            os.kill(os.getpid(), signal.SIGQUIT)
            assert list(queue.events) == ["reload", "stop", "stop", "stop"]
            assert queue.wake_r.recv(16)  # the loop's poll would have woken
            assert signal.getsignal(signal.SIGPIPE) == signal.SIG_IGN
        assert {signum: signal.getsignal(signum) for signum in HANDLED} == ours
    assert queue.wake_r.fileno() == -1  # the wake-up pipe lives as long as the handlers


def test_every_catchable_signal_is_handled_or_left_at_a_chosen_default() -> None:
    # Issue 27, 8: SIGUSR1, SIGUSR2, SIGALRM and SIGQUIT killed the daemon at once, requests in flight lost.
    catchable = set(range(1, signal.SIGRTMAX + 1)) - {signal.SIGKILL, signal.SIGSTOP} - {32, 33}  # glibc's own
    assert catchable - set(SIGNALS) - set(SILENT) - set(DEFAULTS) == set()
    assert not set(SIGNALS) & set(DEFAULTS) and not set(SILENT) & set(DEFAULTS)
    for signum in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGALRM, signal.SIGQUIT, signal.SIGRTMIN):
        assert signum in SIGNALS


def test_status_and_ignored_signals_are_logged_in_the_loop_and_interrupt_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    queue = SignalQueue()
    with own_handlers(), queue.installed():
        os.kill(os.getpid(), signal.SIGUSR1)
        os.kill(os.getpid(), signal.SIGUSR2)
        os.kill(os.getpid(), signal.SIGALRM)
        assert list(queue.events) == [STATUS, IGNORE, IGNORE] and not queue.interrupting  # start-up goes on
        status = {"generation": 3, "workers": [{"serving": True}], "queue": {"requests": 2, "accepting": True}}
        with caplog.at_level(logging.INFO, logger="packrat.daemon"):
            while queue.events:
                queue.note(queue.events.popleft(), lambda: status)
        os.kill(os.getpid(), signal.SIGTERM)
        assert queue.interrupting
    assert "SIGUSR1: status: generation 3, 1 worker(s) (1 serving), 2 request(s) queued" in caplog.text
    assert "SIGUSR2 received and ignored" in caplog.text and "SIGALRM received and ignored" in caplog.text


@pytest.mark.slow
def test_a_real_daemon_survives_usr1_usr2_alrm_and_drains_on_sigquit(tmp_path: Path) -> None:
    args = ["--model", "tests.model_factories:slow_mlp", "--policy", "fixed", "--plan", "1x2", "--max-batch", "2"]
    with running_daemon(tmp_path, *args) as (endpoint, process):

        async def requests_then_signals() -> list[object]:
            async with AsyncClient(endpoint, timeout=60) as client:
                x = np.zeros((2, 16), dtype=np.float32)
                pending = [asyncio.ensure_future(client.infer(x)) for _ in range(8)]
                await asyncio.sleep(0.2)  # sent: some queued, one batch in flight
                for signum in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGALRM, signal.SIGRTMIN):
                    process.send_signal(signum)
                await asyncio.sleep(0.5)
                assert process.poll() is None  # each of those killed it at once before
                process.send_signal(signal.SIGQUIT)  # stop: drain what is queued and in flight
                return await asyncio.gather(*pending, return_exceptions=True)

        outcomes = asyncio.run(requests_then_signals())
        assert process.wait(60) == 0
    assert all(isinstance(outcome, np.ndarray) for outcome in outcomes), outcomes  # none lost
    text = (tmp_path / "daemon.log").read_text()
    assert "SIGUSR1: status:" in text and "SIGUSR2 received and ignored" in text and "draining" in text
