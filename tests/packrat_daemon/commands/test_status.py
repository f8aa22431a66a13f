"""`packrat status`'s human view of a status reply: the plan and why, the workers' table, traffic and queue,
where the profile comes from, and the plan history (the reply itself is tested on a real daemon in
control/test_server.py)."""

from __future__ import annotations

import copy
import datetime
import re
from typing import Any

import pytest

from packrat_daemon.cli import build_parser
from packrat_daemon.commands.status import render

START = datetime.datetime(2026, 11, 30, 20, 4, 18, tzinfo=datetime.UTC).timestamp()

# The reply of docs/status.md's example: a tiny model on two cores, switched by hand, then back to automatic.
STATUS: dict[str, Any] = {
    "model": "builtin:tiny-mlp",
    "runtime": "torch",
    "precision": "fp32",
    "max_batch": 8,
    "generation": 3,
    "plan": {
        "policy": "packrat",
        "instances": [{"threads": 2, "batch": 4}],
        "alternatives": [],
        "split": "exact",
        "predicted_latency_ms": 0.0412,
        "reason": "exact optimum for batch 4 on 2 cores",
    },
    "planning": {"policy": "packrat", "adapting": True, "override": None},
    "workers": [
        {
            "id": 4,
            "pid": 22430,
            "runtime": "torch",
            "threads": 2,
            "cores": [0, 1],
            "state": "ready",
            "serving": True,
            "batches_served": 500,
        },
        {
            "id": 5,
            "pid": 22452,
            "runtime": "torch",
            "threads": 1,
            "cores": [1],
            "state": "parked",
            "serving": False,
            "batches_served": 200,
        },
    ],
    "traffic": {"half_life_s": 60.0, "inputs_per_s": 498.24, "batches_per_s": 124.56, "batch_sizes": [[4, 1.0]]},
    "queue": {"requests": 0, "inputs": 0, "max_inputs": 1024, "batch_in_flight": False, "accepting": True},
    "profile": {
        "measured_offline": 8,
        "offline_age_s": 4.2,
        "estimated": 0,
        "learned_in_production": 2,
        "production": [
            {"threads": 1, "batch": 2, "latency_ms": 0.1004, "weight": 399.14, "age_s": 2.0},
            {"threads": 2, "batch": 4, "latency_ms": 0.0611, "weight": 299.1, "age_s": 1.2},
        ],
    },
    "history": [
        {
            "time": START,
            "reason": "start",
            "from": None,
            "to": "packrat: 1×⟨2 threads, batch 8⟩",
            "predicted_gain": None,
            "first_serving_s": 0.068,
            "serving_s": 0.068,
            "retired_s": 0.068,
            "superseded": False,
        },
        {
            "time": START + 2,
            "reason": "control: --plan 2*1x4",
            "from": "packrat: 1×⟨2 threads, batch 8⟩",
            "to": "fixed: 2×⟨1 thread, batch 4⟩",
            "predicted_gain": -1.7,
            "first_serving_s": 0.0009,
            "serving_s": 0.0679,
            "retired_s": 0.0679,
            "superseded": False,
        },
    ],
}

EXPECTED = """\
model builtin:tiny-mlp on torch (fp32), max batch 8

plan (generation 3): packrat, threads per instance 2, split exact, predicted 0.0412 ms
  why: exact optimum for batch 4 on 2 cores
  planning: policy packrat, adapting yes

workers:
  id  pid    runtime  threads  cores  state                 batches
  4   22430  torch    2        0,1    ready                 500
  5   22452  torch    1        1      parked (not serving)  200

traffic (half-life 60 s): 498.2 inputs/s in 124.6 batches/s; batch sizes 4: 100%
queue: 0 request(s), 0/1024 inputs, batch in flight: no

profile: 8 cell(s) measured at start, 4 s ago; 0 estimated by the start-up search (not served on)
production: 2 cell(s) timed while serving, 2 with enough samples to count: online adaptation plans on the profile \
rescaled to these and merged with them
  ⟨1 thread(s), batch 2⟩: 0.10 ms, weight 399.1 (counts), last seen 2 s ago
  ⟨2 thread(s), batch 4⟩: 0.06 ms, weight 299.1 (counts), last seen 1 s ago

plan history:"""
HISTORY_HEADER = ["time (UTC)", "reason", "from", "to", "gain", "first", "serving", "retired"]


def status(**changes: Any) -> dict[str, Any]:
    """STATUS with top-level parts replaced or, for a dict part given as a dict, updated."""
    reply = copy.deepcopy(STATUS)
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(reply.get(key), dict):
            reply[key].update(value)
        else:
            reply[key] = value
    return reply


def history_rows(text: str) -> list[list[str]]:
    """The plan history's table, each row split into its cells."""
    table = text.split("plan history:\n", 1)[1]
    return [re.split(r"\s{2,}", line.strip()) for line in table.splitlines()]


def test_the_view_of_a_status_reply() -> None:
    text = render(STATUS)
    assert text.startswith(EXPECTED)
    assert history_rows(text) == [
        HISTORY_HEADER,
        ["2026-11-30 20:04:18", "start", "-", "packrat: 1×⟨2 threads, batch 8⟩", "-", "68 ms", "68 ms", "68 ms"],
        ["2026-11-30 20:04:20", "control: --plan 2*1x4", "packrat: 1×⟨2 threads, batch 8⟩",
         "fixed: 2×⟨1 thread, batch 4⟩", "-170.0%", "1 ms", "68 ms", "68 ms"],
    ]  # fmt: skip
    header, *rows = text.splitlines()[-3:]
    assert [row.rindex("68 ms") for row in rows] == [header.index("retired")] * 2, "the columns line up"


def test_spare_layouts_an_operators_request_and_no_prediction() -> None:
    plan = {"alternatives": [[{"threads": 1, "batch": 2}, {"threads": 1, "batch": 2}]], "predicted_latency_ms": None}
    text = render(status(plan=plan, planning={"adapting": False, "override": "--plan 2*1x4"}))
    assert "threads per instance 2 | 1 + 1, split exact\n" in text
    assert "  planning: policy packrat, adapting no, operator asked --plan 2*1x4\n" in text


def test_an_emulated_daemon_says_so_under_the_model() -> None:
    lines = render(status(emulation={"profile": "p.csv"})).splitlines()
    assert lines[1].startswith("EMULATED: the workers compute nothing")
    assert "EMULATED" not in render(STATUS)


def test_no_batches_yet_and_a_draining_queue() -> None:
    traffic = {"batch_sizes": [], "inputs_per_s": 0.0, "batches_per_s": 0.0}
    queue = {"requests": 3, "inputs": 7, "batch_in_flight": True, "accepting": False}
    text = render(status(traffic=traffic, queue=queue))
    assert "batch sizes none yet\n" in text
    assert "queue: 3 request(s), 7/1024 inputs, batch in flight: yes, not accepting (draining)\n" in text
    mixed = render(status(traffic={"batch_sizes": [[1, 0.25], [8, 0.75]]}))
    assert "batch sizes 1: 25%, 8: 75%\n" in mixed


@pytest.mark.parametrize(
    ("age_s", "text"), [(119.4, "119 s"), (120.0, "2 min"), (7199.0, "120 min"), (9000.0, "2.5 h")]
)
def test_ages_read_in_seconds_minutes_or_hours(age_s: float, text: str) -> None:
    assert f"measured at start, {text} ago;" in render(status(profile={"offline_age_s": age_s}))


def test_a_profile_restored_and_kept_in_a_state_file() -> None:
    profile = {"offline_age_s": None, "restored_from": "/var/lib/packrat/state.json",
               "state_file": "/var/lib/packrat/state.json", "saved_age_s": 30.0, "production": []}  # fmt: skip
    lines = render(status(profile=profile)).splitlines()
    start = lines.index(next(line for line in lines if line.startswith("profile:")))
    assert lines[start].startswith("profile: 8 cell(s) measured at start; 0 estimated")
    assert lines[start + 1 : start + 3] == [
        "  restored from /var/lib/packrat/state.json",
        "  kept in /var/lib/packrat/state.json, saved 30 s ago",
    ]


def test_a_superseded_change_and_one_still_under_way() -> None:
    history = copy.deepcopy(STATUS["history"])
    history[1].update(superseded=True, predicted_gain=0.125)
    history.append({**history[0], "time": START + 3, "reason": "adapt", "first_serving_s": None, "serving_s": None,
                    "retired_s": None})  # fmt: skip
    rows = history_rows(render(status(history=history)))
    assert rows[2][-4:] == ["+12.5%", "1 ms", "68 ms", "superseded"]
    assert rows[3] == ["2026-11-30 20:04:21", "adapt", "-", "packrat: 1×⟨2 threads, batch 8⟩", "-", "-", "-", "-"]


def test_the_command_reads_its_endpoint_timeout_and_json_flag() -> None:
    args = build_parser().parse_args(["status", "--endpoint", "ipc:///run/packrat/front.ipc"])
    assert (args.endpoint, args.timeout, args.json) == ("ipc:///run/packrat/front.ipc", 5.0, False)
    args = build_parser().parse_args(["status", "--endpoint", "tcp://127.0.0.1:5555", "--timeout", "1.5", "--json"])
    assert (args.timeout, args.json) == (1.5, True)


def test_the_runtime_choice_lists_each_candidate_with_its_verdict_and_why() -> None:
    choice = {
        "served": "openvino/bf16",
        "decided_at_this_start": False,
        "decided_age_s": 7200.0,
        "candidates": [
            {"candidate": "torch", "verdict": "slower", "predicted_ms": 1173.0, "why": "+343% on openvino/bf16's"},
            {"candidate": "openvino/bf16", "verdict": "served", "predicted_ms": 265.0, "why": "predicted: …"},
            {"candidate": "torch/bf16", "verdict": "refused", "predicted_ms": None, "why": "accuracy guard: failed"},
        ],
    }
    lines = render(status(runtime_choice=choice)).splitlines()
    at = lines.index("runtime choice (at a start 2.0 h ago): serving openvino/bf16")
    assert lines[at + 1 : at + 4] == [
        "  torch: slower, predicted 1173 ms: +343% on openvino/bf16's",
        "  openvino/bf16: served, predicted 265 ms: predicted: …",
        "  torch/bf16: refused: accuracy guard: failed",
    ]
    assert "runtime choice" not in render(STATUS)  # one candidate (or an older daemon): nothing to choose between


def test_the_gateway_beside_the_daemon_says_whether_it_serves_and_why_not() -> None:
    assert "gateway" not in render(STATUS)  # none runs
    serving = {"serving": True, "restarts": 0, "last_exit": None, "describe": "REST :8000 and gRPC :8001: serving"}
    assert "\ngateway: REST :8000 and gRPC :8001: serving\n" in render(status(gateway=serving))
    down = {"serving": False, "restarts": 2, "last_exit": -9,
            "describe": "REST :8000: down (exit -9), restart 2 in 0.4 s"}  # fmt: skip
    assert "gateway: REST :8000: down (exit -9), restart 2 in 0.4 s, 2 restart(s), last exit -9" in render(
        status(gateway=down)
    )


def test_cells_measured_while_a_first_answer_served_and_a_crowded_measurement_are_said() -> None:
    crowding = {"on_cpu": 0.48, "crowded": 6, "cells": 8, "load": 3.1, "cpus": 2, "contended": True,
                "describe": "measured while other work ran on its cores: 6 of 8 cell(s) ..."}  # fmt: skip
    text = render(status(profile={"measured_while": "torch", "contention": crowding}))
    assert "profile: 8 cell(s) measured at start in the background, while torch served, 4 s ago;" in text
    assert (
        "  WARNING: measured while other work ran on its cores: 6 of 8 cell(s) ...; a start on a quiet "
        "machine measures it again\n" in text
    )


def test_production_cells_that_do_not_count_yet_are_told_apart() -> None:
    production = [
        {"threads": 1, "batch": 2, "latency_ms": 0.1, "weight": 1.0, "age_s": 2.0, "counts": False},
        {"threads": 2, "batch": 4, "latency_ms": 0.06, "weight": 9.0, "age_s": 1.0, "counts": True},
    ]
    text = render(status(profile={"learned_in_production": 1, "production": production},
                         planning={"adapting": False}))  # fmt: skip
    assert "production: 2 cell(s) timed while serving, 1 with enough samples to count: kept, not planned on" in text
    assert "⟨1 thread(s), batch 2⟩: 0.10 ms, weight 1.0 (too few samples yet)" in text


def test_predicted_against_measured_per_layout_and_when_they_disagree() -> None:
    rows = [{"layout": "2", "batches": 40, "measured_ms": 8.1, "predicted_ms": 12.3, "ratio": 0.6585,
             "disagrees": True},
            {"layout": "1+1", "batches": 5, "measured_ms": 10.0, "predicted_ms": 10.2, "ratio": 0.98,
             "disagrees": False}]  # fmt: skip
    text = render(status(predictions={"noise": 0.06, "layouts": rows}))
    assert "predicted against measured (compute per batch on this plan; the profile's noise ±6%):\n" in text
    assert "  layout 2: 40 batch(es), measured 8.10 ms, predicted 12.30 ms (0.66×): disagree beyond the noise" in text
    assert "  layout 1+1: 5 batch(es), measured 10.00 ms, predicted 10.20 ms (0.98×): agree within the noise" in text
    assert "do not hold on this machine now: production timings correct the plan as it serves" in text
    assert "predicted against measured" not in render(STATUS)  # nothing served on a prediction yet


@pytest.mark.parametrize(
    ("by", "said"),
    [("every usable CPU", "every usable CPU (no --cpus given, no coordinator)"), ("--cpus", "as --cpus gives"),
     ("coordinator: traffic moved", "assigned by coordinator: traffic moved")],
)  # fmt: skip
def test_who_gave_the_cpus_reads_as_a_sentence(by: str, said: str) -> None:
    share = {"cpus": "0-1", "cores": 2, "assigned_by": by}
    assert f"  share: CPUs 0-1 (2 cores), {said}\n" in render(status(share=share))


def test_a_choice_made_again_says_why_the_kept_one_was_not_served() -> None:
    candidates = [{"candidate": c, "verdict": v, "predicted_ms": None, "why": "w"}
                  for c, v in (("onnxruntime", "served"), ("torch", "slower"))]  # fmt: skip
    choice = {"served": "onnxruntime", "decided_at_this_start": True, "decided_age_s": 0.0, "candidates": candidates,
              "kept_choice_not_reused": "the kept choice was made for other settings (max_batch 4 → 2)"}  # fmt: skip
    lines = render(status(runtime_choice=choice)).splitlines()
    at = lines.index("runtime choice (at this start): serving onnxruntime")
    assert (
        lines[at + 1]
        == "  every candidate measured again: the kept choice was made for other settings (max_batch 4 → 2)"
    )
