"""`packrat coordinate`'s exclusive lock on the daemons it steers (`coordinate.lock`): a second coordinator on
any of them refuses to start with exit 2, naming the first by its pid; none is left behind by one that exited."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from packrat_daemon.cli import main
from packrat_daemon.coordinate.lock import LOCK_FILE, AlreadyCoordinated, coordinating, lock_path
from tests.helpers.daemons import daemon_env, stop_process

REPO = Path(__file__).resolve().parents[3]


def _daemons(tmp_path: Path, *names: str) -> list[tuple[str, str]]:
    return [(name, f"ipc://{tmp_path / name}/control.ipc") for name in names]


def test_the_lock_lies_in_the_daemons_run_dir_and_names_its_holder(tmp_path: Path) -> None:
    daemons = _daemons(tmp_path, "a", "b")
    with coordinating(daemons) as held:
        assert held == [tmp_path / "a" / LOCK_FILE, tmp_path / "b" / LOCK_FILE]
        assert lock_path(daemons[0][1]).read_text() == f"{os.getpid()}\n"
        assert oct((tmp_path / "a").stat().st_mode & 0o777) == "0o700"  # made as the daemon makes its run dir


def test_a_second_coordinator_on_any_one_daemon_is_refused_and_takes_none(tmp_path: Path) -> None:
    with coordinating(_daemons(tmp_path, "b")):
        with pytest.raises(AlreadyCoordinated) as caught, coordinating(_daemons(tmp_path, "a", "b")):
            pass
        assert caught.value.pid == os.getpid() and caught.value.name == "b"
        assert f"pid {os.getpid()}" in str(caught.value) and str(tmp_path / "b" / LOCK_FILE) in str(caught.value)
        with coordinating(_daemons(tmp_path, "a")):  # the refused one let go of "a", which it had taken first
            pass
    with coordinating(_daemons(tmp_path, "a", "b")):  # and the first one's exit let go of "b"
        pass


def test_one_folder_given_twice_is_locked_once(tmp_path: Path) -> None:
    (tmp_path / "a" / "sub").mkdir(mode=0o700, parents=True)
    (tmp_path / "a").chmod(0o700)
    other = f"ipc://{tmp_path}/a/sub/../other.ipc"  # (a symlinked run dir is refused, as the daemon refuses it)
    with coordinating([("a", f"ipc://{tmp_path}/a/control.ipc"), ("b", other)]) as held:
        assert held == [tmp_path / "a" / LOCK_FILE]


def test_the_command_exits_2_naming_the_running_one(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with coordinating(_daemons(tmp_path, "a")):
        code = main(["coordinate", "--daemon", f"a={tmp_path / 'a'}", "--status-file", str(tmp_path / "s.json")])
    assert code == 2
    err = capsys.readouterr().err
    assert "already steered by another `packrat coordinate`" in err and f"pid {os.getpid()}" in err


@pytest.mark.slow
def test_a_second_coordinate_process_refuses_while_the_first_runs(tmp_path: Path) -> None:
    """Two real processes: the first steers two daemons that are not up yet (it waits for them); the second,
    given one of them, exits 2 naming the first's pid; once the first has stopped, a third starts."""
    args = ["--daemon", f"a={tmp_path / 'a'}", "--daemon", f"b={tmp_path / 'b'}", "--interval", "0.1"]
    command = [sys.executable, "-m", "packrat_daemon", "coordinate", "--status-file", str(tmp_path / "1.json")]
    first = subprocess.Popen([*command, *args], env=daemon_env(), cwd=REPO, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "b" / LOCK_FILE).is_file() or not (tmp_path / "b" / LOCK_FILE).read_text():
            assert first.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        second = subprocess.run(
            [sys.executable, "-m", "packrat_daemon", "coordinate", "--daemon", f"b={tmp_path / 'b'}"],
            env=daemon_env(), cwd=REPO, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert second.returncode == 2, second.stderr
        assert f"pid {first.pid}" in second.stderr and "Traceback" not in second.stderr
    finally:
        stop_process(first, 10)
    assert first.returncode == 0
    with coordinating(_daemons(tmp_path, "a", "b")):  # the kernel let go of both with the first's exit
        pass
