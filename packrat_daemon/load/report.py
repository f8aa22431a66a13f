"""What a load run counts (`Tally`) and how it is reported: a dict for `--json` and a table for people.

The JSON always holds `sent`, `ok`, `errors` (by code), `throughput_rps` and `latency_ms` with exactly
`p50`, `p90`, `p99` and `p999`; everything else sits beside them. Latencies are of answered requests
only, from just before the client sends to the reply; an error is counted under its code, never timed.
With requests of several sizes, `latency_ms_by_samples` gives each size's own count and percentiles: the
sizes' latencies form separate modes, and a median over all of them can fall on a gap between two.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np

PERCENTILES = {"p50": 50.0, "p90": 90.0, "p99": 99.0, "p999": 99.9}

# Codes for what the client, not the server, saw go wrong; the server's own codes are the protocol's.
CLIENT_TIMEOUT = "CLIENT_TIMEOUT"
CLIENT_CLOSED = "CLIENT_CLOSED"
UNFINISHED = "UNFINISHED"  # still in flight when the run's time bound passed; cancelled


@dataclass
class Tally:
    """One run's counts. Times are `time.perf_counter()` seconds; `started` is the run's time zero."""

    started: float
    sent: int = 0
    ok: int = 0
    samples_ok: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    messages: dict[str, str] = field(default_factory=dict)  # the first message each error code came with
    tokens_ok: int = 0  # the answered requests' tokens (samples × length), when lengths were sent
    latencies_s: list[float] = field(default_factory=list)
    samples_answered: list[int] = field(default_factory=list)  # each answered request's size, as latencies_s
    lengths_answered: list[int] = field(default_factory=list)  # each answered request's length, when sent
    lags_s: list[float] = field(default_factory=list)  # how late each open-loop request left its schedule
    sends: list[tuple[float, int]] = field(default_factory=list)  # each request as it left: (s after started, samples)
    send_window_s: float = 0.0  # from the start to the end of the sending (at least the asked duration)
    last_done: float = 0.0
    interrupted: bool = False  # cancelled before the end (Ctrl-C); what it counted still adds up
    started_unix_s: float | None = None  # the wall clock at `started`, to line a run up with a server's log

    @property
    def in_flight(self) -> int:
        return self.sent - self.ok - sum(self.errors.values())

    def answered(self, latency_s: float, samples: int, now: float, length: int | None = None) -> None:
        self.ok += 1
        self.samples_ok += samples
        if length is not None:
            self.tokens_ok += samples * length
            self.lengths_answered.append(length)
        self.latencies_s.append(latency_s)
        self.samples_answered.append(samples)
        self.last_done = max(self.last_done, now)

    def failed(self, code: str, now: float, message: str | None = None) -> None:
        self.errors[code] += 1
        if message is not None:
            self.messages.setdefault(code, message)
        self.last_done = max(self.last_done, now)


def _ms(seconds: float) -> float:
    return round(seconds * 1000.0, 3)


def _percentiles_ms(latencies: np.ndarray) -> dict[str, float | None]:
    if not latencies.size:
        return dict.fromkeys(PERCENTILES)
    points = np.percentile(latencies, list(PERCENTILES.values()))
    return {name: _ms(value) for name, value in zip(PERCENTILES, points.tolist(), strict=True)}


def summarize(tally: Tally, **extra: Any) -> dict[str, Any]:
    """The report of one run: the fixed keys, then what the run adds (`extra`), then derived figures."""
    window_s = max(tally.last_done - tally.started, tally.send_window_s)
    latencies = np.asarray(tally.latencies_s, dtype=np.float64)
    latency_ms = _percentiles_ms(latencies)
    report: dict[str, Any] = {
        "sent": tally.sent,
        "ok": tally.ok,
        "errors": dict(sorted(tally.errors.items())),
        "throughput_rps": round(tally.ok / window_s, 3) if window_s > 0 else None,
        "latency_ms": latency_ms,
    }
    if tally.messages:
        report["error_messages"] = dict(sorted(tally.messages.items()))
    if tally.interrupted:
        report["interrupted"] = True
    if tally.started_unix_s is not None:
        report["started_unix_s"] = round(tally.started_unix_s, 3)
    report.update(extra)
    report["sent_rps"] = round(tally.sent / tally.send_window_s, 3) if tally.send_window_s > 0 else None
    report["samples_per_s"] = round(tally.samples_ok / window_s, 3) if window_s > 0 else None
    if tally.tokens_ok:
        report["tokens_per_s"] = round(tally.tokens_ok / window_s, 3) if window_s > 0 else None
    report["window_s"] = round(window_s, 3)
    report["latency_mean_ms"] = _ms(float(latencies.mean())) if latencies.size else None
    report["latency_max_ms"] = _ms(float(latencies.max())) if latencies.size else None
    sizes = np.asarray(tally.samples_answered, dtype=np.int64)
    distinct = np.unique(sizes).tolist()
    if len(distinct) > 1:
        report["latency_ms_by_samples"] = {
            str(size): {"ok": int((sizes == size).sum()), **_percentiles_ms(latencies[sizes == size])}
            for size in distinct
        }
    if tally.lengths_answered and len(tally.lengths_answered) == latencies.size:
        report["latency_ms_by_length"] = _by_length(latencies, np.asarray(tally.lengths_answered, dtype=np.int64))
    if tally.lags_s:
        lag_p50, lag_p99 = np.percentile(tally.lags_s, [50.0, 99.0]).tolist()
        report["send_lag_p50_ms"] = _ms(lag_p50)
        report["send_lag_p99_ms"] = _ms(lag_p99)
    return report


def _by_length(latencies: np.ndarray, lengths: np.ndarray) -> dict[str, dict[str, Any]]:
    """Per class of lengths (1-8, 9-16, 17-32, …: each up to a power of two), its count and percentiles: lengths
    compute for different times, as sizes do, so an overall median can fall between their modes."""
    upper = np.maximum(8, 2 ** np.ceil(np.log2(np.maximum(lengths, 1)))).astype(np.int64)
    classes: dict[str, dict[str, Any]] = {}
    for top in np.unique(upper).tolist():
        chosen = upper == top
        name = f"{1 if top == 8 else top // 2 + 1}-{top}"
        classes[name] = {"ok": int(chosen.sum()), **_percentiles_ms(latencies[chosen])}
    return classes


def _number(value: float | None, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    return f"{value:.{digits}f}"


def _errors(errors: dict[str, int]) -> str:
    return ", ".join(f"{code} {count}" for code, count in errors.items()) or "none"


def format_report(report: dict[str, Any]) -> str:
    """One run as lines of `name  value`, then the latency percentiles as a table."""
    latency = report["latency_ms"]
    rows = [
        (
            "traffic",
            str(report.get("traffic", "")) + (" (INTERRUPTED before the end)" if report.get("interrupted") else ""),
        ),
        ("sent", f"{report['sent']} ({_number(report.get('sent_rps'))} req/s)"),
        ("ok", str(report["ok"])),
        ("errors", _errors(report["errors"])),
        *((f"  {code}", message) for code, message in (report.get("error_messages") or {}).items()),
        ("throughput", f"{_number(report['throughput_rps'])} req/s, {_number(report.get('samples_per_s'))} samples/s"),
    ]
    server = report.get("server") or {}
    if server.get("model"):
        rows.insert(0, ("server", f"{server['model']} ({server.get('runtime', '?')})"))
    if report.get("emulated"):
        note = (server.get("emulation") or {}).get(
            "note", "the daemon computes nothing and waits a profile's latencies"
        )
        rows.insert(1, ("EMULATED", note))
    if "send_lag_p99_ms" in report:
        lags = f"p50 {_number(report['send_lag_p50_ms'], 3)} ms, p99 {_number(report['send_lag_p99_ms'], 3)} ms"
        rows.append(("send lag", lags))
    if report.get("lengths"):
        padded = f", padded to {report['padded_to']}" if report.get("padded_to") else ""
        tokens = f", {_number(report.get('tokens_per_s'))} tokens/s" if report.get("tokens_per_s") else ""
        rows.append(("lengths", f"{report['lengths']}{padded}{tokens}"))
    width = max(len(name) for name, _ in rows)
    lines = [f"{name:<{width}}  {value}" for name, value in rows]
    header = "latency ms " + "".join(f"{name:>10}" for name in (*PERCENTILES, "mean", "max"))
    values = [latency[name] for name in PERCENTILES] + [report.get("latency_mean_ms"), report.get("latency_max_ms")]
    lines += ["", header, " " * 11 + "".join(f"{_number(v, 3):>10}" for v in values)]
    return "\n".join(lines)


def format_sweep(reports: list[dict[str, Any]]) -> str:
    """A latency–throughput curve: one row per offered rate."""
    header = f"{'rate':>9} {'sent':>7} {'ok':>7} {'errors':>7} {'tput/s':>9}" + "".join(
        f"{name + ' ms':>10}" for name in PERCENTILES
    )
    lines = [header]
    for report in reports:
        latency = report["latency_ms"]
        lines.append(
            f"{report['rate_rps']:>9g} {report['sent']:>7} {report['ok']:>7} {sum(report['errors'].values()):>7} "
            f"{_number(report['throughput_rps'], 1):>9}" + "".join(f"{_number(latency[n], 3):>10}" for n in PERCENTILES)
        )
    return "\n".join(lines)
