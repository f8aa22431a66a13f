"""The state folder held to the run dir's rules: planted links never followed, hostile files set aside
(never a failed start), a write that fails leaves nothing, and a crafted saved plan is not served."""

from __future__ import annotations

import errno
import json
import logging
import os
from pathlib import Path

import pytest

from packrat_daemon.ops import state_files
from packrat_daemon.ops.state import FORMAT, STATE_FILE, StateKeeper
from packrat_daemon.ops.state_files import MAX_STATE_BYTES, read_bounded
from packrat_daemon.wire.errors import ConfigError
from policies.base import MAX_LAYOUTS, InstancePlan, Plan
from policies.planning.topology import Topology
from tests.packrat_daemon.ops.test_state import TOPOLOGY, saved_state


def _set_aside(folder: Path) -> list[Path]:
    return [p for p in folder.iterdir() if p.name.startswith(f"{STATE_FILE}.set-aside-")]


# -- the folder ----------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", [0o777, 0o770, 0o702])
def test_a_folder_others_may_write_is_refused_with_the_fix(tmp_path: Path, mode: int) -> None:
    folder = tmp_path / "state"
    folder.mkdir()
    os.chmod(folder, mode)
    with pytest.raises(ConfigError, match=f"written by group or others.*chmod 700 {folder}"):
        StateKeeper(str(folder))


def test_a_folder_of_another_user_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "state"
    folder.mkdir(mode=0o700)
    owner = folder.stat().st_uid
    if owner == 0:
        os.chown(folder, 4242, -1)  # root may hand it to anyone; root's own folders are allowed
        owner = 4242
    else:
        monkeypatch.setattr(os, "geteuid", lambda: owner + 1)
    with pytest.raises(ConfigError, match=f"belongs to uid {owner}"):
        StateKeeper(str(folder))


def test_a_link_as_folder_is_refused(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(tmp_path / "real")
    with pytest.raises(ConfigError, match="symbolic link"):
        StateKeeper(str(tmp_path / "link"))


def test_a_folder_readable_by_others_but_written_only_by_its_user_is_fine(tmp_path: Path) -> None:
    folder = tmp_path / "state"
    folder.mkdir()
    os.chmod(folder, 0o755)  # what systemd's StateDirectory= makes
    saved_state(folder)
    assert (folder / STATE_FILE).exists()


# -- writing ---------------------------------------------------------------------------------------
def test_a_planted_temporary_link_is_never_written_through(tmp_path: Path) -> None:
    victim = tmp_path / "root-only"
    victim.write_bytes(b"precious")
    folder = tmp_path / "state"
    folder.mkdir(mode=0o700)
    (folder / f".{STATE_FILE}.tmp").symlink_to(victim)
    saved_state(folder)
    assert victim.read_bytes() == b"precious"
    assert json.loads((folder / STATE_FILE).read_text())["format"] == FORMAT
    assert sorted(p.name for p in folder.iterdir()) == [STATE_FILE]  # the link is gone, no .tmp left


def test_a_write_that_fails_leaves_no_temporary_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(state_files.os, "fsync", full)  # where a full disk shows (the data is written back)
    with caplog.at_level(logging.ERROR, logger="packrat.daemon"):
        saved_state(tmp_path)  # logged, never raised: the daemon keeps serving
    assert "could not write" in caplog.text and "No space left" in caplog.text
    assert list(tmp_path.iterdir()) == []


# -- reading ---------------------------------------------------------------------------------------
def _starts_with(folder: Path, caplog: pytest.LogCaptureFixture) -> StateKeeper:
    with caplog.at_level(logging.WARNING, logger="packrat.daemon"):
        keeper = StateKeeper(str(folder))
    assert keeper.saved == {} and keeper.resumed is None
    assert not (folder / STATE_FILE).exists() and not (folder / STATE_FILE).is_symlink()
    assert len(_set_aside(folder)) == 1 and "measuring again" in caplog.text
    return keeper


def test_deeply_nested_json_is_set_aside_not_a_recursion_error(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / STATE_FILE).write_bytes(b"[" * 100_000)
    _starts_with(tmp_path, caplog)
    assert "nests too deeply" in caplog.text


def test_a_link_to_dev_zero_is_set_aside_unread(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / STATE_FILE).symlink_to("/dev/zero")
    _starts_with(tmp_path, caplog)
    assert "symbolic link" in caplog.text
    assert _set_aside(tmp_path)[0].is_symlink()  # the link itself was renamed


def test_a_fifo_is_set_aside_without_waiting_for_a_writer(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    os.mkfifo(tmp_path / STATE_FILE)
    _starts_with(tmp_path, caplog)
    assert "not a plain file" in caplog.text


def test_a_file_over_the_bound_is_set_aside_unread(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with open(tmp_path / STATE_FILE, "wb") as handle:
        handle.truncate(MAX_STATE_BYTES + 1)  # sparse: the size alone refuses it
    _starts_with(tmp_path, caplog)
    assert "more than the" in caplog.text


def test_a_file_others_may_write_is_set_aside(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    saved_state(tmp_path)
    os.chmod(tmp_path / STATE_FILE, 0o666)
    _starts_with(tmp_path, caplog)
    assert "written by group or others" in caplog.text


def test_a_missing_file_is_none(tmp_path: Path) -> None:
    assert read_bounded(tmp_path / STATE_FILE) is None


# -- the saved plan ----------------------------------------------------------------------------------
def _with_plan(folder: Path, plan: dict[str, object]) -> None:
    path = folder / STATE_FILE
    document = json.loads(path.read_text())
    document["served"]["plan"] = plan
    path.write_text(json.dumps(document))


@pytest.mark.parametrize(
    "plan",
    [
        {"policy": "packrat", "instances": [{"threads": 1, "batch": 1}] * 1000, "oversubscribed": True},
        {"policy": "packrat", "instances": [{"threads": 1, "batch": 1}] * 1000},
        {"policy": "packrat", "instances": [{"threads": 1, "batch": 1}],
         "alternatives": [[{"threads": 1, "batch": 1}] * 1000]},
        {"policy": "packrat", "instances": [{"threads": 1, "batch": 1}],
         "alternatives": [[{"threads": 1, "batch": 1}]] * 10},
    ],
    ids=["1000-oversubscribed", "1000-instances", "1000-in-a-spare", "10-spare-layouts"],
)  # fmt: skip
def test_a_crafted_saved_plan_is_refused_and_logged(
    tmp_path: Path, plan: dict[str, object], caplog: pytest.LogCaptureFixture
) -> None:
    saved_state(tmp_path)
    _with_plan(tmp_path, plan)
    keeper = StateKeeper(str(tmp_path))
    with caplog.at_level(logging.WARNING, logger="packrat.daemon"):
        assert keeper.resumed_plan("torch", "packrat", TOPOLOGY, 4) is None
    assert "the saved plan is not served here" in caplog.text


def test_a_plan_fits_when_each_layout_fits_the_cores() -> None:
    two = (InstancePlan(1, 2), InstancePlan(1, 2))
    plan = Plan(two, "packrat", "", alternatives=((InstancePlan(2, 4),),))
    assert plan.misfit(TOPOLOGY, 4) is None
    assert "more than max_batch 2" in (plan.misfit(TOPOLOGY, 2) or "")
    assert "only 1 are usable" in (plan.misfit(Topology.synthetic(1), 4) or "")
    many = Plan(two, "packrat", "", alternatives=(two,) * MAX_LAYOUTS)
    assert "layouts" in (many.misfit(TOPOLOGY, 4) or "")
    torchserve = Plan((InstancePlan(2, 1),) * 4, "torchserve", "", oversubscribed=True)
    assert torchserve.misfit(Topology.synthetic(2, smt=2), 4) is None  # one worker per logical CPU
    assert torchserve.misfit(TOPOLOGY, 4) is not None
