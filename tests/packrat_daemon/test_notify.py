"""sd_notify against a datagram socket standing where systemd's would be."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from packrat_daemon.notify import READY, STOPPING, sd_notify


@pytest.fixture
def receiver() -> Iterator[socket.socket]:
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.settimeout(5)
        yield sock


def test_a_path_socket_gets_each_state(
    receiver: socket.socket, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = str(tmp_path / "notify.sock")
    receiver.bind(path)
    monkeypatch.setenv("NOTIFY_SOCKET", path)
    sd_notify(READY)
    sd_notify(STOPPING)
    assert receiver.recv(4096) == b"READY=1\nSTATUS=serving"
    assert receiver.recv(4096) == b"STOPPING=1"


def test_an_at_sign_names_an_abstract_socket(receiver: socket.socket, monkeypatch: pytest.MonkeyPatch) -> None:
    name = f"packrat-test-notify-{os.getpid()}"
    receiver.bind("\0" + name)
    monkeypatch.setenv("NOTIFY_SOCKET", "@" + name)
    sd_notify(READY)
    assert receiver.recv(4096) == b"READY=1\nSTATUS=serving"


def test_a_socket_that_is_gone_is_not_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "nobody-listens.sock"))
    sd_notify(READY)  # the daemon keeps serving whether or not systemd hears it


def test_reload_notifications_carry_monotonic_time_and_plan(tmp_path, monkeypatch):
    """Type=notify-reload rejects RELOADING=1 without MONOTONIC_USEC; READY=1 afterwards names the plan."""
    import socket as _socket
    import time as _time

    from packrat_daemon.notify import reloaded, reloading, sd_notify

    path = str(tmp_path / "notify")
    with _socket.socket(_socket.AF_UNIX, _socket.SOCK_DGRAM) as server:
        server.bind(path)
        monkeypatch.setenv("NOTIFY_SOCKET", path)
        before = _time.clock_gettime_ns(_time.CLOCK_MONOTONIC) // 1000
        sd_notify(reloading())
        sd_notify(reloaded("2×⟨1 threads⟩"))
        first = dict(line.split("=", 1) for line in server.recv(4096).decode().splitlines())
        second = server.recv(4096).decode()
    assert first["RELOADING"] == "1"
    assert before <= int(first["MONOTONIC_USEC"]) <= _time.clock_gettime_ns(_time.CLOCK_MONOTONIC) // 1000
    assert second == "READY=1\nSTATUS=serving 2×⟨1 threads⟩"
