"""`packrat profile` end to end: real template, real pinned workers, Ctrl-C keeps what was measured."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from policies.planning.profile import Profile
from tests.helpers.daemons import daemon_env

# Run the CLI with SIGINT at its default, as in a terminal (a background job would inherit "ignore").
LAUNCH = (
    "import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
    "sys.argv = sys.argv[1:]; runpy.run_module('packrat_daemon', run_name='__main__')"
)


def profile_command(out: Path, *args: str) -> list[str]:
    return [sys.executable, "-c", LAUNCH, "packrat", "profile", "--out", str(out), *args]


@pytest.mark.slow
def test_profile_writes_a_valid_profile(tmp_path: Path) -> None:
    out = tmp_path / "tiny.csv"
    args = ["--model", "builtin:tiny-mlp", "--threads", "1,2", "--batches", "1,4"]
    result = subprocess.run(profile_command(out, *args), env=daemon_env(), capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    profile = Profile.read_csv(out)
    assert sorted(profile) == [(1, 1), (1, 4), (2, 1), (2, 4)]
    assert profile.runtime == "torch" and profile.model == "builtin:tiny-mlp"
    assert "eta" in result.stderr  # the progress line


@pytest.mark.slow
def test_ctrl_c_keeps_the_cells_already_measured(tmp_path: Path) -> None:
    out, log = tmp_path / "slow.csv", tmp_path / "profile.log"
    args = ["--model", "tests.model_factories:slow_mlp", "--threads", "1,2", "--batches", "1,2,4,8"]
    with open(log, "w") as stderr:
        process = subprocess.Popen(profile_command(out, *args), env=daemon_env(), stderr=stderr)
        deadline = time.monotonic() + 120
        while " 2/8 " not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.1)
        process.send_signal(signal.SIGINT)
        assert process.wait(60) == 130
    measured = Profile.read_csv(out)
    assert 2 <= len(measured) < 8
    assert f"of 8 per runtime to {out}" in log.read_text()


@pytest.mark.slow
def test_an_ordinary_error_exits_1_not_interrupted(tmp_path: Path) -> None:
    import torch
    from torch import nn

    # A fixed-batch torch.export file: the template refuses it at load, an ordinary error, not a Ctrl-C.
    model = nn.Linear(16, 4).eval()
    path = tmp_path / "fixed.pt2"
    torch.export.save(torch.export.export(model, (torch.randn(2, 16),)), str(path))
    out = tmp_path / "profile.csv"
    command = [sys.executable, "-m", "packrat_daemon", "profile", "--model", str(path), "--threads", "1"]
    done = subprocess.run(
        [*command, "--batches", "1", "--out", str(out)], env=daemon_env(), capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    assert "interrupted" not in done.stderr
    assert "dynamic_shapes" in done.stderr
    assert not out.exists()


@pytest.mark.slow
def test_too_many_threads_are_refused_before_anything_loads(tmp_path: Path) -> None:
    out = tmp_path / "profile.csv"
    command = [sys.executable, "-m", "packrat_daemon", "profile", "--model", "builtin:tiny-mlp", "--threads", "1,4096"]
    done = subprocess.run(
        [*command, "--batches", "1", "--out", str(out)], env=daemon_env(), capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert "exceed the" in done.stderr and "loading" not in done.stderr
    assert not out.exists()


@pytest.mark.slow
def test_cores_outside_the_adaptive_search_are_refused_not_ignored(tmp_path: Path) -> None:
    out = tmp_path / "profile.csv"
    command = [sys.executable, "-m", "packrat_daemon", "profile", "--model", "builtin:tiny-mlp", "--cores", "64"]
    done = subprocess.run(
        [*command, "--batches", "1", "--out", str(out)], env=daemon_env(), capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "--cores plans the adaptive search" in done.stderr and not out.exists()
