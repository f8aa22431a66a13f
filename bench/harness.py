"""What the benchmark scripts share: a `packrat serve` subprocess driven through the client library."""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from packrat_daemon.wire.client import Client, ClientTimeout  # noqa: E402


def use_packrat_malloc_tuning() -> None:
    """Give every process spawned from now on the glibc malloc settings the daemon gives its workers.

    In-process runners compared against the daemon must run with the same allocator settings, so that a
    ratio measures the daemon and its plan, not the malloc. glibc reads them when a process starts;
    settings the user exported win, as in the daemon.
    """
    from packrat_daemon.fleet.backend import GLIBC_MALLOC_TUNING

    for variable, value in GLIBC_MALLOC_TUNING.items():
        os.environ.setdefault(variable, value)


def free_port() -> int:
    """A TCP port on loopback that nothing listens on now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def stop(process: subprocess.Popen, timeout: float) -> None:
    """SIGTERM `process`, and SIGKILL it if it has not exited within `timeout` seconds."""
    process.terminate()
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        process.kill()


def unpack_revision(revision: str, into: Path) -> str:
    """The code of `revision` of this repository unpacked into the new folder `into` (`git archive`: no
    worktree to remove); its full commit hash."""
    commit = subprocess.run(["git", "rev-parse", "--verify", revision], cwd=REPO, capture_output=True,
                            text=True, check=True).stdout.strip()  # fmt: skip
    into.mkdir()
    archive = subprocess.run(["git", "archive", commit], cwd=REPO, capture_output=True, check=True).stdout
    subprocess.run(["tar", "x", "-C", str(into)], input=archive, check=True)
    return commit


R = TypeVar("R", bound="SpawnedRunner")


class SpawnedRunner:
    """An in-process runner in a spawned child: `target(conn, *args)` loads its model, sends ("ready", pid)
    or ("error", why), then answers what the parent asks over the pipe until it is sent None."""

    def __init__(self, target: Callable[..., None], *args: Any) -> None:
        context = mp.get_context("spawn")
        self.conn, child = context.Pipe()
        self.process = context.Process(target=target, args=(child, *args), daemon=True)
        self.process.start()

    def wait(self) -> None:
        status, detail = self.conn.recv()
        if status != "ready":
            raise RuntimeError(detail)

    def close(self) -> None:
        """Ask the child to finish, then kill it if it has not within 20 s."""
        with contextlib.suppress(OSError):
            self.conn.send(None)
        self.process.join(20)
        if self.process.is_alive():
            self.process.kill()


def ready_runners(started: dict[str, R], errors: dict[str, str]) -> dict[str, R]:
    """Wait for runners started together (they load in parallel); one that fails goes into `errors`."""
    ready = {}
    for name, runner in started.items():
        try:
            runner.wait()
            ready[name] = runner
        except (RuntimeError, EOFError) as exc:
            errors[name] = str(exc)
            runner.close()
    return ready


def serve_batches(conn: Any, make_input: Callable[[int], Any], run: Callable[[Any], Any]) -> None:
    """The loop of a spawned in-process runner: say ready, then run each batch size asked for until None.

    Inputs are made once per batch size, so only the run is timed.
    """
    inputs: dict[int, Any] = {}
    conn.send(("ready", os.getpid()))
    while (batch := conn.recv()) is not None:
        if batch not in inputs:
            inputs[batch] = make_input(batch)
        conn.send(run(inputs[batch]))


PLAN_LOG_MARKERS = ("packrat.daemon: split check", "packrat.daemon: adapting", "packrat.daemon: plan ")


def private_state(name: str, folder: Path, args: list[str]) -> list[str]:
    """`args` with a state folder of this daemon's own, `folder/NAME.state`, unless they choose one (or a config
    file does): a benchmark neither reads a profile or plan another run left in the user's default folder nor
    leaves its own there."""
    if "--state-dir" in args or "--config" in args:
        return args
    return [*args, "--state-dir", str(folder / f"{name}.state")]


class DaemonProcess:
    """`packrat serve ARGS` on a private ipc endpoint in `folder`, its log in `folder/NAME.log`, its state in
    `folder/NAME.state` unless ARGS say otherwise."""

    def __init__(self, name: str, folder: Path, args: list[str]) -> None:
        self.endpoint = f"ipc://{folder}/{name}.ipc"
        self.log_path = folder / f"{name}.log"
        args = private_state(name, folder, args)
        command = [sys.executable, "-m", "packrat_daemon", "serve", "--endpoint", self.endpoint, *args]
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
        self.client = Client(self.endpoint, timeout=5.0)

    def wait(self, timeout: float = 900.0) -> dict[str, Any]:
        """Block until the daemon answers `info` (it binds only once its workers serve)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"daemon exited: {self.log_tail()}")
            try:
                info = self.client.info(timeout=2.0)
            except ClientTimeout:
                continue
            self.client.close()
            self.client = Client(self.endpoint, timeout=120.0)
            return info
        raise RuntimeError(f"daemon not ready within {timeout:.0f} s: {self.log_tail()}")

    def close(self) -> None:
        self.client.close()
        stop(self.process, 60)

    def log_tail(self, chars: int = 3000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:]

    def plan_log(self) -> list[str]:
        """How the daemon came to the plan it serves, from its log: the start-up split check and every
        online adaptation. Benchmarks keep it in their JSON, because the log goes with their temporary
        folder, and a daemon that adapted mid-run was measured on more than one plan."""
        lines = self.log_path.read_text(errors="replace").splitlines()
        return [line.split(": ", 1)[-1] for line in lines if any(marker in line for marker in PLAN_LOG_MARKERS)]
