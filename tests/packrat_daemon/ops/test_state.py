"""The state file: what it keeps, what it gives back, and the files it sets aside (corrupt or mismatched).

A daemon restarted with SIGKILL and serving its learned plan again runs in test_state_restart below.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from packrat_daemon.adapt.online import OnlineAdaptation
from packrat_daemon.config import ServeConfig
from packrat_daemon.ops.state import STATE_FILE, Entry, StateKeeper, identity, mismatch
from policies.base import InstancePlan, Plan
from policies.planning.profile import Profile
from policies.planning.topology import Topology

CONFIG = ServeConfig(model="builtin:tiny-mlp", max_batch=4)
TOPOLOGY = Topology.synthetic(2)
PROFILE = Profile.from_latencies({(1, 4): 3.0, (2, 4): 2.0}, model="builtin:tiny-mlp", runtime="torch")
PLAN = Plan((InstancePlan(1, 2), InstancePlan(1, 2)), "packrat", "a split", 1.5, alternatives=((InstancePlan(2, 4),),))


class Serving:
    """What the daemon hands the state: its plan, offline profile and adaptation."""

    def __init__(self, plan: Plan = PLAN) -> None:
        self.plan, self.profile = plan, PROFILE
        self.adaptation = OnlineAdaptation(CONFIG, _policy(), PROFILE, TOPOLOGY)


def _policy() -> Any:
    from policies.packrat import PackratPolicy

    return PackratPolicy()


def saved_state(folder: Path, learn: bool = True) -> Serving:
    """A keeper that measured torch's profile, served PLAN and learned two cells in production, then stopped."""
    keeper = StateKeeper(str(folder))
    keeper.record("torch", Entry(identity(CONFIG, "torch", "fp32", TOPOLOGY), PROFILE, {(1, 1): 0.5}))
    keeper.served_key = "torch"
    serving = Serving()
    if learn:
        now = time.monotonic()
        for k in range(5):
            serving.adaptation.production.observe(1, 2, 1.6, now - 10 + k)
            serving.adaptation.production.observe(2, 4, 2.2, now - 10 + k)
    keeper.save(serving, "stop")
    return serving


def test_what_was_learned_comes_back_after_a_restart(tmp_path: Path) -> None:
    saved_state(tmp_path)
    document = json.loads((tmp_path / STATE_FILE).read_text())
    assert document["entries"]["torch"]["estimated"] == [[1, 1, 0.5]]  # kept apart from the measured cells
    assert {tuple(c[:2]) for c in document["served"]["production"]} == {(1, 2), (2, 4)}
    time.sleep(0.05)
    keeper = StateKeeper(str(tmp_path))
    entry = keeper.restore("torch", identity(CONFIG, "torch", "fp32", TOPOLOGY))
    assert entry is not None and entry.profile == PROFILE and entry.estimated == {(1, 1): 0.5}
    plan = keeper.resumed_plan("torch", "packrat", TOPOLOGY, 4)
    assert plan is not None and plan.layouts == PLAN.layouts and plan.predicted_latency_ms == 1.5
    keeper.record("torch", entry)  # as start-up does with what it serves
    keeper.served_key, keeper.restored_from = "torch", str(tmp_path / STATE_FILE)
    fresh = Serving()
    keeper.attach(fresh.adaptation)
    restored = {c.key: c for c in fresh.adaptation.production.export(time.monotonic())}
    assert set(restored) == {(1, 2), (2, 4)}
    assert restored[(1, 2)].latency_ms == pytest.approx(1.6) and 4.5 < restored[(1, 2)].weight <= 5.0
    assert restored[(1, 2)].age_s >= 6.0  # aged by the time since its last sample, downtime included
    provenance = keeper.provenance(fresh, time.monotonic())
    assert provenance["measured_offline"] == 2 and provenance["estimated"] == 1
    assert provenance["learned_in_production"] == 2 and provenance["restored_from"] == str(tmp_path / STATE_FILE)


def test_a_saved_plan_that_no_longer_fits_is_not_served(tmp_path: Path) -> None:
    saved_state(tmp_path)
    keeper = StateKeeper(str(tmp_path))
    assert keeper.resumed_plan("torch", "single", TOPOLOGY, 4) is None  # another policy now
    assert (
        keeper.resumed_plan("torch", "packrat", Topology.synthetic(1), 4) is None
    )  # fewer cores than the plan's threads
    assert keeper.resumed_plan("torch", "packrat", TOPOLOGY, 1) is None  # max_batch shrank below an instance's batch
    assert keeper.resumed_plan("openvino", "packrat", TOPOLOGY, 4) is None


@pytest.mark.parametrize(
    "content",
    [b"\xff\xfe not utf-8", b"{not json", b"[]", b'{"format": 99}', b'{"format": 2, "entries": {"torch": {}}}',
     b'{"format": 2, "saved_unix": 1, "entries": {"torch": {"identity": {"model": "m", "runtime": "torch", '
     b'"precision": "fp32"}, "measured_unix": 1, "cells": [[1, 1, -5.0, 1, null]]}}}'],
    ids=["not-utf8", "not-json", "a-list", "another-format", "an-entry-without-cells", "a-negative-latency"],
)  # fmt: skip
def test_a_corrupt_file_is_set_aside_and_never_stops_a_start(
    tmp_path: Path, content: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / STATE_FILE).write_bytes(content)
    with caplog.at_level(logging.WARNING, logger="packrat.daemon"):
        keeper = StateKeeper(str(tmp_path))
    assert keeper.saved == {} and keeper.resumed is None
    assert not (tmp_path / STATE_FILE).exists()
    aside = [p for p in tmp_path.iterdir() if p.name.startswith(f"{STATE_FILE}.set-aside-")]
    assert len(aside) == 1 and aside[0].read_bytes() == content  # kept for a look
    assert "set" in caplog.text and "aside" in caplog.text and "measuring again" in caplog.text


@pytest.mark.parametrize(
    ("field", "value", "why"),
    [
        ("model", "builtin:resnet50", "model 'builtin:resnet50' → 'builtin:tiny-mlp'"),
        ("model_sha256", "0" * 64, "the model file changed"),
        ("profile_sha256", "0" * 64, "the --profile file changed"),
        ("runtime", "openvino", "runtime"),
        ("precision", "bf16", "precision 'bf16' → 'fp32'"),
        ("usable_cores", 16, "usable_cores 16 → 2"),
        ("versions", {"torch": "1.0.0"}, "torch 1.0.0 → "),
    ],
)
def test_a_file_measured_for_another_setting_is_set_aside_saying_why(
    tmp_path: Path, field: str, value: object, why: str, caplog: pytest.LogCaptureFixture
) -> None:
    saved_state(tmp_path)
    current = identity(CONFIG, "torch", "fp32", TOPOLOGY)
    changed = dict(current, **{field: value})
    assert mismatch(current, current) is None
    keeper = StateKeeper(str(tmp_path))
    with caplog.at_level(logging.WARNING, logger="packrat.daemon"):
        # The file says `changed`; this daemon is `current`.
        keeper.saved["torch"].identity = changed
        assert keeper.restore("torch", current) is None
    assert why in caplog.text and "measured for another setting" in caplog.text
    assert not (tmp_path / STATE_FILE).exists() and keeper.resumed is None


def test_a_model_file_is_known_by_its_content(tmp_path: Path) -> None:
    model = tmp_path / "model.pt2"
    model.write_bytes(b"weights")
    config = ServeConfig(model=str(model))
    first = identity(config, "torch", "fp32", TOPOLOGY)
    model.write_bytes(b"other weights")
    assert mismatch(first, identity(config, "torch", "fp32", TOPOLOGY)) == "the model file changed"


def test_writes_are_atomic_and_without_a_state_dir_nothing_is_written(tmp_path: Path) -> None:
    saved_state(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [STATE_FILE]  # no temporary file left behind
    keeper = StateKeeper(None)
    keeper.served_key = "torch"
    keeper.save(Serving(), "stop")
    keeper.tick(Serving(), time.monotonic())
    assert keeper.provenance(Serving())["state_file"] is None


@pytest.mark.slow
def test_a_daemon_killed_with_sigkill_serves_its_learned_plan_again_without_profiling(tmp_path: Path) -> None:
    from tests.helpers.daemons import running_daemon

    state = tmp_path / "state"
    args = ("--model", "builtin:tiny-mlp", "--max-batch", "4", "--state-dir", str(state))
    with running_daemon(tmp_path, *args) as (_, process):
        deadline = time.monotonic() + 30
        while not (state / STATE_FILE).exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        first = json.loads((state / STATE_FILE).read_text())
        os.kill(process.pid, signal.SIGKILL)
        process.wait(10)
    assert "profiling torch" in (tmp_path / "daemon.log").read_text()
    os.rename(tmp_path / "daemon.log", tmp_path / "first.log")
    with running_daemon(tmp_path, *args):
        pass
    log = (tmp_path / "daemon.log").read_text()
    assert "profiling torch" not in log
    assert "not measured again" in log and "state: serving the learned plan" in log
    served = first["served"]["plan"]["instances"]
    assert f"batch {served[0]['batch']}⟩" in log


def test_a_state_dir_that_cannot_be_made_fails_before_anything_loads(tmp_path: Path) -> None:
    from packrat_daemon.wire.errors import ConfigError

    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    with pytest.raises(ConfigError, match="--state-dir .*cannot create it"):
        StateKeeper(str(blocker / "state"))


def test_the_default_state_folder_is_systemds_else_the_users_per_model_and_policy(tmp_path: Path) -> None:
    from packrat_daemon.ops.state import state_folder

    assert state_folder("/srv/state", "builtin:resnet50", "packrat") == "/srv/state"  # as given
    assert state_folder("none", "builtin:resnet50", "packrat") is None  # nothing kept
    unit = {"STATE_DIRECTORY": "/var/lib/packrat:/var/lib/other", "XDG_STATE_HOME": str(tmp_path)}
    assert state_folder(None, "builtin:resnet50", "packrat", unit) == "/var/lib/packrat"
    xdg = state_folder(None, "builtin:resnet50", "packrat", {"XDG_STATE_HOME": str(tmp_path), "HOME": "/nowhere"})
    assert xdg is not None and Path(xdg).parent == tmp_path / "packrat"
    assert Path(xdg).name.startswith("builtin-resnet50-packrat-")
    home = state_folder(None, "builtin:resnet50", "packrat", {"HOME": str(tmp_path)})
    assert home is not None and Path(home).parent == tmp_path / ".local" / "state" / "packrat"
    # Two daemons of one user never share a file: another policy (the demo's `single`) or model, another folder.
    others = {state_folder(None, m, p, {"HOME": str(tmp_path)}) for m in ("builtin:resnet50", "builtin:tiny-mlp")
              for p in ("packrat", "single")}  # fmt: skip
    assert len(others) == 4


def test_a_default_state_folder_that_cannot_be_used_keeps_nothing_and_never_stops_a_start(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    with caplog.at_level(logging.WARNING, logger="packrat.daemon"):
        keeper = StateKeeper(str(blocker / "state"), default=True)
    assert keeper.path is None and "the default state folder cannot be used" in caplog.text
    keeper.served_key = "torch"
    keeper.save(Serving(), "stop")  # writes nothing, raises nothing
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]


SETTINGS = {"policy": "packrat", "max_batch": 4, "batches": []}


def choice_saved(folder: Path, guard: dict[str, Any] | None = None) -> dict[str, dict[str, Any]]:
    """A start that chose torch over torch/bf16 (refused by the guard) and kept that: the identities it held for."""
    from packrat_daemon.measure.runtime_choice import REFUSED, SERVED, Verdict
    from packrat_daemon.ops.state import Choice

    identities = {
        "torch": identity(CONFIG, "torch", "fp32", TOPOLOGY),
        "torch/bf16": identity(CONFIG, "torch", "bf16", TOPOLOGY),
    }
    keeper = StateKeeper(str(folder))
    keeper.record("torch", Entry(identities["torch"], PROFILE, guard=guard))
    keeper.served_key = "torch"
    keeper.choice = Choice([Verdict("torch", SERVED, 1.5, "the fastest"),
                            Verdict("torch/bf16", REFUSED, None, "accuracy guard: failed")], identities,
                           SETTINGS)  # fmt: skip
    keeper.save(Serving(), "stop")
    return identities


def test_a_restart_among_the_same_candidates_serves_the_one_chosen_with_its_verdicts(tmp_path: Path) -> None:
    guard = {"result": {"max_rel_error": 0.01}, "settings": {"max_rel_error": 0.05}}
    identities = choice_saved(tmp_path, guard)
    keeper = StateKeeper(str(tmp_path))
    assert keeper.warm_choice(identities, SETTINGS) == "torch"
    assert keeper.saved["torch"].guard == guard  # the guard's verdict comes back with the profile
    status = keeper.choice_status()
    assert status is not None and status["served"] == "torch" and status["decided_at_this_start"] is False
    assert [(c["candidate"], c["verdict"]) for c in status["candidates"]] == [("torch", "served"),
                                                                              ("torch/bf16", "refused")]  # fmt: skip


WHY_NOT = {
    "another candidate": "the candidates changed (torch, torch/bf16 at the kept choice, openvino, torch, "
    "torch/bf16 now)",
    "another library version": "the kept choice was made for another setting (torch/bf16: torch ",
    "other batch sizes": "the kept choice was made for other settings (batches [] → [1, 16])",
    "no choice kept": "no choice was kept in ",
}


@pytest.mark.parametrize("change", list(WHY_NOT))
def test_a_restart_chooses_again_when_the_candidates_or_their_identity_changed(tmp_path: Path, change: str) -> None:
    identities = choice_saved(tmp_path)
    if change == "another candidate":
        identities["openvino"] = identity(CONFIG, "openvino", "fp32", TOPOLOGY)
    elif change == "another library version":
        identities["torch/bf16"] = {**identities["torch/bf16"], "versions": {"torch": "0.0.1"}}
    elif change == "no choice kept":
        data = json.loads((tmp_path / STATE_FILE).read_text())
        data["choice"] = None
        (tmp_path / STATE_FILE).write_text(json.dumps(data))
    keeper = StateKeeper(str(tmp_path))
    settings = {**SETTINGS, "batches": [1, 16]} if change == "other batch sizes" else SETTINGS
    assert keeper.warm_choice(identities, settings) is None
    assert keeper.choice is None and keeper.choice_restored is False
    assert keeper.not_reused is not None and keeper.not_reused.startswith(WHY_NOT[change])  # said by status, the demo


def test_why_a_kept_choice_is_not_served_says_a_state_folder_of_none_and_a_file_set_aside(tmp_path: Path) -> None:
    identities = choice_saved(tmp_path)
    nowhere = StateKeeper(None)
    assert nowhere.warm_choice(identities, SETTINGS) is None
    assert (
        nowhere.not_reused == "nothing is kept across starts (--state-dir none, or a state folder that cannot be used)"
    )
    (tmp_path / STATE_FILE).write_text("{not json")
    keeper = StateKeeper(str(tmp_path))
    assert keeper.warm_choice(identities, SETTINGS) is None
    assert keeper.not_reused is not None and keeper.not_reused.startswith("the state file was set aside: ")


def test_a_crafted_verdict_sets_the_file_aside(tmp_path: Path) -> None:
    choice_saved(tmp_path)
    data = json.loads((tmp_path / STATE_FILE).read_text())
    data["choice"]["candidates"][0]["verdict"] = "best ever"
    (tmp_path / STATE_FILE).write_text(json.dumps(data))
    keeper = StateKeeper(str(tmp_path))
    assert keeper.saved_choice is None and keeper.saved == {}
    assert any(".set-aside-" in p.name for p in tmp_path.iterdir())


def test_a_plan_restored_and_saved_again_says_restored_once() -> None:
    from packrat_daemon.ops.state import plan_from_json

    once = plan_from_json(PLAN.to_json())
    assert once.reason == "restored from the state file (a split)"
    assert plan_from_json(once.to_json()).reason == once.reason
