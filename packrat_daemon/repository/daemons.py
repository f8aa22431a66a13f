"""One daemon per model, as `packrat serve` runs it alone: a process of its own (a crash stops that model only),
its own ZeroMQ endpoint and control socket in its own run dir (RUN_DIR/models/NAME), started with the CPUs the
joint plan gives it first, watched, and started again with back-off when it dies (as the gateway beside a lone
daemon is: quick the first time, doubling to a ceiling, quick again once it has served a while).

The daemon reads its settings from RUN_DIR/models/NAME/serve.toml, written here from the repository's
(`Repository.settings`); its ZeroMQ endpoint is ipc://RUN_DIR/models/NAME/front.ipc unless the model sets one.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from packrat_daemon.ops.hardening import private_dir
from packrat_daemon.protocol.launch import RestartBackoff

log = logging.getLogger("packrat.repository")

RESTART_FIRST_S = 0.5  # a model daemon that died starts again this soon the first time (RestartBackoff)
STOP_MARGIN_S = 10.0  # past the daemon's own drain_timeout_s, before it is killed
CONFIG_FILE = "serve.toml"
# The repository's pid, given to each model daemon it starts: the daemon asks the kernel for SIGTERM when that process
# dies (`follow_parent`). The child asks, not a preexec_fn: code run between fork and exec in a process whose gRPC
# threads run can abort the child (SIGABRT before it ever served).
PARENT_ENV = "PACKRAT_REPOSITORY_PID"
# A model daemon's states, as the repository index names them (Triton's words).
READY, LOADING, UNAVAILABLE, UNLOADING = "READY", "LOADING", "UNAVAILABLE", "UNLOADING"


def toml_text(settings: Mapping[str, Any]) -> str:
    """`settings` (strings, numbers, booleans, lists of them) as a TOML file."""
    lines = ["# Written by `packrat serve --repository` at each start of this model's daemon; edits are lost."]
    for key, value in settings.items():
        if value is None:
            continue
        lines.append(f"{key} = {json.dumps(value)}")  # JSON's strings, numbers, booleans and arrays are TOML's
    return "\n".join(lines) + "\n"


def child_env() -> dict[str, str]:
    """A model daemon's environment: the repository's, less what systemd gave the repository's process alone (its
    notify socket: the repository says READY; its state folder: each model is given a folder of its own)."""
    env = {key: value for key, value in os.environ.items() if key not in ("NOTIFY_SOCKET", "STATE_DIRECTORY")}
    return {**env, PARENT_ENV: str(os.getpid())}


def follow_parent() -> None:
    """In a model daemon started by a repository: end with SIGTERM when the repository's process dies (a SIGKILL
    leaves it no chance to stop its daemons), and keep the variable from the daemon's own children."""
    parent = os.environ.pop(PARENT_ENV, None)
    if parent:
        from workers.pinning import die_with_parent

        die_with_parent(int(parent), signal.SIGTERM)


def state_dir_of(name: str) -> str | None:
    """Model `name`'s state folder under systemd's StateDirectory= (None outside such a unit: the daemon's default,
    a folder per model under $XDG_STATE_HOME/packrat)."""
    given = os.environ.get("STATE_DIRECTORY", "").split(":")[0]
    return os.path.join(given, name) if given else None


class ModelDaemon:
    """One model's daemon and the thread that keeps it running until `stop`."""

    def __init__(self, name: str, run_dir: Path, settings: Mapping[str, Any], log_path: Path | None = None) -> None:
        self.name = name
        self.run_dir = private_dir(run_dir)
        self.settings = dict(settings)
        self.settings.setdefault("endpoint", f"ipc://{self.run_dir / 'front.ipc'}")
        if state_dir_of(name) is not None:
            self.settings.setdefault("state_dir", state_dir_of(name))
        self.endpoint = str(self.settings["endpoint"])
        self.control = f"ipc://{self.run_dir / 'control.ipc'}"
        self.log_path = log_path
        self.cpus: str | None = None  # --cpus of its next start (the joint plan's first share; None: every CPU)
        self.state = LOADING
        self.restarts = 0
        self.last_exit: int | None = None
        self.pid: int | None = None
        self._stopping = threading.Event()
        self._child: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def command(self) -> list[str]:
        argv = [sys.executable, "-m", "packrat_daemon", "serve", "--config", str(self.run_dir / CONFIG_FILE)]
        argv += ["--run-dir", str(self.run_dir)]
        if self.cpus is not None:
            argv += ["--cpus", self.cpus]
        return argv

    def start(self) -> None:
        """Start the daemon and the thread that restarts it; returns at once (`serving` says when it serves)."""
        (self.run_dir / CONFIG_FILE).write_text(toml_text(self.settings), encoding="utf-8")
        self._spawn()
        self._thread = threading.Thread(target=self._watch, name=f"model-{self.name}", daemon=True)
        self._thread.start()

    def _spawn(self) -> None:
        with self._lock:
            if self._stopping.is_set():
                return
            out = None if self.log_path is None else self.log_path.open("ab")
            try:
                self._child = subprocess.Popen(
                    self.command(),
                    env=child_env(),
                    stdout=out,
                    stderr=subprocess.STDOUT if out else None,
                )
            finally:
                if out is not None:
                    out.close()
            self.pid = self._child.pid
            log.info("model %s: daemon started (pid %d, CPUs %s)", self.name, self.pid, self.cpus or "all")

    def _watch(self) -> None:
        backoff = RestartBackoff(RESTART_FIRST_S)
        while True:
            child = self._child
            if child is None:
                return
            began = time.monotonic()
            self.last_exit = child.wait()
            if self._stopping.is_set():
                return
            self.state = UNAVAILABLE
            delay = backoff.after_exit(time.monotonic() - began)
            self.restarts += 1
            log.error(
                "model %s: its daemon exited (code %s); the other models serve on; starting it again in "
                "%.1f s (restart %d)",
                self.name,
                self.last_exit,
                delay,
                self.restarts,
            )
            if self._stopping.wait(delay):
                return
            self.state = LOADING
            self._spawn()

    def mark(self, serving: bool) -> None:
        """What the gateway learned of the daemon: serving (READY), or not (LOADING until it first served)."""
        if self._stopping.is_set():
            return
        if serving:
            self.state = READY
        elif self.state == READY:
            self.state = UNAVAILABLE

    def running(self) -> bool:
        child = self._child
        return child is not None and child.poll() is None

    def stop(self, grace_s: float | None = None) -> int | None:
        """SIGTERM (the daemon drains: those it took are answered), killed past its drain time; its exit code."""
        with self._lock:
            self._stopping.set()
            self.state = UNLOADING
            child = self._child
            if child is not None and child.poll() is None:
                child.terminate()
        if child is not None:
            wait = grace_s if grace_s is not None else float(self.settings.get("drain_timeout_s", 30.0)) + STOP_MARGIN_S
            try:
                child.wait(wait)
            except subprocess.TimeoutExpired:
                log.warning("model %s: its daemon did not stop within %.0f s; killed", self.name, wait)
                child.kill()
                child.wait()
            self.last_exit = child.returncode
        if self._thread is not None:
            self._thread.join(5.0)
        return self.last_exit

    def status(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "state": self.state,
            "pid": self.pid if self.running() else None,
            "endpoint": self.endpoint,
            "control": self.control,
            "cpus": self.cpus,
            "restarts": self.restarts,
            "last_exit": self.last_exit,
        }


def wait_until(check: Callable[[], bool], timeout_s: float, stop: threading.Event | None = None) -> bool:
    """Whether `check()` came true within `timeout_s` (looked at every 0.1 s)."""
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline or (stop is not None and stop.is_set()):
            return False
        with contextlib.suppress(Exception):
            time.sleep(0.1)
    return True
