"""`packrat simulate`: its JSON (packrat load's fields, labelled a simulation), its table, its refusals."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from packrat_daemon.cli import main

TABLE = "threads,batch,latency_ms\n" + "".join(
    f"{t},{b},{4.0 + 3.0 * b * (0.08 + 0.92 / t):.4f}\n" for t in range(1, 9) for b in (1, 2, 4, 8, 16)
)


@pytest.fixture
def profile(tmp_path: Path) -> str:
    path = tmp_path / "profile.csv"
    path.write_text(TABLE)
    return str(path)


def test_json_has_the_load_reports_fields_and_the_plan_changes(profile: str, capsys: pytest.CaptureFixture[str]):
    args = ["simulate", "--profile", profile, "--emulate-cores", "8", "--rate", "100", "--batches", "1:0.5,4:0.5"]
    assert main([*args, "--duration", "20", "--seed", "5", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert set(report) >= {"sent", "ok", "errors", "throughput_rps", "latency_ms", "plan_changes", "simulated"}
    assert set(report["latency_ms"]) == {"p50", "p90", "p99", "p999"}
    assert report["simulated"] is True and report["inputs"]["cores"] == 8
    assert report["sent"] == report["ok"] + sum(report["errors"].values())
    assert report["plan_changes"][0]["reason"] == "start"
    assert main([*args, "--duration", "20", "--seed", "5", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == report


def test_the_table_says_it_is_a_simulation(profile: str, capsys: pytest.CaptureFixture[str]):
    assert main(["simulate", "--profile", profile, "--concurrency", "2", "--batch", "4", "--requests", "40"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("SIMULATION") and "plan changes:" in out
    assert re.search(r"^sent\s+40 ", out, re.M) and re.search(r"^ok\s+40$", out, re.M)


def test_requests_larger_than_max_batch_are_refused(profile: str, capsys: pytest.CaptureFixture[str]):
    args = ["simulate", "--profile", profile, "--concurrency", "1", "--batch", "32", "--requests", "5"]
    assert main([*args, "--max-batch", "16"]) == 2
    assert "exceed max_batch 16" in capsys.readouterr().err


def _split_gain(profile: str, interference: str, capsys: pytest.CaptureFixture[str], *extra: str) -> float:
    """p50 of one all-core instance over p50 of the packrat plan, one client at batch 8."""
    p50 = {}
    for policy in ("single", "packrat"):
        args = ["simulate", "--profile", profile, "--concurrency", "1", "--batch", "8", "--requests", "20"]
        assert main([*args, "--policy", policy, "--plan-batches", "8", "--max-batch", "8",
                     "--max-delay-ms", "0", "--emulate-interference", interference, *extra, "--json"]) == 0  # fmt: skip
        report = json.loads(capsys.readouterr().out)
        p50[policy] = report["latency_ms"]["p50"]
    return p50["single"] / p50["packrat"]


def test_the_split_gain_shrinks_as_the_interference_grows(profile: str, capsys: pytest.CaptureFixture[str]):
    # The all-core instance waits its profiled latency whatever the interference; the instances of a
    # split slow each other down, so their gain over it shrinks from none to the default to F = 1.4.
    gains = [_split_gain(profile, text, capsys) for text in ("none", "default", "1.4")]
    assert gains[0] > gains[1] > gains[2]


def test_auto_takes_the_models_estimate(
    profile: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
):
    from packrat_daemon.measure import interference

    args = ["simulate", "--profile", profile, "--concurrency", "1", "--requests", "5", "--emulate-interference", "auto"]
    assert main(args) == 2
    assert "name the model with --model" in capsys.readouterr().err
    measured = interference.Estimate(
        "builtin:bert-base", (0, 1), {1: (1.4,)}, {1: (1.4,)}, on_cpu=1.0, machine="cpu", load=0.0
    )
    monkeypatch.setattr(interference, "estimate", lambda model, input_override=None: measured)
    assert main([*args, "--model", "builtin:bert-base", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["inputs"]["interference"].startswith("auto: ×1.400")
