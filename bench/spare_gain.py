"""The packrat policy's bar for a spare layout (MIN_LAYOUT_GAIN), several bars side by side, by simulation.

    .venv/bin/python bench/spare_gain.py [--gains 0.02,0.01,0] [--runs FILE.json ...] [--tables b,c]

A spare layout is kept when letting each batch size run on its best layout cuts the expected compute
latency by at least the bar. Each case is simulated once per bar, everything else the same:
- the packrat rows of saved `bench/sim_vs_emulated.py` runs (--runs): the requests as that run's load
  sent them and the daemon's costs measured in it, 16 emulated cores;
- the packrat columns of docs/evaluation.md's tables (b) and (c) (`bench/simulate.py`'s traffic).

The bar is a module constant, not a setting, so this script sets `policies.packrat.MIN_LAYOUT_GAIN`
before each pass: a measuring instrument's switch, used nowhere else. Every figure is a simulation.
Prints JSON: per case and bar, p50, p99 and mean latency, whether a spare was served at the end, and each
figure over the first bar's.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(BENCH.parent))

import sim_vs_emulated  # noqa: E402
import simulate  # noqa: E402

import policies.packrat  # noqa: E402

DEFAULT_RUNS = ("sim-vs-emulated-120s-paged.json", "sim-vs-emulated-40s-paged.json", "sim-vs-emulated-120s-seeds.json")


def figures(report: dict[str, Any]) -> dict[str, Any]:
    changes = report["plan_changes"]
    return {
        "p50_ms": report["latency_ms"]["p50"],
        "p99_ms": report["latency_ms"]["p99"],
        "mean_ms": report["latency_mean_ms"],
        "spare_at_end": bool(changes) and "spare" in changes[-1]["plan"],
        "plan_changes": len(changes),
    }


def saved_cases(paths: list[str]) -> list[tuple[str, Any]]:
    """(name, a function of nothing that simulates it) for each packrat row of the saved runs."""
    cases = []
    for path in paths:
        saved = json.loads((BENCH / "results" / path).read_text())
        for row in saved["rows"]:
            if row["policy"] != "packrat":
                continue
            seed = row.get("seed", saved["seed"])
            args = argparse.Namespace(duration=saved["duration_s"], seed=seed)
            table = sim_vs_emulated.profile_of(row["table"])
            name = f"{path}: {row['table']} load {row['load']} seed {seed}"
            cases.append((name, lambda row=row, table=table, args=args: sim_vs_emulated.simulate(
                table, "packrat", row, args, row["costs"]).to_json()))  # fmt: skip
    return cases


def table_cases(tables: list[str]) -> list[tuple[str, Any]]:
    """The packrat column of each row of bench/simulate.py's tables (b) and (c)."""
    args = argparse.Namespace(duration=600.0, seed=13)
    cases = []
    for key in tables:
        maker = {"b": simulate.table_b, "c": simulate.table_c}[key]

        def rows(maker: Any = maker) -> list[dict[str, Any]]:
            return maker(args)

        cases.append((f"table ({key})", rows))
    return cases


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gains", default="0.02,0.01,0")
    parser.add_argument("--runs", nargs="*", default=list(DEFAULT_RUNS), help="saved runs in bench/results/")
    parser.add_argument("--tables", default="b,c", help="of docs/evaluation.md's, by simulation; '' for none")
    args = parser.parse_args()
    gains = [float(gain) for gain in args.gains.split(",")]
    results: dict[str, dict[str, Any]] = {}
    for gain in gains:
        policies.packrat.MIN_LAYOUT_GAIN = gain
        for name, run in saved_cases(args.runs):
            results.setdefault(name, {})[str(gain)] = figures(run())
            print(f"bar {gain}: {name}", file=sys.stderr)
        for name, run in table_cases([t for t in args.tables.split(",") if t]):
            for row in run():
                label = f"{name}: {row['table']} {row.get('traffic', row.get('cores'))}"
                results.setdefault(label, {})[str(gain)] = figures(row["packrat"]["report"])
            print(f"bar {gain}: {name}", file=sys.stderr)
    first = str(gains[0])
    for by_gain in results.values():
        for gain, fig in by_gain.items():
            if gain != first:
                base = by_gain[first]
                fig["over_first"] = {k: round(fig[k] / base[k], 3) for k in ("p50_ms", "p99_ms", "mean_ms")}
    print(json.dumps({"what": "packrat's spare-layout bar, side by side, by simulation", "gains": gains,
                      "cases": results}, indent=1))  # fmt: skip


if __name__ == "__main__":
    main()
