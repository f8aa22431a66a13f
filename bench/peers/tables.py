"""The tables of docs/peers.md from run.py's JSON:

.venv/bin/python bench/peers/tables.py bench/results/peers-resnet50.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

NAMES = {
    "packrat_oip": "Packrat (OIP)",
    "packrat_zmq": "Packrat (ZeroMQ)",
    "packrat_torch": "Packrat (OIP, torch fp32)",
    "packrat_oip_b": "Packrat (OIP, pass B)",
    "packrat_torch_b": "Packrat (OIP, torch fp32, pass B)",
    "torchserve_default": "TorchServe defaults",
    "torchserve_best": "TorchServe best",
    "triton_default": "Triton defaults",
    "triton_best": "Triton best",
}


def fmt(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:.1f}" if value >= 10 else f"{value:.2f}"
    return str(value)


def plan_label(plan: Any) -> str:
    """A Packrat plan as ⟨instances × threads, batch⟩ groups, e.g. "2 × ⟨1 thread, 8 inputs⟩"."""
    if not isinstance(plan, dict) or not plan.get("instances"):
        return str(plan)
    groups: dict[tuple[int, int], int] = {}
    for instance in plan["instances"]:
        key = (instance["threads"], instance["batch"])
        groups[key] = groups.get(key, 0) + 1
    return " + ".join(
        f"{count} × ⟨{threads} thread{'s' if threads > 1 else ''}, {batch} input{'s' if batch > 1 else ''}⟩"
        for (threads, batch), count in groups.items()
    )


def _load_during(result: dict[str, Any]) -> str:
    """The 1-minute load average as the points ran (each run records it as it ends) and at the end, where recorded."""
    loads = [run["load_average"] for point in result.get("points", []) for runs in point["runs"].values()
             for run in runs if "load_average" in run]  # fmt: skip
    during = f", {min(loads):.1f}–{max(loads):.1f} as the points ran" if loads else ""
    end = result.get("load_average_at_end")
    return during + (f", {end[0]:.1f} at the end" if end else "")


def point_label(row: dict[str, Any]) -> str:
    traffic = f"c={row['concurrency']}" if "concurrency" in row else f"Poisson {row['rate']:g}/s"
    return f"B={row['batch']}, {traffic}"


def render(result: dict[str, Any]) -> str:
    summary = result["summary"]
    names = [name for name in NAMES if name in summary["table"][0]]
    lines = [
        f"{result['model']} on {result['cores']} cores; {result['options']['duration']:g} s per point, "
        f"{result['options']['rounds']} round(s); load average at start {result['load_average_at_start'][0]:.1f}"
        + _load_during(result),
        "",
    ]
    lines.append("p50 / p99 ms (throughput req/s; errors if any):")
    lines.append("")
    lines.append("| point | " + " | ".join(NAMES[name] for name in names) + " |")
    lines.append("|---" * (len(names) + 1) + "|")
    for row in summary["table"]:
        cells = []
        for name in names:
            entry = row[name]
            cell = f"{fmt(entry['p50'])} / {fmt(entry['p99'])} ({fmt(entry['throughput_rps'])})"
            if entry["errors"]:
                cell += f" {entry['errors']} err"
            cells.append(cell)
        lines.append(f"| {point_label(row)} | " + " | ".join(cells) + " |")
    judged = result.get("packrat", "packrat_oip")
    lines += ["", f"{NAMES[judged]} p99 ÷ the others':", ""]
    lines.append("| point | ÷ TorchServe defaults | ÷ the peer it does worst against | that peer | within 5% |")
    lines.append("|---|---|---|---|---|")
    for check in summary["checks"]:
        lines.append(
            f"| {point_label(check)} | {fmt(check.get('packrat_vs_torchserve_default_p99'))} | "
            f"{fmt(check.get('packrat_vs_best_peer_p99'))} | {NAMES.get(check.get('best_peer_here'), '—')} | "
            f"{'yes' if check.get('within_5pct') else 'no'} |"
        )
    lines += [
        "",
        "Searches:",
        "",
        "| peer | configurations tried | best | its score (geomean p99 of the probes) | search time |",
        "|---|---|---|---|---|",
    ]
    for peer, search in result.get("search", {}).items():
        best = search["best"]
        lines.append(
            f"| {peer} | {len(search['configurations'])} | {best} | "
            f"{fmt(search['configurations'][best]['score_p99_geomean_ms'])} ms | {search['search_s']:.0f} s |"
        )
    started = result["started_s"].get("packrat" if judged == "packrat_oip" else judged)
    lines.append(
        f"| packrat | 0 (its defaults) | {plan_label(result['configured'][judged].get('plan'))} | — | "
        f"{fmt(started)} s from start to serving |"
    )
    loadgen = result.get("loadgen")
    if loadgen:
        lines += [
            "",
            f"MLPerf LoadGen (Server bound: p99 ≤ {loadgen['bound_ms']:g} ms):",
            "",
            "| SUT | SingleStream p90 | SingleStream p50 | Server QPS at the bound | first failing QPS | "
            "Server trials |",
            "|---|---|---|---|---|---|",
        ]
        for name, scenarios in loadgen.items():
            if not isinstance(scenarios, dict) or "Server" not in scenarios:
                continue
            single, server = scenarios["SingleStream"], scenarios["Server"]
            lines.append(
                f"| {NAMES.get(name, name)} | {fmt(single['p90_ms'])} ms | {fmt(single['p50_ms'])} ms | "
                f"{fmt(server['qps_at_bound'])} | {fmt(server['first_failing_qps'])} | "
                f"{len(server['trials'])} |"
            )
    lines += [
        "",
        f"Packrat's plan at start: {plan_label(result.get('packrat_plan_before_measuring'))}; after the "
        f"run: {plan_label(result.get('packrat_plan_after_measuring'))}.",
    ]
    lines += versus_lowest(summary, NAMES[judged])
    targets = summary["targets"]
    lines += [
        "",
        f"Targets: Packrat's p99 below TorchServe's defaults at every concurrency: "
        f"{targets['packrat_p99_below_torchserve_default_every_concurrency']}; within 5% of the best peer at "
        f"every point: {targets['packrat_within_5pct_of_best_peer_every_point']}; p50 and p99 at or below the best "
        f"peer's at every point: {targets.get('packrat_at_or_below_best_peer_p50_p99_every_point')}.",
    ]
    return "\n".join(lines)


def versus_lowest(summary: dict[str, Any], judged: str) -> list[str]:
    """The judged Packrat's p50 and p99 ÷ the lowest peer's at each point (the issue's target: at or below both)."""
    checks = [check for check in summary["checks"] if "vs_lowest_peer" in check]
    if not checks:
        return []
    lines = ["", f"{judged} ÷ the lowest peer at each point (p50 and p99 each against its own lowest):", ""]
    lines.append("| point | p50 ratio | lowest p50 | p99 ratio | lowest p99 | at or below both |")
    lines.append("|---|---|---|---|---|---|")
    for check in checks:
        entry = check["vs_lowest_peer"]
        lines.append(
            f"| {point_label(check)} | {fmt(entry['p50']['ratio'])} | {NAMES.get(entry['p50']['peer'], '—')} | "
            f"{fmt(entry['p99']['ratio'])} | {NAMES.get(entry['p99']['peer'], '—')} | "
            f"{'yes' if entry['at_or_below'] else 'no'} |"
        )
    return lines


def render_compact(result: dict[str, Any]) -> str:
    """p99 only, one column per configuration (bench/README.md's table)."""
    table = result["summary"]["table"]
    names = [name for name in NAMES if name in table[0]]
    lines = ["| p99 ms | " + " | ".join(NAMES[name] for name in names) + " |", "|---" * (len(names) + 1) + "|"]
    for row in table:
        lines.append(f"| {point_label(row)} | " + " | ".join(fmt(row[name]["p99"]) for name in names) + " |")
    return "\n".join(lines)


def main() -> int:
    compact = "--compact" in sys.argv[1:]
    for path in (arg for arg in sys.argv[1:] if arg != "--compact"):
        result = json.loads(Path(path).read_text())
        print(render_compact(result) if compact else render(result))
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
