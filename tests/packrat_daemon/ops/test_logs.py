"""The daemon's log: `--log-format text|json`, and the request log at debug level."""

from __future__ import annotations

import io
import json
import logging
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from packrat_daemon.ops.logs import JsonFormatter, log_request, requests_log, setup_logging
from packrat_daemon.wire.client import Client
from packrat_daemon.wire.errors import ConfigError
from tests.helpers.daemons import running_daemon
from tests.packrat_daemon.ops.test_metrics import completed_batch

TEXT_LINE = re.compile(r"packrat\[\d+\] (DEBUG|INFO|WARNING|ERROR) packrat\.")


@pytest.fixture
def root_logger() -> Iterator[logging.Logger]:
    """The root logger, put back as it was (pytest's own capture handlers included) after the test."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield root
    root.handlers[:] = handlers
    root.setLevel(level)


def test_json_records_carry_the_fields_and_the_traceback() -> None:
    try:
        raise ValueError("boom")
    except ValueError:
        exc_info = sys.exc_info()
    record = logging.LogRecord("packrat.daemon", logging.ERROR, __file__, 1, "worker %d failed", (3,), exc_info)
    record.fields = {"worker": 3}
    entry = json.loads(JsonFormatter().format(record))
    assert entry["message"] == "worker 3 failed" and entry["level"] == "error" and entry["logger"] == "packrat.daemon"
    assert entry["worker"] == 3 and "ValueError: boom" in entry["traceback"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", entry["time"])


def test_setup_logging_replaces_the_handlers_and_sets_the_level(
    root_logger: logging.Logger, monkeypatch: pytest.MonkeyPatch
) -> None:
    stream = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stream)
    setup_logging("info", "json")
    setup_logging("debug", "json")  # a second call must not print every line twice
    logging.getLogger("packrat.test").debug("hello %s", "there")
    lines = stream.getvalue().splitlines()
    assert len(lines) == 1 and json.loads(lines[0])["message"] == "hello there"
    setup_logging("warning", "text")
    logging.getLogger("packrat.test").info("not shown")
    logging.getLogger("packrat.test").warning("shown")
    assert TEXT_LINE.search(stream.getvalue().splitlines()[-1]) and "not shown" not in stream.getvalue()
    with pytest.raises(ConfigError, match="text, json"):
        setup_logging("info", "xml")


def test_the_request_log_names_the_request_its_times_and_workers(caplog: pytest.LogCaptureFixture) -> None:
    first, second = completed_batch([2, 1], [3, 1], [4.0, 6.0], [5.0, 5.5])
    with caplog.at_level(logging.INFO, logger=requests_log.name):
        log_request(first, 8.0)
    assert not caplog.records  # off at info level
    with caplog.at_level(logging.DEBUG, logger=requests_log.name):
        log_request(first, 8.0)
    (record,) = caplog.records
    fields = record.fields
    assert fields["request_id"] == "r0" and fields["samples"] == 3 and fields["total_ms"] == 8.0
    assert (fields["queue_ms"], fields["compute_ms"], fields["predicted_ms"]) == (0.5, 6.0, 5.5)
    assert [(w["worker"], w["threads"], w["rows"]) for w in fields["workers"]] == [(1, 2, 3), (2, 1, 1)]
    assert "request 'r0': 3 sample(s), queue 0.50 ms, compute 6.00 ms (predicted 5.50 ms)" in record.getMessage()


@pytest.mark.slow
def test_a_debug_daemon_logs_every_request_as_json(tmp_path: Path) -> None:
    profile = tmp_path / "profile.csv"
    profile.write_text("threads,batch,latency_ms\n1,1,0.2\n1,2,0.3\n")
    args = ["--model", "builtin:tiny-mlp", "--policy", "fixed", "--plan", "2*1x2", "--max-batch", "4"]
    args += ["--profile", str(profile), "--log-level", "debug", "--log-format", "json"]
    with running_daemon(tmp_path, *args) as (endpoint, process), Client(endpoint, timeout=30) as client:
        for samples in (1, 2, 3):
            client.infer(np.ones((samples, 16), dtype=np.float32))
        pid = process.pid
    lines = (tmp_path / "daemon.log").read_text().splitlines()
    assert not [line for line in lines if TEXT_LINE.search(line)]  # no daemon line left in the text format
    entries = [json.loads(line) for line in lines if line.startswith("{")]
    assert all(entry["pid"] == pid for entry in entries)
    served = [e for e in entries if e["logger"] == "packrat.requests"]
    assert [e["samples"] for e in served] == [1, 2, 3] and all(e["level"] == "debug" for e in served)
    assert all(e["compute_ms"] > 0 and e["queue_ms"] >= 0 and e["total_ms"] >= e["compute_ms"] for e in served)
    assert [len(e["workers"]) for e in served] == [1, 2, 2]  # one input on one worker, more split over both
    assert all(e["predicted_ms"] is not None for e in served)
    assert any(e["logger"] == "packrat.daemon" and e["message"].startswith("serving on") for e in entries)
