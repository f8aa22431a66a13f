"""Start a real `packrat serve` process on a private ipc endpoint, and stop processes."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent


def daemon_env() -> dict[str, str]:
    env = dict(os.environ)
    # The repository root, so that specs like `tests.model_factories:slow_mlp` import (never tests/ itself: its
    # packages mirror, and would shadow, packrat_daemon, workers and policies).
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH", "")]))
    return env


@contextmanager
def running_daemon(
    tmp_path: Path,
    *args: str,
    timeout: float = 180.0,
    bind: str | None = None,
    endpoint: str | None = None,
    client_options: dict[str, Any] | None = None,
) -> Iterator[tuple[str, subprocess.Popen]]:
    """A real daemon with real workers; yields (endpoint, process) once it answers `info`.

    `bind` is what the daemon binds (default: an ipc socket in tmp_path), `endpoint` where clients reach
    it (default: `bind`), and `client_options` what the readiness probe's Client needs (e.g. CURVE keys).
    """
    from packrat_daemon.wire.client import Client, ClientTimeout

    bind = bind or f"ipc://{tmp_path}/front.ipc"
    endpoint = endpoint or bind
    command = [sys.executable, "-m", "packrat_daemon", "serve", "--endpoint", bind, *args]
    log = open(tmp_path / "daemon.log", "wb")  # noqa: SIM115 - closed below
    process = subprocess.Popen(command, env=daemon_env(), stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + timeout
    try:
        with Client(endpoint, timeout=2.0, **(client_options or {})) as client:
            while True:
                if process.poll() is not None:
                    raise AssertionError(f"daemon exited early:\n{(tmp_path / 'daemon.log').read_text()}")
                try:
                    client.info()
                    break
                except ClientTimeout:
                    if time.monotonic() > deadline:
                        raise AssertionError(f"daemon not ready:\n{(tmp_path / 'daemon.log').read_text()}") from None
        yield endpoint, process
    finally:
        stop_process(process, 30)
        log.close()


def stop_process(process: subprocess.Popen[Any], grace_s: float) -> None:
    """SIGTERM, and SIGKILL if it has not exited within `grace_s`; nothing if it has exited already."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(grace_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
