"""`packrat coordinate` as a process: a stop signal is said in its log before it exits."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers.daemons import daemon_env

REPO = Path(__file__).resolve().parents[3]


@pytest.mark.slow
def test_sigterm_is_logged_before_the_coordinator_exits(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "packrat_daemon", "coordinate", "--status-file", str(tmp_path / "s.json"),
               "--daemon", f"a={tmp_path / 'a'}", "--interval", "0.1", "--emulate-cores", "2"]  # fmt: skip
    process = subprocess.Popen(command, env=daemon_env(), cwd=REPO, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "s.json").is_file():  # written after each look, the signal handlers set before
            assert process.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 0, err
    assert "SIGTERM received: stopped; each daemon keeps the CPUs it was given" in err
    assert str(tmp_path / "s.json") in err
