"""The daemon's log: its format (`--log-format text|json`) and the request log at debug level.

Text is for people reading a terminal or the journal; JSON is one object per line for log shippers
(Loki, Elasticsearch, Vector), which would otherwise have to parse free text. A record's structured
fields (`extra={"fields": {...}}`) become keys of the JSON object, so the request log can be queried
by worker or queue wait without a regular expression.
"""

from __future__ import annotations

import json
import logging
import time
from typing import TYPE_CHECKING, Any

from packrat_daemon.ops.tallies import batch_predicted_ms
from packrat_daemon.wire.errors import ConfigError

if TYPE_CHECKING:
    from packrat_daemon.ops.records import Answer

LOG_FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s packrat[%(process)d] %(levelname)s %(name)s: %(message)s"

# Its own logger, so `packrat.requests` can be filtered (or raised to info) apart from the daemon's lines.
requests_log = logging.getLogger("packrat.requests")


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time (UTC, ISO 8601 with milliseconds), level, logger, pid, message,
    the record's structured fields, and the traceback as text when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "pid": record.process,
            "message": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            entry.update(fields)
        if record.exc_info:
            entry["traceback"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def setup_logging(level: str, log_format: str = "text") -> None:
    """Configure the root logger for the daemon's process: `level` (debug, info, …) and `log_format`."""
    if log_format not in LOG_FORMATS:
        raise ConfigError(f"log format {log_format!r} is not one of {', '.join(LOG_FORMATS)}")
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    for old in list(root.handlers):  # a reload or a second call must not print every line twice
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(getattr(logging, level.upper()))


def log_request(done: Answer, total_ms: float) -> None:
    """One answered request at debug level: id, samples, queue wait, compute (and the profile's
    prediction), total, and the workers that ran its batch with their threads and rows."""
    if not requests_log.isEnabledFor(logging.DEBUG):  # the request path pays one check when it is off
        return
    request = done.request
    workers = [
        {"worker": job.worker.id, "pid": job.worker.pid, "threads": job.worker.threads, "rows": job.rows}
        for job in done.jobs
    ]
    predicted = batch_predicted_ms(done)
    fields = {
        "request_id": request.request_id,
        "samples": request.samples,
        "queue_ms": round(done.queue_ms, 3),
        "compute_ms": round(done.compute_ms, 3),
        "predicted_ms": None if predicted is None else round(predicted, 3),
        "total_ms": round(total_ms, 3),
        "workers": workers,
    }
    ran_on = " + ".join(f"worker {w['worker']} ({w['threads']}t, {w['rows']} rows)" for w in workers)
    prediction = "" if predicted is None else f" (predicted {predicted:.2f} ms)"
    requests_log.debug(
        "request %r: %d sample(s), queue %.2f ms, compute %.2f ms%s, total %.2f ms, on %s",
        request.request_id, request.samples, done.queue_ms, done.compute_ms, prediction, total_ms, ran_on or "-",
        extra={"fields": fields},
    )  # fmt: skip
