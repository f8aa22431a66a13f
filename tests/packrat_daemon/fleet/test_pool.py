"""The pool tells a worker that failed before it was ready (a boot failure) from one lost after.

The unit tests feed the pool the template's and workers' messages through a recording backend; the
last two run a real daemon.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from packrat_daemon.fleet.exits import ExitCauses
from packrat_daemon.fleet.pool import Pool, PoolEvent, WorkerHandle, WorkerState
from packrat_daemon.fleet.reconciler import MAX_BOOT_FAILURES
from packrat_daemon.wire.client import Client
from tests.helpers.daemons import PINNED_ARGS, daemon_env, running_daemon
from workers import messages


class RecordingBackend:
    """Stands in for the backend socket: records what the pool sends, every peer is reachable."""

    def __init__(self) -> None:
        self.sent: list[tuple[bytes, bytes, dict[str, Any]]] = []
        self.template = None
        self.closed = False
        self.endpoint = "ipc://recording"

    def send(self, identity: bytes, kind: bytes, header: dict[str, Any], payload: Any = ()) -> bool:
        self.sent.append((identity, kind, header))
        return True

    def close(self, keep_dir: bool = False) -> None:
        self.closed = True


def ready(pool: Pool, worker: WorkerHandle) -> PoolEvent | None:
    header = {"worker": worker.id, "pid": 1000 + worker.id, "threads": worker.threads, "cores": list(worker.cores)}
    return pool.handle(worker.identity, messages.READY, header, [])


def exited(pool: Pool, worker: WorkerHandle, status: int, error: str | None = None) -> PoolEvent | None:
    header: dict[str, Any] = {"worker": worker.id, "pid": 1000 + worker.id, "status": status}
    if error is not None:
        header["error"] = error
    return pool.handle(messages.TEMPLATE_IDENTITY, messages.EXITED, header, [])


@pytest.fixture
def pool() -> Pool:
    return Pool(RecordingBackend())


def test_exit_before_ready_is_a_boot_failure_with_the_workers_reason(pool: Pool) -> None:
    worker = pool.spawn(1, (0,), generation=1)
    event = exited(pool, worker, messages.WORKER_BOOT_ERROR, "ValueError: no such layer")
    assert event is not None and event.kind == "boot-failed"
    assert (pool.boot_failures, pool.boot_error) == (1, "ValueError: no such layer")
    assert worker.state is WorkerState.DEAD and worker.id not in pool.workers


def test_exit_after_ready_is_lost_and_not_a_boot_failure(pool: Pool) -> None:
    worker = pool.spawn(1, (0,), generation=1)
    event = ready(pool, worker)
    assert event is not None and event.kind == "ready"
    event = exited(pool, worker, 1)
    assert event is not None and event.kind == "lost"
    assert pool.boot_failures == 0


def test_boot_failures_count_in_a_row_until_a_worker_is_ready(pool: Pool) -> None:
    for _ in range(3):
        exited(pool, pool.spawn(1, (0,), generation=1), messages.WORKER_BOOT_ERROR, "RuntimeError: out of memory")
    assert pool.boot_failures == 3
    ready(pool, pool.spawn(1, (0,), generation=1))
    assert pool.boot_failures == 0


def test_a_worker_killed_while_starting_is_a_boot_failure_that_names_the_signal(pool: Pool) -> None:
    pool.exits = ExitCauses(lambda: None)  # no cgroup count: the machine's own OOM kills must not word it
    event = exited(pool, pool.spawn(1, (0,), generation=1), -signal.SIGKILL)
    assert event is not None and event.kind == "boot-failed"
    assert pool.boot_error == "the worker was killed (SIGKILL; possibly out of memory) before it was ready"


def test_a_starting_worker_retired_on_purpose_is_no_boot_failure(pool: Pool) -> None:
    worker = pool.spawn(1, (0,), generation=1)
    pool.retire(worker)
    assert exited(pool, worker, -signal.SIGTERM) is None
    assert pool.boot_failures == 0


@pytest.mark.slow
def test_daemon_whose_workers_cannot_start_stops_with_the_models_error(tmp_path: Path) -> None:
    """Before back-off and the give-up rule, this daemon re-forked its worker every 0.1 s for 10 minutes."""
    command = [
        sys.executable, "-m", "packrat_daemon", "serve", "--endpoint", f"ipc://{tmp_path}/front.ipc",
        "--model", "tests.model_factories:refuses_single_inputs", "--policy", "fixed", "--plan", "1x1", *PINNED_ARGS,
    ]  # fmt: skip
    started = time.monotonic()
    done = subprocess.run(command, env=daemon_env(), capture_output=True, text=True, timeout=120)
    output = done.stdout + done.stderr
    assert done.returncode == 2, output
    assert time.monotonic() - started < 60
    assert "workers in a row failed before they were ready" in output
    assert "this model refuses a batch of one input" in output.splitlines()[-1]
    assert output.count("failed to start, ") == MAX_BOOT_FAILURES


@pytest.mark.slow
def test_worker_killed_after_ready_is_replaced(tmp_path: Path) -> None:
    args = ["--model", "builtin:tiny-mlp", "--policy", "fixed", "--plan", "1x1", "--max-batch", "2"]
    with running_daemon(tmp_path, *args) as (endpoint, _), Client(endpoint, timeout=30) as client:
        killed = client.info()["workers"][0]["pid"]
        os.kill(killed, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            live = client.info()["workers"]
            if len(live) == 1 and live[0]["pid"] != killed:
                break
            time.sleep(0.1)
        else:
            raise AssertionError(f"the killed worker was not replaced: {client.info()['workers']}")
    assert "failed to start" not in (tmp_path / "daemon.log").read_text()


def test_a_workers_cpu_time_is_read_while_it_lives_and_not_once_it_is_gone() -> None:
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    worker = WorkerHandle(1, 1, (0,), 1, WorkerState.READY, pid=spinner.pid)
    try:
        first = worker.cpu_seconds()
        deadline = time.monotonic() + 30
        while (now := worker.cpu_seconds()) is not None and first is not None and now - first < 0.05:
            assert time.monotonic() < deadline, "the spinner's CPU time did not advance"
            time.sleep(0.02)
        assert first is not None and now is not None and now > first
    finally:
        spinner.kill()
        spinner.wait()
    assert worker.cpu_seconds() is None  # its descriptor reads its own process only: gone, never a reused pid
    worker.close_stat()
    assert WorkerHandle(2, 1, (0,), 1, WorkerState.READY).cpu_seconds() is None  # no pid yet
