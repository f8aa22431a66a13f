"""systemd/packrat-coordinator.service and its companions: `systemd-analyze verify` passes with ExecStart at this
checkout's venv, the sandbox rates at most 4, the daemons' drop-in gives them the coordinator's user (or it could
not reach their private run dirs), and the example environment's flags are what `packrat coordinate` accepts."""

from __future__ import annotations

import shlex
import shutil
from pathlib import Path

import pytest

from packrat_daemon.cli import build_parser
from packrat_daemon.commands.coordinate import parse_daemons
from tests.deploy.test_systemd_unit import MAX_EXPOSURE, assert_verifies, directives, exposure, install

SYSTEMD = Path(__file__).resolve().parents[2] / "systemd"
UNIT = SYSTEMD / "packrat-coordinator.service"
SHIPPED_EXEC = "/opt/packrat/.venv/bin/packrat"

needs_analyze = pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")


@pytest.fixture
def installed_unit(tmp_path: Path) -> Path:
    env = tmp_path / "coordinator.env"
    env.write_text((SYSTEMD / "coordinator.env").read_text())
    return install(UNIT, tmp_path, replace={"/etc/packrat/coordinator.env": str(env)})


@needs_analyze
def test_systemd_analyze_verify_passes(installed_unit: Path) -> None:
    assert_verifies(installed_unit, "coordinator")


@needs_analyze
def test_security_exposure_is_at_most_4(installed_unit: Path) -> None:
    assert exposure(installed_unit) <= MAX_EXPOSURE


def test_the_daemons_run_as_the_coordinators_user() -> None:
    coordinator = directives(UNIT.read_text())
    drop_in = directives((SYSTEMD / "colocated.conf").read_text())
    assert coordinator["DynamicUser"] == ["yes"] and coordinator["User"] == drop_in["User"] == ["packrat"]
    assert coordinator["RestartPreventExitStatus"] == ["2"] and coordinator["RestrictAddressFamilies"] == ["AF_UNIX"]


def test_the_example_flags_are_what_packrat_coordinate_accepts() -> None:
    env = directives((SYSTEMD / "coordinator.env").read_text())
    flags = shlex.split(env["PACKRAT_COORDINATE"][0])
    args = build_parser().parse_args(["coordinate", *flags])
    daemons = parse_daemons(args.daemon)
    assert daemons == [
        ("resnet50", "ipc:///run/packrat/resnet50/control.ipc"),
        ("food", "ipc:///run/packrat/food/control.ipc"),
    ]
    # Each is a daemon's run dir as its TOML would set it (systemd/example.toml: run_dir = "/run/packrat/NAME").
    example = (SYSTEMD / "example.toml").read_text()
    assert 'run_dir = "/run/packrat/NAME"' in example
