"""docs/evaluation.md's tables from bench/simulate.py's JSON: the default rows of (b) and (c), and the four-point
interference band of every headline ratio with the conclusions that hold at all four points.

    .venv/bin/python bench/simulate.py --render bench/results/simulate.json
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

POINTS = ("none", "default", "estimate", "pessimistic")
B_LABELS = {"packrat": "packrat", "packrat_fixed": "packrat fixed", "single": "single", "torchserve": "torchserve",
            "paper_estimator": "paper estimator"}  # fmt: skip


def _ratio(row: dict[str, Any], point: str, policy: str, key: str = "p50_ms") -> float:
    return row[point][policy][key] / row[point]["packrat"][key]


def _four(values: list[float], digits: int = 2) -> str:
    return " / ".join(f"{v:.{digits}f}" for v in values)


def _heading(results: dict[str, Any]) -> str:
    factors = {t: points["estimate"] for t, points in results["interference"].items()}
    own = ", ".join(f"{table} ×{float(f):.3f}" for table, f in factors.items())
    return (
        f"Each cell: none / default (×1.157) / the model's own estimate ({own}) / pessimistic (×1.4). "
        "A ratio is a policy's p50 over adaptive packrat's, so above 1 packrat is ahead."
    )


def _survives(name: str, holds: Callable[[str], bool]) -> str:
    at = [point for point in POINTS if holds(point)]
    verdict = "holds at all four" if len(at) == len(POINTS) else f"holds at {', '.join(at) or 'none of them'}"
    return f"- {name}: {verdict}"


def _spans(name: str, ratios: Callable[[str], list[float]]) -> str:
    spans = "; ".join(f"{point} {min(ratios(point)):.2f}–{max(ratios(point)):.2f}" for point in POINTS)
    return f"- {name}: {spans}"


def render_a(results: dict[str, Any]) -> list[str]:
    rows = results["a"]
    lines = ["| table | batch | single ÷ packrat | torchserve ÷ packrat |", "|---|---:|---:|---:|"]
    for row in rows:
        single = [_ratio(row, p, "single") for p in POINTS]
        torchserve = [_ratio(row, p, "torchserve") for p in POINTS]
        lines.append(f"| {row['table']} | {row['batch']} | {_four(single)} | {_four(torchserve)} |")
    lines += [
        "",
        _survives(
            "packrat is at least as fast as single at every batch (to 1%)",
            lambda p: all(_ratio(r, p, "single") >= 0.99 for r in rows),
        ),  # fmt: skip
        _spans("single ÷ packrat over the batches", lambda p: [_ratio(r, p, "single") for r in rows]),
        _survives(
            "torchserve is the slowest at every batch above 1",
            lambda p: all(
                _ratio(r, p, "torchserve") > max(1.0, _ratio(r, p, "single")) for r in rows if r["batch"] > 1
            ),
        ),  # fmt: skip
    ]
    return lines


def render_b(results: dict[str, Any]) -> list[str]:
    rows = results["b"]
    others = [label for label in B_LABELS if label != "packrat"]
    lines = [
        "| table | traffic | packrat p50 ms | " + " | ".join(f"{B_LABELS[o]} ÷ packrat" for o in others) + " |",
        "|---|---|---:|" + "---:|" * len(others),
    ]
    for row in rows:
        p50 = [row[p]["packrat"]["p50_ms"] for p in POINTS]
        cells = [_four([_ratio(row, p, o) for p in POINTS]) for o in others]
        lines.append(f"| {row['table']} | {row['traffic']} | {_four(p50, 1)} | " + " | ".join(cells) + " |")
    lines += [
        "",
        _survives(
            "adaptive packrat has the lowest p50 in every run (ties within 1% count)",
            lambda p: all(_ratio(r, p, o) >= 0.99 for r in rows for o in others),
        ),  # fmt: skip
        _survives(
            "adaptation beats keeping the start-up plan by more than 1% in every run",
            lambda p: all(_ratio(r, p, "packrat_fixed") > 1.01 for r in rows),
        ),  # fmt: skip
        _spans("packrat fixed ÷ packrat", lambda p: [_ratio(r, p, "packrat_fixed") for r in rows]),
        _spans("single ÷ packrat", lambda p: [_ratio(r, p, "single") for r in rows]),
    ]
    return lines


def render_c(results: dict[str, Any]) -> list[str]:
    rows = results["c"]
    lines = [
        "| table | T | packrat p50 ms | packrat fixed ÷ packrat | single ÷ packrat | torchserve refused |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        p50 = [row[p]["packrat"]["p50_ms"] for p in POINTS]
        fixed = [_ratio(row, p, "packrat_fixed") for p in POINTS]
        single = [_ratio(row, p, "single") for p in POINTS]
        refused = " / ".join(str(sum(row[p]["torchserve"]["errors"].values())) for p in POINTS)
        lines.append(
            f"| {row['table']} | {row['cores']} | {_four(p50, 1)} | {_four(fixed)} | {_four(single)} | {refused} |"
        )
    lines += [
        "",
        _survives("packrat is ahead of single at every T", lambda p: all(_ratio(r, p, "single") > 1.01 for r in rows)),
        _spans("single ÷ packrat", lambda p: [_ratio(r, p, "single") for r in rows]),
        _spans("packrat fixed ÷ packrat", lambda p: [_ratio(r, p, "packrat_fixed") for r in rows]),
        _survives(
            "adaptation is never behind the start-up plan (to 1%)",
            lambda p: all(_ratio(r, p, "packrat_fixed") >= 0.99 for r in rows),
        ),  # fmt: skip
        _survives(
            "torchserve refuses requests at every T",
            lambda p: all(sum(r[p]["torchserve"]["errors"].values()) > 0 for r in rows),
        ),  # fmt: skip
    ]
    return lines


def render_default(results: dict[str, Any], key: str) -> list[str]:
    """The main (b) or (c) table: every policy's run at the default interference."""
    if key == "b":
        lines = ["| table | traffic | policy | p50 / p99 ms | reconfigurations |", "| --- | --- | --- | ---: | ---: |"]
    else:
        lines = [
            "| table | T | policy | p50 / p99 ms | throughput req/s | refused | reconfigurations | "
            "adaptation look, mean / max ms (wall) |",
            "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: |",
        ]
    for row in results[key]:
        for policy, run in row["default"].items():
            label = B_LABELS[policy]
            p50_p99 = f"{run['p50_ms']:.1f} / {run['p99_ms']:.1f}"
            if key == "b":
                lines.append(f"| {row['table']} | {row['traffic']} | {label} | {p50_p99} | {run['reconfigurations']} |")
                continue
            look = run["adapt_look_ms"]
            looked = f"{look['mean']:.0f} / {look['max']:.0f}" if look["mean"] is not None else "–"
            refused = sum(run["errors"].values())
            lines.append(
                f"| {row['table']} | {row['cores']} | {label} | {p50_p99} | {run['throughput_rps']:.2f} | {refused} | "
                f"{run['reconfigurations']} | {looked} |"
            )
    return lines


def render(results: dict[str, Any]) -> str:
    out = [_heading(results), ""]
    for key, band in (("a", render_a), ("b", render_b), ("c", render_c)):
        if key not in results:
            continue
        if key in ("b", "c"):
            out += [f"### ({key}) at the default interference", "", *render_default(results, key), ""]
        out += [f"### ({key}) the band", "", *band(results), ""]
    return "\n".join(out)
