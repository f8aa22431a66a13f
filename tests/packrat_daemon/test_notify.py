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
