"""`packrat load` against a real daemon (tiny model): each arrival process, the JSON's fields, every request
accounted for, the rate reached at low load; and its refusals, which need no daemon."""

from __future__ import annotations

import importlib.util
import json
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from packrat_daemon.cli import main
from packrat_daemon.commands import load as load_command
from packrat_daemon.load.arrivals import BatchMix, Poisson, Trace, open_loop_schedule
from tests.helpers.daemons import REPO, running_daemon

FIXED_KEYS = ["sent", "ok", "errors", "throughput_rps", "latency_ms"]
MAX_QUEUE = 64


@pytest.fixture(scope="module")
def endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    args = ["--model", "builtin:tiny-mlp", "--policy", "single", "--max-batch", "32", "--max-queue", str(MAX_QUEUE)]
    with running_daemon(tmp_path_factory.mktemp("load"), *args) as (address, _):
        yield address


def load(capsys: pytest.CaptureFixture[str], *args: str, none_answered: bool = False) -> dict[str, Any]:
    """The JSON report of a run; its exit status 0, or where `none_answered` may be, 1 exactly when no request was
    answered."""
    status = main(["load", "--json", "--quiet", *args])
    captured = capsys.readouterr()
    report = json.loads(captured.out) if status in (0, 1) else {}
    assert status == (1 if none_answered and report["ok"] == 0 else 0), captured.err
    return report


def check_fixed_fields(report: dict[str, Any]) -> None:
    assert list(report)[:5] == FIXED_KEYS
    assert isinstance(report["sent"], int) and isinstance(report["ok"], int)
    assert all(isinstance(code, str) and isinstance(n, int) for code, n in report["errors"].items())
    assert set(report["latency_ms"]) == {"p50", "p90", "p99", "p999"}
    if report["ok"]:
        p = report["latency_ms"]
        assert 0 < p["p50"] <= p["p90"] <= p["p99"] <= p["p999"]
    assert report["sent"] == report["ok"] + sum(report["errors"].values())


@pytest.mark.slow
def test_poisson_at_low_load_reaches_its_rate_and_every_request_is_answered(endpoint, capsys):
    # 30 req/s for 4 s (still low for the tiny model): a Poisson count would stray by 1/sqrt(120), about 9%; the
    # fixed count sends exactly 120.
    rate, duration = 30.0, 4.0
    report = load(capsys, "--endpoint", endpoint, "--rate", f"{rate:g}", "--duration", f"{duration:g}")
    check_fixed_fields(report)
    assert report["sent"] == report["ok"] == round(rate * duration) and report["errors"] == {}
    assert report["sent_rps"] == pytest.approx(rate, rel=0.05)
    assert report["throughput_rps"] == pytest.approx(rate, rel=0.05)
    # A drawn count is the Poisson process's own draw (seed 0): known in advance, and all of it is sent.
    drawn = load(capsys, "--endpoint", endpoint, "--rate", "50", "--duration", "2", "--poisson-count", "drawn")
    schedule = open_loop_schedule(Poisson(50.0, False), BatchMix.single(1), duration_s=2.0, rng=random.Random(0))
    assert drawn["sent"] == drawn["ok"] == len(schedule) != 100
    assert report["mode"] == "open" and report["server"]["model"] == "builtin:tiny-mlp"
    assert report["emulated"] is False


@pytest.mark.slow
def test_closed_loop_with_a_batch_mix(endpoint, capsys):
    report = load(
        capsys, "--endpoint", endpoint, "--concurrency", "3", "--requests", "150", "--batches", "1:1,8:1,32:1"
    )
    check_fixed_fields(report)
    assert report["sent"] == report["ok"] == 150 and report["concurrency"] == 3
    assert 1 < report["samples_per_s"] / report["throughput_rps"] < 32  # a mix of sizes went out


@pytest.mark.slow
def test_bursts_offer_their_mean_rate(endpoint, capsys):
    report = load(capsys, "--endpoint", endpoint, "--burst", "0.5:0.5:160", "--duration", "4", "--batch", "2")
    check_fixed_fields(report)
    assert report["rate_rps"] == pytest.approx(80.0)
    assert report["sent"] / 4.0 == pytest.approx(80.0, rel=0.25)  # 320 expected; a Poisson draw of that mean
    # A burst of 160 two-sample requests a second may fill the 64-input queue of a daemon starved of CPU
    # (the suite runs beside other work): the only error allowed is the daemon saying so.
    assert report["ok"] > 0 and set(report["errors"]) <= {"OVERLOADED"}


@pytest.mark.slow
def test_a_trace_is_replayed_as_recorded(endpoint, capsys, tmp_path: Path):
    rows = [(i * 0.05, 1 + i % 4) for i in range(20)]
    trace = tmp_path / "trace.csv"
    trace.write_text("t_s,samples\n" + "".join(f"{t},{s}\n" for t, s in rows))
    saved = tmp_path / "sent.csv"
    report = load(capsys, "--endpoint", endpoint, "--trace", str(trace), "--warmup", "0", "--save-trace", str(saved))
    check_fixed_fields(report)
    assert report["sent"] == report["ok"] == 20
    assert "samples as recorded" in report["traffic"]
    # The requests as they left, in the format --trace reads: the same sizes, each at or just after its time.
    sent = Trace.read(saved).rows
    assert [samples for _, samples in sent] == [samples for _, samples in rows]
    assert all(0.0 <= left - t < 0.05 for (left, _), (t, _) in zip(sent, rows, strict=True))


@pytest.mark.slow
def test_overload_and_client_timeouts_are_counted_by_code(endpoint, capsys):
    # 8 clients of 32 samples against a queue of 64 inputs: some requests find it full.
    report = load(capsys, "--endpoint", endpoint, "--concurrency", "8", "--batch", "32", "--requests", "200")
    check_fixed_fields(report)
    assert report["errors"].get("OVERLOADED", 0) > 0
    report = load(capsys, "--endpoint", endpoint, "--concurrency", "2", "--requests", "20", "--timeout", "0.0002",
                  "--warmup", "0", none_answered=True)  # fmt: skip
    check_fixed_fields(report)
    assert report["errors"].get("CLIENT_TIMEOUT", 0) + report["errors"].get("TIMEOUT", 0) > 0


@pytest.mark.slow
def test_a_sweep_gives_one_report_per_rate_and_its_plot(endpoint, capsys, tmp_path: Path):
    plot = tmp_path / "curve.png"
    has_matplotlib = importlib.util.find_spec("matplotlib") is not None
    extra = ["--plot", str(plot)] if has_matplotlib else []
    result = load(capsys, "--endpoint", endpoint, "--sweep", "20,60", "--duration", "2", *extra)
    assert [r["rate_rps"] for r in result["sweep"]] == [20.0, 60.0]
    for report in result["sweep"]:
        check_fixed_fields(report)
    if has_matplotlib:
        assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_the_progress_line_goes_to_stderr_and_the_table_to_stdout(endpoint, capsys):
    assert main(["load", "--endpoint", endpoint, "--rate", "50", "--duration", "2.5", "--warmup", "0"]) == 0
    captured = capsys.readouterr()
    assert "load [" in captured.err and "sent " in captured.err
    assert "latency ms" in captured.out and "p999" in captured.out and "load [" not in captured.out


@pytest.mark.slow
def test_ctrl_c_ends_the_run_with_a_report_that_adds_up(endpoint):
    command = [sys.executable, "-m", "packrat_daemon", "load", "--endpoint", endpoint, "--rate", "50",
               "--duration", "60", "--json", "--quiet"]  # fmt: skip
    # A shell that runs the tests in the background starts them with SIGINT ignored, and children inherit
    # that: give `packrat load` the default disposition, as an interactive terminal would.
    process = subprocess.Popen(
        command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=_default_sigint
    )
    time.sleep(4.0)  # start, warm-up (1 s), then a few seconds of traffic
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=30)
    assert process.returncode == 130, err
    report = json.loads(out)
    check_fixed_fields(report)
    assert report["interrupted"] is True and report["sent"] > 20


@pytest.mark.slow
def test_a_run_against_an_emulating_daemon_is_labelled(capsys, tmp_path: Path):
    profile = REPO / "bench" / "profiles" / "inception3-cloudlab16.csv"
    args = ["--model", "builtin:tiny-mlp", "--runtime", "emulated", "--emulate-cores", "16", "--emulate-interference",
            "none", "--profile", str(profile), "--policy", "single", "--max-batch", "4"]  # fmt: skip
    with running_daemon(tmp_path, *args) as (address, _):
        report = load(capsys, "--endpoint", address, "--concurrency", "1", "--requests", "3", "--warmup", "0")
        check_fixed_fields(report)
        assert report["emulated"] is True and report["server"]["emulation"]["cores"] == 16
        assert main(["load", "--endpoint", address, "--requests", "1", "--warmup", "0", "--quiet"]) == 0
        assert "EMULATED" in capsys.readouterr().out


@pytest.mark.slow
def test_requests_larger_than_max_batch_are_refused_before_sending(endpoint, capsys):
    assert main(["load", "--endpoint", endpoint, "--batch", "64", "--requests", "1", "--quiet"]) == 2
    assert "more than the daemon's max_batch 32" in capsys.readouterr().err


def test_a_remote_endpoint_is_warned_about(capsys, monkeypatch: pytest.MonkeyPatch):
    # A documentation-range address: nothing answers, so the run ends with the client's timeout error.
    monkeypatch.setattr(load_command, "INFO_TIMEOUT_S", 0.2)
    assert main(["load", "--endpoint", "tcp://192.0.2.1:5555", "--requests", "1", "--quiet"]) == 2
    assert "is not on this machine" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (["--plot", "x.png"], "--plot draws a --sweep"),
        (["--sweep", "1,2", "--rate", "3"], "--sweep gives the rates"),
        (["--sweep", "1,2", "--concurrency", "3"], "--sweep gives the rates"),
        (["--key", "client.key_secret"], "CURVE needs both"),
        (["--sweep", "1,2", "--save-trace", "t.csv"], "--save-trace writes one run's requests"),
        (["--save-trace", "/nonexistent/t.csv"], "its folder does not exist"),
    ],
)
def test_contradictory_options_are_refused(capsys, args: list[str], match: str):
    assert main(["load", "--endpoint", "ipc:///nonexistent/x.ipc", *args]) == 2
    assert match in capsys.readouterr().err


def test_a_trace_refuses_other_sizes(capsys, tmp_path: Path):
    trace = tmp_path / "trace.csv"
    trace.write_text("t_s,samples\n0,2\n")
    assert main(["load", "--endpoint", "ipc:///nonexistent/x.ipc", "--trace", str(trace), "--batch", "4"]) == 2
    assert "a trace carries its own sizes" in capsys.readouterr().err


def test_a_missing_matplotlib_is_named_before_any_traffic(capsys, monkeypatch: pytest.MonkeyPatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else real(name, *a))
    assert main(["load", "--endpoint", "ipc:///nonexistent/x.ipc", "--sweep", "1,2", "--plot", "x.png"]) == 2
    err = capsys.readouterr().err
    assert "needs matplotlib" in err and "[plot]" in err


@pytest.mark.parametrize("args", [["--batches", "1:0.5,1:0.5"], ["--burst", "1:2"], ["--rate", "-3"]])
def test_malformed_values_are_usage_errors(capsys, args: list[str]):
    with pytest.raises(SystemExit) as exit_info:
        main(["load", *args])
    assert exit_info.value.code == 2
    assert "packrat load: error: argument" in capsys.readouterr().err


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)
