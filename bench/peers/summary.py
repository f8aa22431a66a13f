"""run.py's summary of its points: per point and configuration the medians across rounds, and the ratios the issue's
targets are stated in (harness side, .venv; no peer needed, so it is tested on made-up points).

`packrat` names the Packrat configuration the peers are judged against: `packrat_oip` (its defaults) in the usual
run, `packrat_torch` (pinned to torch at fp32, the peers' runtime) under `--same-runtime`, where the scheduling is
compared alone. Each peer is compared with that configuration's runs of its own pass (`<packrat>_b` for TorchServe's
defaults, which serve in a pass of their own).
"""

from __future__ import annotations

import math
import statistics
from typing import Any


def geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(value) for value in values) / len(values))


def _median(values: list[Any]) -> Any:
    present = [value for value in values if value is not None]
    return round(statistics.median(present), 2) if present else None


def _ratio(mine: float, theirs: float) -> float | None:
    if math.isinf(mine) or math.isinf(theirs) or theirs <= 0:
        return None
    return round(mine / theirs, 3)


def table_rows(points: list[dict[str, Any]], names: list[str]) -> list[dict[str, Any]]:
    """Per point and configuration: p50, p90, p99 and throughput, each the median across rounds, and the errors."""
    table = []
    for point in points:
        row: dict[str, Any] = {key: point[key] for key in ("batch", "concurrency", "rate") if key in point}
        for name in names:
            runs = point["runs"][name]
            row[name] = {
                **{q: _median([run["latency_ms"][q] for run in runs]) for q in ("p50", "p90", "p99")},
                "throughput_rps": _median([run["throughput_rps"] for run in runs]),
                "errors": sum(sum(run["errors"].values()) for run in runs),
            }
        table.append(row)
    return table


def _quantile(row: dict[str, Any], name: str, q: str) -> float:
    """A configuration's quantile at a point; inf when it failed a request there (a failure is never a win)."""
    value = row[name][q]
    return math.inf if value is None or row[name]["errors"] else value


def versus_lowest(row: dict[str, Any], packrat: str, peers: list[str]) -> dict[str, Any]:
    """`packrat`'s p50 and p99 at a point against the lowest of `peers` there, quantile by quantile (the lowest
    p50 and the lowest p99 may be two peers' own): each ratio, the peer, and whether Packrat is at or below both."""
    entry: dict[str, Any] = {}
    for q in ("p50", "p99"):
        lowest = min(peers, key=lambda peer: _quantile(row, peer, q))
        entry[q] = {"ratio": _ratio(_quantile(row, packrat, q), _quantile(row, lowest, q)), "peer": lowest}
    entry["at_or_below"] = all(entry[q]["ratio"] is not None and entry[q]["ratio"] <= 1.0 for q in ("p50", "p99"))
    return entry


def summarize(points: list[dict[str, Any]], names: list[str], packrat: str = "packrat_oip") -> dict[str, Any]:
    """The table, the per-point checks, the best peer (the lowest geometric-mean p99 of those measured in
    `packrat`'s main pass) and the targets."""
    table = table_rows(points, names)
    peers = [name for name in names if not name.startswith("packrat")]
    second = f"{packrat}_b"

    def reference(peer: str) -> str:
        return second if peer == "torchserve_default" and second in names else packrat

    candidates = [name for name in peers if reference(name) == packrat]  # measured in Packrat's main pass
    scores = {name: geomean([min(_quantile(row, name, "p99"), 1e9) for row in table]) for name in candidates}
    best_peer = min(scores, key=lambda name: scores[name]) if scores else None
    checks = [_check(row, names, packrat, peers, candidates, reference) for row in table]
    closed_ts = [
        entry.get("packrat_vs_torchserve_default_p99")
        for entry in checks
        if "concurrency" in entry and "torchserve_default" in peers
    ]
    return {
        "packrat": packrat,
        "table": table,
        "checks": checks,
        "peer_scores_p99_geomean_ms": {name: round(score, 2) for name, score in scores.items()},
        "best_peer": best_peer,
        "targets": {
            "packrat_p99_below_torchserve_default_every_concurrency": bool(closed_ts)
            and all(ratio is not None and ratio < 1 for ratio in closed_ts),
            "packrat_within_5pct_of_best_peer_every_point": all(entry.get("within_5pct", False) for entry in checks),
            "packrat_at_or_below_best_peer_p50_p99_every_point": bool(candidates)
            and all(entry["vs_lowest_peer"]["at_or_below"] for entry in checks),
            "points_missed": [entry for entry in checks if not entry.get("within_5pct", False)],
        },
    }


def _check(
    row: dict[str, Any],
    names: list[str],
    packrat: str,
    peers: list[str],
    candidates: list[str],
    reference: Any,
) -> dict[str, Any]:
    entry: dict[str, Any] = {key: row[key] for key in ("batch", "concurrency", "rate") if key in row}
    ratios = {peer: _ratio(_quantile(row, reference(peer), "p99"), _quantile(row, peer, "p99")) for peer in peers}
    entry["packrat_p99_vs"] = ratios
    if "torchserve_default" in ratios:
        entry["packrat_vs_torchserve_default_p99"] = ratios["torchserve_default"]
    known = {peer: ratio for peer, ratio in ratios.items() if ratio is not None}
    if known:
        worst = max(known, key=lambda peer: known[peer])
        entry.update(best_peer_here=worst, packrat_vs_best_peer_p99=known[worst], within_5pct=known[worst] <= 1.05)
    if candidates:
        entry["vs_lowest_peer"] = versus_lowest(row, packrat, candidates)
    if "packrat_zmq" in names and "packrat_oip" in names:
        entry["packrat_zmq_vs_oip_p99"] = _ratio(
            _quantile(row, "packrat_zmq", "p99"), _quantile(row, "packrat_oip", "p99")
        )
    if packrat != "packrat_torch" and "packrat_torch" in names and candidates:
        # Pinned to the peers' runtime: its p99 against the lowest peer p99 of its own pass.
        lowest = min(candidates, key=lambda peer: _quantile(row, peer, "p99"))
        entry["packrat_torch_vs_best_peer_p99"] = _ratio(
            _quantile(row, "packrat_torch", "p99"), _quantile(row, lowest, "p99")
        )
    return entry
