"""The load report: the JSON's fixed keys, percentiles of answered requests only, and the tables."""

from __future__ import annotations

import json

import numpy as np
import pytest

from packrat_daemon.load.report import Tally, format_report, format_sweep, summarize


def tally_of(latencies_ms: list[float], errors: dict[str, int], window_s: float) -> Tally:
    tally = Tally(started=100.0)
    for latency in latencies_ms:
        tally.sent += 1
        tally.answered(latency / 1000.0, 2, 100.0 + window_s)
    for code, count in errors.items():
        for _ in range(count):
            tally.sent += 1
            tally.failed(code, 100.0 + window_s / 2)
    tally.send_window_s = window_s
    return tally


def test_the_json_has_exactly_the_fixed_keys_and_values():
    latencies = [float(x) for x in range(1, 1001)]  # 1 … 1000 ms
    report = summarize(tally_of(latencies, {"OVERLOADED": 3, "CLIENT_TIMEOUT": 1}, window_s=10.0), traffic="t")
    assert list(report)[:5] == ["sent", "ok", "errors", "throughput_rps", "latency_ms"]
    assert report["sent"] == 1004 and report["ok"] == 1000
    assert report["errors"] == {"CLIENT_TIMEOUT": 1, "OVERLOADED": 3}
    assert report["sent"] == report["ok"] + sum(report["errors"].values())
    assert report["throughput_rps"] == pytest.approx(100.0)
    assert set(report["latency_ms"]) == {"p50", "p90", "p99", "p999"}
    for name, q in (("p50", 50), ("p90", 90), ("p99", 99), ("p999", 99.9)):
        assert report["latency_ms"][name] == pytest.approx(float(np.percentile(latencies, q)), abs=1e-3)
    assert report["samples_per_s"] == pytest.approx(200.0)
    assert report["traffic"] == "t"
    json.dumps(report, allow_nan=False)  # plain JSON, no NaN


def test_requests_of_several_sizes_get_their_own_percentiles_and_one_size_none():
    tally = Tally(started=0.0)
    for k in range(100):  # single inputs at 10–19.9 ms, sixteen at 200–209.9 ms: two modes
        tally.answered((10.0 + k / 10.0) / 1000.0, 1, 1.0)
        tally.answered((200.0 + k / 10.0) / 1000.0, 16, 1.0)
    tally.sent = tally.ok
    by_size = summarize(tally)["latency_ms_by_samples"]
    assert list(by_size) == ["1", "16"]
    assert by_size["1"]["ok"] == by_size["16"]["ok"] == 100
    assert by_size["1"]["p50"] == pytest.approx(14.95) and by_size["16"]["p50"] == pytest.approx(204.95)
    assert set(by_size["16"]) == {"ok", "p50", "p90", "p99", "p999"}
    assert "latency_ms_by_samples" not in summarize(tally_of([5.0, 6.0], {}, window_s=1.0))


def test_errors_are_not_timed_and_no_answer_gives_null_latencies():
    report = summarize(tally_of([], {"INTERNAL": 2}, window_s=1.0))
    assert report["ok"] == 0 and report["throughput_rps"] == 0.0
    assert report["latency_ms"] == {"p50": None, "p90": None, "p99": None, "p999": None}
    assert "-" in format_report(report)  # the table shows a dash, not a number, for what was not measured


def test_the_throughput_window_runs_to_the_last_reply_past_the_sending():
    tally = tally_of([1.0] * 10, {}, window_s=2.0)
    tally.send_window_s = 1.0  # sending took 1 s, the last reply came at 2 s
    report = summarize(tally)
    assert report["sent_rps"] == pytest.approx(10.0)
    assert report["throughput_rps"] == pytest.approx(5.0)


def test_the_tables_show_each_figure():
    report = summarize(tally_of([2.0, 4.0], {"TIMEOUT": 1}, window_s=1.0), traffic="poisson 3/s, samples 2")
    text = format_report(report)
    assert "poisson 3/s" in text and "TIMEOUT 1" in text and "p999" in text
    sweep = format_sweep([{**report, "rate_rps": 3.0}])
    assert sweep.splitlines()[1].split()[:4] == ["3", "3", "2", "1"]


def test_a_run_against_an_emulating_daemon_says_so():
    server = {"model": "builtin:resnet50", "runtime": "emulated", "emulation": {"note": "EMULATING 16 cores"}}
    report = summarize(tally_of([1.0], {}, window_s=1.0), emulated=True, server=server)
    text = format_report(report)
    assert "EMULATED" in text and "EMULATING 16 cores" in text
    plain = format_report(summarize(tally_of([1.0], {}, window_s=1.0), emulated=False, server={"model": "m"}))
    assert "EMULATED" not in plain


def test_each_error_code_keeps_the_first_message_it_came_with_and_the_table_shows_it():
    tally = Tally(started=0.0)
    for k in range(3):
        tally.sent += 1
        tally.failed("BAD_REQUEST", 1.0, f"input 'b' is missing ({k})")
    tally.sent += 1
    tally.failed("UNFINISHED", 1.0)  # the client's own codes come without one
    report = summarize(tally)
    assert report["errors"] == {"BAD_REQUEST": 3, "UNFINISHED": 1}
    assert report["error_messages"] == {"BAD_REQUEST": "input 'b' is missing (0)"}
    lines = format_report(report).splitlines()
    errors = next(k for k, line in enumerate(lines) if line.startswith("errors"))
    assert "BAD_REQUEST" in lines[errors + 1] and "input 'b' is missing (0)" in lines[errors + 1]
    assert "error_messages" not in summarize(tally_of([1.0], {}, window_s=1.0))


def test_a_run_of_lengths_reports_its_tokens_and_each_class_of_lengths_its_percentiles():
    tally = Tally(started=0.0)
    for length, latency_ms in ((5, 1.0), (15, 3.0), (8, 2.0), (100, 9.0)):
        tally.sent += 1
        tally.answered(latency_ms / 1000.0, 2, 4.0, length)
    tally.send_window_s = 4.0
    report = summarize(tally, lengths="uniform:5..100", padded_to=128)
    assert report["tokens_per_s"] == pytest.approx(2 * (5 + 15 + 8 + 100) / 4.0)
    assert "uniform:5..100, padded to 128, 64.00 tokens/s" in format_report(report)
    by_length = report["latency_ms_by_length"]
    assert list(by_length) == ["1-8", "9-16", "65-128"]
    assert by_length["1-8"]["ok"] == 2 and by_length["1-8"]["p50"] == pytest.approx(1.5)
    assert by_length["65-128"] == {"ok": 1, "p50": 9.0, "p90": 9.0, "p99": 9.0, "p999": 9.0}
    plain = summarize(tally_of([1.0], {}, window_s=1.0))
    assert "tokens_per_s" not in plain and "latency_ms_by_length" not in plain
