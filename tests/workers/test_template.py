"""A real template process on a private backend socket: how it reports a worker's exit."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq

from tests.helpers.daemons import daemon_env
from workers import messages

pytestmark = pytest.mark.slow  # starts a template, which imports torch and loads the model


class Backend:
    """The daemon's side of the backend socket, reduced to what these tests need."""

    def __init__(self, socket: zmq.Socket) -> None:
        self.socket = socket

    def send(self, kind: bytes, header: dict[str, Any]) -> None:
        self.socket.send_multipart([messages.TEMPLATE_IDENTITY, *messages.encode(kind, header)])

    def expect(self, identity: bytes, kind: bytes, timeout_s: float = 60.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while self.socket.poll(max(1, int((deadline - time.monotonic()) * 1000))):
            frames = self.socket.recv_multipart()
            got, header, _ = messages.decode(frames[1:])
            if frames[0] == identity and got == kind:
                return header
        raise AssertionError(f"no {kind!r} from {identity!r} within {timeout_s:.0f} s")


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Backend]:
    endpoint = f"ipc://{tmp_path_factory.mktemp('template') / 'backend.ipc'}"
    context = zmq.Context()
    socket = context.socket(zmq.ROUTER)
    socket.setsockopt(zmq.LINGER, 0)
    socket.bind(endpoint)
    command = [
        sys.executable, "-m", "workers.template", "--model", "tests.model_factories:refuses_single_inputs",
        "--backend", endpoint, "--daemon-pid", str(os.getpid()),
    ]  # fmt: skip
    process = subprocess.Popen(command, env=daemon_env(), cwd=Path(__file__).resolve().parents[2])
    backend = Backend(socket)
    try:
        backend.expect(messages.TEMPLATE_IDENTITY, messages.READY)
        yield backend
    finally:
        process.terminate()
        process.wait(30)
        socket.close()
        context.term()


def spawn(template: Backend, worker: int, warmup: list[int]) -> int:
    template.send(messages.SPAWN, {"worker": worker, "threads": 1, "cores": [0], "warmup": warmup})
    return int(template.expect(messages.TEMPLATE_IDENTITY, messages.SPAWNED)["pid"])


def test_worker_that_fails_before_ready_exits_with_the_boot_error_code_and_says_why(template: Backend) -> None:
    spawn(template, 1, warmup=[1])  # the model refuses a batch of one, so the warm-up fails
    report = template.expect(messages.TEMPLATE_IDENTITY, messages.EXITED)
    assert report["worker"] == 1
    assert report["status"] == messages.WORKER_BOOT_ERROR
    assert report["error"] == "ValueError: this model refuses a batch of one input"


def test_worker_killed_after_ready_exits_without_a_boot_report(template: Backend) -> None:
    pid = spawn(template, 2, warmup=[2])
    template.expect(messages.worker_identity(2), messages.READY)
    os.kill(pid, signal.SIGKILL)
    report = template.expect(messages.TEMPLATE_IDENTITY, messages.EXITED)
    assert (report["worker"], report["status"]) == (2, -signal.SIGKILL)
    assert "error" not in report
