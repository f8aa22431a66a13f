"""systemd/packrat-repository.service: one unit for a whole model repository. `systemd-analyze verify` passes
with ExecStart at this checkout's venv, the sandbox rates as the one-model unit's does, it waits for the
repository's READY=1, and each model gets a state folder of its own under the unit's StateDirectory=."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from packrat_daemon.repository.daemons import child_env, state_dir_of
from tests.deploy.test_systemd_unit import MAX_EXPOSURE, assert_verifies, directives, exposure, install

UNIT = Path(__file__).resolve().parents[2] / "systemd" / "packrat-repository.service"
needs_analyze = pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")


@pytest.fixture
def installed_unit(tmp_path: Path) -> Path:
    return install(UNIT, tmp_path)


@needs_analyze
def test_systemd_analyze_verify_passes(installed_unit: Path) -> None:
    assert_verifies(installed_unit, "packrat-repository")


@needs_analyze
def test_security_exposure_is_at_most_4(installed_unit: Path) -> None:
    assert exposure(installed_unit) <= MAX_EXPOSURE


def test_the_unit_serves_the_repository_and_waits_for_it() -> None:
    found = directives(UNIT.read_text())
    assert "--repository" in found["ExecStart"][0]
    assert found["Type"] == ["notify"] and found["NotifyAccess"] == ["main"]
    assert found["RestartPreventExitStatus"] == ["2"]
    assert found["RuntimeDirectory"] == ["packrat/repository"] and found["StateDirectory"] == ["packrat/repository"]
    assert found.get("MemoryDenyWriteExecute", ["no"]) == ["no"]  # oneDNN's and OpenVINO's JIT, as the daemon's


def test_each_model_keeps_its_own_state_folder_under_the_units(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STATE_DIRECTORY", "/var/lib/packrat/repository")
    monkeypatch.setenv("NOTIFY_SOCKET", "/run/systemd/notify")
    assert state_dir_of("bert") == "/var/lib/packrat/repository/bert"
    env = child_env()
    assert "STATE_DIRECTORY" not in env and "NOTIFY_SOCKET" not in env  # the repository says READY, not a model
    monkeypatch.delenv("STATE_DIRECTORY")
    assert state_dir_of("bert") is None  # the daemon's default: a folder per model under $XDG_STATE_HOME
