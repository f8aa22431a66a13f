"""`packrat status`: its parser, and the human view of a status reply (the live daemon's is test_server's)."""

from __future__ import annotations

import argparse
from typing import Any

from packrat_daemon.commands import status

REPLY: dict[str, Any] = {
    "model": "builtin:tiny-mlp",
    "runtime": "torch",
    "precision": "fp32",
    "max_batch": 8,
    "generation": 3,
    "plan": {
        "policy": "packrat",
        "instances": [{"threads": 2}, {"threads": 1}],
        "alternatives": [[{"threads": 3}]],
        "split": "even",
        "predicted_latency_ms": 12.345,
        "reason": "start-up",
    },
    "planning": {"policy": "packrat", "adapting": True},
    "workers": [
        {"id": 0, "pid": 101, "runtime": "torch", "threads": 2, "cores": [0, 1], "state": "ready", "batches_served": 7},
        {
            "id": 1,
            "pid": 102,
            "runtime": "torch",
            "threads": 1,
            "cores": [2],
            "state": "ready",
            "serving": False,
            "batches_served": 0,
        },
    ],  # fmt: skip
    "traffic": {"half_life_s": 30.0, "inputs_per_s": 12.5, "batches_per_s": 3.0, "batch_sizes": [[4, 0.75], [1, 0.25]]},
    "queue": {"requests": 1, "inputs": 4, "max_inputs": 64, "batch_in_flight": True, "accepting": False},
    "profile": {"measured_offline": 6, "estimated": 2, "learned_in_production": 1, "offline_age_s": 90.0},
    "history": [
        {
            "time": 0.0,
            "reason": "start-up",
            "from": None,
            "to": "2+1",
            "predicted_gain": None,
            "first_serving_s": 0.25,
            "serving_s": 0.5,
            "retired_s": None,
            "superseded": False,
        },
        {
            "time": 3600.0,
            "reason": "adapt",
            "from": "2+1",
            "to": "3",
            "predicted_gain": 0.125,
            "first_serving_s": None,
            "serving_s": None,
            "retired_s": None,
            "superseded": True,
        },
    ],  # fmt: skip
}


def test_the_parser_says_its_summary_again_before_the_details() -> None:
    parser = argparse.ArgumentParser()
    subparsers = parser.add_subparsers()
    status.add_parser(subparsers)
    command = subparsers.choices["status"]
    assert command.description.startswith("Show a running daemon's plan, workers, traffic, queue, profile and plan")
    assert command.description.endswith("docs/status.md.")
    args = parser.parse_args(["status", "--json"])
    assert args.json and args.timeout == 5.0 and args.run is status.run


def test_render_shows_the_plan_the_workers_the_traffic_and_the_history() -> None:
    text = status.render(REPLY)
    assert text.startswith("model builtin:tiny-mlp on torch (fp32), max batch 8")
    assert "threads per instance 2 + 1 | 3, split even, predicted 12.3 ms" in text
    assert "planning: policy packrat, adapting yes" in text
    assert "ready (not serving)" in text and "0,1" in text
    assert "batch sizes 4: 75%, 1: 25%" in text
    assert "batch in flight: yes, not accepting (draining)" in text
    assert "6 cell(s) measured offline 90 s ago, 2 estimated" in text
    assert "1970-01-01 01:00:00  adapt" in text and "+12.5%" in text and "superseded" in text
    assert "250 ms" in text and "EMULATED" not in text
    assert "EMULATED" in status.render({**REPLY, "emulation": {"label": "x"}})
