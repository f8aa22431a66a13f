"""sd_notify and the watchdog against a datagram socket standing where systemd's would be, and a real daemon
that tells such a socket each of its states."""

from __future__ import annotations

import os
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from packrat_daemon.ops.notify import READY, STOPPING, WATCHDOG, Watchdog, reloading, sd_notify, watchdog_interval_s
from tests.helpers.daemons import running_daemon


@pytest.fixture
def receiver() -> Iterator[socket.socket]:
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.settimeout(5)
        yield sock


@pytest.fixture
def listening(receiver: socket.socket, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> socket.socket:
    """`receiver` bound to a path that $NOTIFY_SOCKET names."""
    path = str(tmp_path / "notify.sock")
    receiver.bind(path)
    monkeypatch.setenv("NOTIFY_SOCKET", path)
    return receiver


def pending(sock: socket.socket) -> list[str]:
    """Every datagram already waiting, without blocking."""
    messages = []
    sock.setblocking(False)
    try:
        while True:
            messages.append(sock.recv(4096).decode())
    except BlockingIOError:
        return messages
    finally:
        sock.settimeout(5)


def test_a_path_socket_gets_each_state(listening: socket.socket) -> None:
    sd_notify(READY)
    sd_notify(STOPPING)
    assert listening.recv(4096) == b"READY=1"
    assert listening.recv(4096) == b"STOPPING=1"


def test_an_at_sign_names_an_abstract_socket(receiver: socket.socket, monkeypatch: pytest.MonkeyPatch) -> None:
    name = f"packrat-test-notify-{os.getpid()}"
    receiver.bind("\0" + name)
    monkeypatch.setenv("NOTIFY_SOCKET", "@" + name)
    sd_notify(READY)
    assert receiver.recv(4096) == b"READY=1"


def test_a_socket_that_is_gone_is_not_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "nobody-listens.sock"))
    sd_notify(READY)  # the daemon keeps serving whether or not systemd hears it


def test_reloading_carries_monotonic_time(listening: socket.socket) -> None:
    """Type=notify-reload rejects RELOADING=1 without MONOTONIC_USEC."""
    before = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    sd_notify(reloading())
    first = dict(line.split("=", 1) for line in listening.recv(4096).decode().splitlines())
    assert first["RELOADING"] == "1"
    assert before <= int(first["MONOTONIC_USEC"]) <= time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000


@pytest.mark.parametrize(
    ("environ", "interval"),
    [
        ({}, None),
        ({"WATCHDOG_USEC": "2000000"}, 2.0),
        ({"WATCHDOG_USEC": "2000000", "WATCHDOG_PID": "4242"}, 2.0),
        ({"WATCHDOG_USEC": "2000000", "WATCHDOG_PID": "4243"}, None),  # meant for another process
        ({"WATCHDOG_USEC": "0"}, None),
        ({"WATCHDOG_USEC": "soon"}, None),
        ({"WATCHDOG_USEC": "2000000", "WATCHDOG_PID": "me"}, None),
    ],
)
def test_the_watchdog_interval_is_for_the_process_it_names(environ: dict[str, str], interval: float | None) -> None:
    assert watchdog_interval_s(environ, 4242) == interval


def test_a_healthy_loop_pings_twice_per_interval(listening: socket.socket) -> None:
    watchdog = Watchdog(interval_s=2.0, off_plan_bound_s=30.0)
    for now in (100.0, 100.5, 100.99, 101.0, 101.5, 102.0):
        watchdog.tick(now, lambda: True)
    assert pending(listening) == [WATCHDOG] * 3  # at 100, 101 and 102 s


def test_a_pool_off_its_plan_too_long_gets_no_ping_until_it_recovers(listening: socket.socket) -> None:
    watchdog = Watchdog(interval_s=2.0, off_plan_bound_s=5.0)
    watchdog.tick(0.0, lambda: False)  # a worker just died: its replacement is starting
    watchdog.tick(4.0, lambda: False)
    assert pending(listening) == [WATCHDOG] * 2  # within the bound: the pool is recovering
    watchdog.tick(6.0, lambda: False)
    watchdog.tick(7.0, lambda: False)
    withheld = pending(listening)
    assert len(withheld) == 1 and withheld[0].startswith("STATUS=the pool has not matched its plan for 6 s")
    assert "systemd restarts the daemon" in withheld[0]
    watchdog.tick(8.0, lambda: True)
    assert pending(listening) == [WATCHDOG]


def test_no_watchdog_means_no_ping_and_no_health_check(listening: socket.socket) -> None:
    asked = []
    watchdog = Watchdog(interval_s=None, off_plan_bound_s=5.0)
    watchdog.tick(1e9, lambda: asked.append(True) or True)
    assert pending(listening) == [] and asked == []


@pytest.mark.slow
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="the plan after the reload has two 1-thread workers")
def test_a_real_daemon_tells_systemd_each_state(
    listening: socket.socket, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """READY once the workers serve, STATUS with the plan, WATCHDOG while healthy, RELOADING then READY
    around a SIGHUP that changes the plan, and STOPPING on SIGTERM: all from a real daemon process."""
    monkeypatch.setenv("WATCHDOG_USEC", "400000")  # a ping every 0.2 s
    config = tmp_path / "serve.toml"
    config.write_text('model = "builtin:tiny-mlp"\npolicy = "fixed"\nplan = "2x4"\nmax_batch = 4\n')
    with running_daemon(tmp_path, "--config", str(config)) as (_, process):
        start = wait_for(listening, "STATUS=serving fixed: 1×⟨2 threads, batch 4⟩ with 1 worker(s)")
        start += wait_for(listening, WATCHDOG)  # pings come from the main loop, after READY
        assert start[0] == "STATUS=reconciling the pool to fixed: 1×⟨2 threads, batch 4⟩" and READY in start
        config.write_text('model = "builtin:tiny-mlp"\npolicy = "fixed"\nplan = "2*1x2"\nmax_batch = 4\n')
        process.send_signal(signal.SIGHUP)
        reload = wait_for(listening, "STATUS=serving fixed: 2×⟨1 thread, batch 2⟩")
        states = [m for m in reload if m != WATCHDOG]
        assert [m.split("=")[0] for m in states] == ["RELOADING", "STATUS", "READY", "STATUS"], reload
        assert states[1].startswith("STATUS=reconciling the pool to fixed: 2×⟨1 thread, batch 2⟩")
        assert WATCHDOG in wait_for(listening, WATCHDOG)
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0
    assert STOPPING in pending(listening)


def wait_for(sock: socket.socket, prefix: str, timeout: float = 60.0) -> list[str]:
    """The datagrams received up to and including the first that starts with `prefix`."""
    received: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        received.append(sock.recv(4096).decode())
        if received[-1].startswith(prefix):
            return received
    raise AssertionError(f"no {prefix!r} within {timeout:.0f} s; received {received}")
