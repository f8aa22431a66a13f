"""Start a real `packrat serve` process on a private ipc endpoint, and stop processes."""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent


# A daemon's runtime and precision default to auto, which prepares and measures every candidate (several
# templates, the accuracy guard); a test of something else serves torch at fp32, as these pin. A test of auto
# says --runtime auto --precision auto, which `pinned` then leaves alone. Such a test measures every candidate
# before its first answer (--first-answer off) unless it says otherwise: the early answer has tests of its own.
PINNED = (("--runtime", "torch"), ("--precision", "fp32"), ("--first-answer", "off"))
PINNED_ARGS = [part for pair in PINNED for part in pair]

_STATE_HOMES: list[str] = []


def pinned(args: Sequence[str]) -> list[str]:
    """PINNED's flags that neither `args` nor the TOML file of their --config sets."""
    given = set(args)
    if "--config" in args:
        with open(args[list(args).index("--config") + 1], "rb") as handle:
            given |= {"--" + key.replace("_", "-") for key in tomllib.load(handle)}
    return [part for flag, value in PINNED if flag not in given for part in (flag, value)]


def state_home() -> str:
    """A fresh folder to stand for $XDG_STATE_HOME: a daemon's default state folder lies below it, so that no
    test writes to the real home, and no test's daemon serves what another one learned. Removed at exit."""
    folder = tempfile.mkdtemp(prefix="packrat-test-state-")
    if not _STATE_HOMES:
        atexit.register(lambda: [shutil.rmtree(path, ignore_errors=True) for path in _STATE_HOMES])
    _STATE_HOMES.append(folder)
    return folder


def daemon_env(state_home_dir: Path | None = None) -> dict[str, str]:
    """The environment of a test's daemon: its default state folder below `state_home_dir`, else a fresh one."""
    env = dict(os.environ)
    env.pop("STATE_DIRECTORY", None)  # a test run from inside a systemd unit must not write the unit's state
    env["XDG_STATE_HOME"] = str(state_home_dir) if state_home_dir is not None else state_home()
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
    state_home_dir: Path | None = None,
) -> Iterator[tuple[str, subprocess.Popen]]:
    """A real daemon with real workers; yields (endpoint, process) once it answers `info`.

    `bind` is what the daemon binds (default: an ipc socket in tmp_path), `endpoint` where clients reach
    it (default: `bind`), and `client_options` what the readiness probe's Client needs (e.g. CURVE keys);
    `state_home_dir`: its $XDG_STATE_HOME (default: a fresh folder), for a restart on the default state folder.
    """
    from packrat_daemon.wire.client import Client, ClientTimeout

    bind = bind or f"ipc://{tmp_path}/front.ipc"
    endpoint = endpoint or bind
    command = [sys.executable, "-m", "packrat_daemon", "serve", "--endpoint", bind, *pinned(args), *args]
    log = open(tmp_path / "daemon.log", "wb")  # noqa: SIM115 - closed below
    process = subprocess.Popen(command, env=daemon_env(state_home_dir), stdout=log, stderr=subprocess.STDOUT)
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
