"""Local hardening: a private run dir, stale and live ipc socket files, the root warning, and the
workers' connect deadline."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import zmq

from packrat_daemon.fleet.backend import Backend
from packrat_daemon.ops.hardening import claim_ipc, private_dir, warn_if_root
from packrat_daemon.wire.errors import ConfigError
from tests.helpers.daemons import daemon_env


def test_a_missing_run_dir_is_created_private(tmp_path: Path) -> None:
    made = private_dir(tmp_path / "a" / "run")
    assert made.stat().st_mode & 0o777 == 0o700
    assert private_dir(made) == made  # an existing private dir is fine


def test_a_run_dir_others_may_enter_is_refused_with_the_fix(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    os.chmod(run_dir, 0o750)
    with pytest.raises(ConfigError, match=f"chmod 700 {run_dir}"):
        private_dir(run_dir)


def test_a_run_dir_of_another_user_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir(mode=0o700)
    owner = run_dir.stat().st_uid
    monkeypatch.setattr(os, "geteuid", lambda: owner + 1)
    with pytest.raises(ConfigError, match=f"belongs to uid {owner}, not to this user"):
        private_dir(run_dir)


def test_a_link_as_run_dir_is_refused(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(tmp_path / "real")
    with pytest.raises(ConfigError, match="not a folder"):
        private_dir(tmp_path / "link")


def _stale_socket(path: Path) -> None:
    """A socket file whose listener is gone, as a SIGKILLed daemon leaves it."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.close()


def test_a_stale_socket_file_is_removed_and_a_live_one_refused(tmp_path: Path) -> None:
    stale = tmp_path / "stale.ipc"
    _stale_socket(stale)
    claim_ipc(stale)
    assert not stale.exists()
    live = tmp_path / "live.ipc"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(str(live))
        listener.listen()
        with pytest.raises(ConfigError, match="another process listens"):
            claim_ipc(live)
    plain = tmp_path / "plain.ipc"
    plain.write_text("not a socket")
    with pytest.raises(ConfigError, match="is not a socket"):
        claim_ipc(plain)


def test_the_backend_cleans_a_stale_socket_and_never_takes_a_live_one(tmp_path: Path) -> None:
    run_dir = private_dir(tmp_path / "run")
    _stale_socket(run_dir / "backend.ipc")
    context = zmq.Context()
    first = Backend(context, str(run_dir))
    try:
        with pytest.raises(ConfigError, match="another process listens"):
            Backend(context, str(run_dir))  # a second daemon on the same run dir
    finally:
        first.close()
        context.term()


def test_root_outside_systemd_is_warned(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.delenv("INVOCATION_ID", raising=False)
    with caplog.at_level(logging.WARNING, "packrat.daemon"):
        warn_if_root()
    assert "running as root" in caplog.text
    caplog.clear()
    monkeypatch.setenv("INVOCATION_ID", "0123")
    warn_if_root()
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.delenv("INVOCATION_ID")
    warn_if_root()
    assert not caplog.records


@pytest.mark.slow
def test_a_worker_that_cannot_reach_the_daemon_fails_its_boot(tmp_path: Path) -> None:
    # In a child process: booting a worker pins it and changes its signal handlers.
    script = textwrap.dedent(
        f"""
        import numpy as np
        from workers import worker
        from workers.runtimes.base import Runtime
        from workers.models.spec import InputSpec

        class Identity(Runtime):
            name = "identity"
            def load(self, spec, input_override=None):
                return InputSpec("float32", (4,), None)
            def set_threads(self, threads):
                pass
            def run(self, batch):
                return batch

        worker.CONNECT_DEADLINE_S = 0.5
        config = worker.WorkerConfig(1, 1, (0,), "ipc://{tmp_path}/moved/backend.ipc", template_pid=0)
        try:
            worker.run_worker(Identity(), InputSpec("float32", (4,), None), config)
        except worker.WorkerBootError as exc:
            print("boot failed:", exc)
        """
    )
    done = subprocess.run([sys.executable, "-c", script], env=daemon_env(), capture_output=True, text=True, timeout=30)
    assert "boot failed: TimeoutError: could not reach the daemon" in done.stdout, done.stderr


def test_the_open_file_soft_limit_is_raised_to_the_hard_limit_and_logged() -> None:
    # Before: the soft limit stayed at 1 024, and a thousand idle connections left new clients unanswered.
    code = textwrap.dedent(
        """
        import logging, resource
        logging.basicConfig(level=logging.INFO, format="%(message)s")
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, hard))
        from packrat_daemon.ops.hardening import raise_fd_limit
        now = raise_fd_limit()
        print(now, resource.getrlimit(resource.RLIMIT_NOFILE)[0], hard)
        """
    )
    done = subprocess.run([sys.executable, "-c", code], env=daemon_env(), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    now, soft, hard = (int(word) for word in done.stdout.split())
    assert now == soft and soft > 64
    if hard < 1 << 40:  # not "unlimited": the hard limit itself
        assert soft == hard
    assert "soft limit raised from 64 to" in done.stderr
