"""The `status` reply laid out from a snapshot: `info`'s fields, then the live state, as docs/status.md lists it."""

from __future__ import annotations

from dataclasses import replace

from packrat_daemon.control.status import Snapshot, live_status
from packrat_daemon.fleet.pool import WorkerHandle, WorkerState
from packrat_daemon.fleet.reconciler import Reconfiguration
from policies.base import InstancePlan, Plan
from policies.planning.distribution import BatchDistribution

OLD = Plan((InstancePlan(2, 4),), "fixed", "configured")
NEW = Plan((InstancePlan(1, 4), InstancePlan(1, 4)), "fixed", "asked for")


def snapshot() -> Snapshot:
    serving = WorkerHandle(3, 1, (1,), 2, WorkerState.READY, pid=103, served=7)
    parked = WorkerHandle(1, 2, (0, 1), 1, WorkerState.READY, pid=101, parked_since=50.0)
    switching = WorkerHandle(2, 2, (0, 1), 1, WorkerState.READY, pid=102, pending=(1, (0,), 2))
    change = Reconfiguration(2, "control: --plan 2*1x4", OLD, NEW, decided=10.0, wall=1e9, serving=10.5)
    return Snapshot(
        info={"model": "builtin:tiny-mlp", "workers": [], "plan": NEW.to_json()},
        runtime="torch",
        workers=[serving, parked, switching],
        serving=frozenset({3}),
        generation=2,
        history=[change],
        policy="fixed",
        adapting=False,
        adapt_interval_s=5.0,
        override="--plan 2*1x4",
        distribution=BatchDistribution.from_counts({1: 3.0, 4: 1.0}),
        batches_per_s=2.5,
        inputs_per_s=4.0,
        half_life_s=30.0,
        queued_requests=1,
        queued_inputs=4,
        max_queued_inputs=64,
        batch_in_flight=True,
        accepting=True,
        profile={"measured_offline": 0},
    )


def test_the_reply_is_info_then_the_live_state() -> None:
    reply = live_status(snapshot())
    assert list(reply) == [
        "model", "workers", "plan", "generation", "planning", "traffic", "queue", "profile", "share",
        "runtime_choice", "gateway", "predictions", "history",
    ]  # fmt: skip
    assert reply["model"] == "builtin:tiny-mlp" and reply["generation"] == 2
    assert reply["planning"] == {
        "policy": "fixed",
        "adapting": False,
        "adapt_interval_s": 5.0,
        "override": "--plan 2*1x4",
    }
    assert reply["traffic"] == {
        "batch_sizes": [[1, 0.75], [4, 0.25]],
        "batches_per_s": 2.5,
        "inputs_per_s": 4.0,
        "half_life_s": 30.0,
        "tokens": None,
    }  # fmt: skip  (a fixed-shape model)
    assert reply["queue"] == {"requests": 1, "inputs": 4, "max_inputs": 64, "batch_in_flight": True, "accepting": True}
    assert reply["profile"] == {"measured_offline": 0}
    assert [h["reason"] for h in reply["history"]] == ["control: --plan 2*1x4"]


def test_every_live_worker_is_listed_by_id_with_its_state_and_whether_it_serves() -> None:
    workers = live_status(snapshot())["workers"]
    assert [(w["id"], w["state"], w["serving"]) for w in workers] == [
        (1, "parked", False),
        (2, "switching", False),
        (3, "ready", True),
    ]
    assert workers[2] == {"id": 3, "pid": 103, "runtime": "torch", "threads": 1, "cores": [1], "state": "ready",
                          "serving": True, "generation": 2, "batches_served": 7}  # fmt: skip


def test_no_batch_seen_yet_has_no_batch_sizes_and_the_info_given_is_not_changed() -> None:
    quiet = replace(snapshot(), distribution=None)
    reply = live_status(quiet)
    assert reply["traffic"]["batch_sizes"] == []
    assert quiet.info["workers"] == []  # the reply's own list, not the frontend's dict written over


def test_the_runtime_choice_is_shown_as_the_state_keeper_gives_it() -> None:
    candidates = [
        {"candidate": "openvino/bf16", "verdict": "served", "predicted_ms": 2.0, "why": "fastest"},
        {"candidate": "torch", "verdict": "slower", "predicted_ms": 8.0, "why": "+300%"},
    ]
    choice = {"served": "openvino/bf16", "decided_at_this_start": True, "decided_age_s": 1.0, "candidates": candidates}
    assert live_status(replace(snapshot(), runtime_choice=choice))["runtime_choice"] == choice
    assert live_status(snapshot())["runtime_choice"] is None  # before a choice (a test's snapshot)
