"""systemd/packrat@.service: `systemd-analyze verify` passes with ExecStart pointed at this checkout's venv, the
sandbox rates at most 4 on `systemd-analyze security`, and the settings that would stop the daemon serving
stay off."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

UNIT = Path(__file__).resolve().parents[2] / "systemd" / "packrat@.service"
SHIPPED_EXEC = "/opt/packrat/.venv/bin/packrat"
MAX_EXPOSURE = 4.0  # systemd-analyze security: 0 is fully sandboxed, 10 is none; <= 4 is rated "OK" or better

needs_analyze = pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")


def directives(text: str) -> dict[str, list[str]]:
    """Each key's values in the order given (a key may repeat, e.g. SystemCallFilter=)."""
    found: dict[str, list[str]] = {}
    for line in text.splitlines():
        if "=" in line and not line.lstrip().startswith(("#", ";", "[")):
            key, value = line.split("=", 1)
            found.setdefault(key.strip(), []).append(value.strip())
    return found


def install(unit: Path, into: Path, name: str | None = None, replace: dict[str, str] | None = None) -> Path:
    """A shipped `unit` written into `into` (as `name`, default its own) with ExecStart at this venv's `packrat`
    and any other shipped paths `replace`d; skipped where the checkout is not installed in its venv."""
    packrat = Path(sys.executable).parent / "packrat"
    if not packrat.exists():
        pytest.skip(f"{packrat} is missing: install the checkout into its venv (pip install -e .)")
    text = unit.read_text()
    assert text.count(SHIPPED_EXEC) == 1
    for shipped, here in {SHIPPED_EXEC: str(packrat), **(replace or {})}.items():
        text = text.replace(shipped, here)
    written = into / (name or unit.name)
    written.write_text(text)
    return written


def assert_verifies(unit: Path, marker: str) -> None:
    """`systemd-analyze verify` passes on `unit` with no complaint about a line naming `marker`."""
    result = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True)
    complaints = [line for line in (result.stdout + result.stderr).splitlines() if marker in line]
    assert result.returncode == 0 and not complaints, result.stdout + result.stderr


@pytest.fixture
def installed_unit(tmp_path: Path) -> Path:
    """The shipped unit with ExecStart at this venv's `packrat`, as the instance packrat@test."""
    install(UNIT, tmp_path)
    return tmp_path / "packrat@test.service"  # systemd-analyze finds the template beside it


@needs_analyze
def test_systemd_analyze_verify_passes(installed_unit: Path) -> None:
    assert_verifies(installed_unit, "packrat@")


@needs_analyze
def test_verify_would_catch_a_broken_unit(installed_unit: Path) -> None:
    """Not vacuous: the shipped ExecStart is missing on this machine, and verify says so."""
    (installed_unit.parent / "packrat@.service").write_text(UNIT.read_text())
    result = subprocess.run(["systemd-analyze", "verify", str(installed_unit)], capture_output=True, text=True)
    assert result.returncode != 0 and SHIPPED_EXEC in result.stderr


def exposure(unit: Path) -> float:
    result = subprocess.run(
        ["systemd-analyze", "security", "--offline=yes", "--no-pager", str(unit)], capture_output=True, text=True
    )
    match = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", result.stdout)
    if match is None and "--offline" in result.stderr:
        pytest.skip(f"this systemd-analyze cannot rate a unit offline (systemd >= 250 can): {result.stderr}")
    assert match is not None, result.stdout + result.stderr
    return float(match.group(1))


@needs_analyze
def test_security_exposure_is_at_most_4(installed_unit: Path) -> None:
    assert exposure(installed_unit.parent / "packrat@.service") <= MAX_EXPOSURE


@needs_analyze
def test_the_rating_reflects_the_sandbox(tmp_path: Path) -> None:
    """Not vacuous: the unit without its sandboxing lines rates far worse."""
    sandboxed = tmp_path / "sandboxed@.service"
    sandboxed.write_text(UNIT.read_text())
    start = "CapabilityBoundingSet="
    bare = tmp_path / "bare@.service"
    text = UNIT.read_text()
    bare.write_text(text[: text.index(start)] + text[text.index("[Install]") :])
    assert exposure(bare) > MAX_EXPOSURE + 2 > exposure(sandboxed) + 2


def test_the_settings_that_would_stop_serving_stay_off() -> None:
    """W^X memory is what oneDNN's and OpenVINO's JIT write kernels into; the workers pin their threads
    (@resources); /proc's system files tell the CPU's features and the metrics (ProcSubset=pid hides them)."""
    found = directives(UNIT.read_text())
    assert found.get("MemoryDenyWriteExecute", ["no"]) == ["no"]
    assert "ProcSubset" not in found and "PrivateNetwork" not in found
    filters = found["SystemCallFilter"]
    assert "@system-service" in filters  # allows @resources: sched_setaffinity, mbind, set_mempolicy
    assert not any(f.startswith("~") and "@resources" in f for f in filters)
    families = found["RestrictAddressFamilies"][0].split()
    assert {"AF_UNIX", "AF_INET", "AF_INET6"} <= set(families)  # ipc:// and the notify socket; tcp://


def test_the_unit_watches_and_reloads_the_daemon() -> None:
    found = directives(UNIT.read_text())
    assert found["Type"] == ["notify"] and found["NotifyAccess"] == ["main"]
    assert found["ExecReload"] == ["/bin/kill -HUP $MAINPID"]
    watchdog = found["WatchdogSec"][0]
    assert watchdog.isdigit() and int(watchdog) >= 2  # the loop pings every half interval, waking 4 times a second
    assert found["RestartPreventExitStatus"] == ["2"]


def test_the_conversion_cache_is_a_directory_systemd_makes_for_the_instance() -> None:
    """runtime = "auto" writes converted models to $PACKRAT_CACHE_DIR; the default (~/.cache) is out of reach."""
    found = directives(UNIT.read_text())
    assert found["CacheDirectory"] == ["packrat/%i"]
    assert "PACKRAT_CACHE_DIR=%C/packrat/%i" in found["Environment"]
    assert found["ProtectHome"] == ["yes"]  # why the cache cannot be the home's
