"""run.py's passes: the peers' searches' probes, the points (every configuration taking turns) and MLPerf LoadGen,
each a function of the run's options and its targets (harness side, .venv)."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from common import HERE, REPO, dump, require
from load import measure
from summary import geomean

LOADGEN = HERE / "loadgen.py"


def ints(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part]


def floats(text: str) -> list[float]:
    return [float(part) for part in text.split(",") if part]


def log(message: str) -> None:
    print(f"[peers {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def probe_score(target: dict[str, Any], args: argparse.Namespace, probes: list[tuple[int, int]]) -> dict[str, Any]:
    """A configuration's p99 at each probe point (closed loop); its score is their geometric mean (inf if any
    request failed)."""
    results = {}
    for concurrency, batch in probes:
        report = asyncio.run(
            measure(
                target,
                args.model,
                batch,
                {"concurrency": concurrency},
                args.search_duration,
                min(args.warmup, 1.0),
                args.timeout,
            )
        )
        results[f"c{concurrency}_b{batch}"] = {
            "p99": report["latency_ms"]["p99"],
            "errors": report["errors"],
            "throughput_rps": report["throughput_rps"],
        }
    p99s = [entry["p99"] for entry in results.values()]
    failed = any(entry["errors"] for entry in results.values()) or None in p99s
    return {"probes": results, "score_p99_geomean_ms": None if failed else round(geomean(p99s), 2)}


def pick_best(scored: dict[str, dict[str, Any]]) -> str:
    usable = {name: entry for name, entry in scored.items() if entry["score_p99_geomean_ms"] is not None}
    if not usable:
        raise RuntimeError(f"every configuration failed a probe: {dump(scored)}")
    return min(usable, key=lambda name: usable[name]["score_p99_geomean_ms"])


def checkpoint(args: argparse.Namespace, result: dict[str, Any], **parts: Any) -> None:
    """What is measured so far to --out, marked partial, so that a run stopped later keeps it."""
    if args.out:
        Path(args.out).write_text(dump({**result, **parts, "partial": True}) + "\n")


def run_points(
    args: argparse.Namespace,
    targets: dict[str, dict[str, Any]],
    concurrencies: list[int],
    batches: list[int],
    template: list[dict[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """Every point, the configurations taking turns (the order rotating from point to point and round to round);
    closed-loop points first, so that the Poisson rates can follow from the throughputs they reached. With
    `template` (an earlier pass's points), the same points again, their runs added to those points."""
    names = list(targets)
    points: list[dict[str, Any]] = []
    closed = [{"batch": batch, "concurrency": concurrency} for batch in batches for concurrency in concurrencies]
    turn = 0
    for phase in ("closed", "poisson"):
        if template is not None:
            todo = [point for point in template if ("concurrency" in point) == (phase == "closed")]
            for point in todo:
                point["runs"].update({name: [] for name in names})
        elif phase == "poisson":
            todo = []
            for batch in batches:
                if args.rates:
                    rates = floats(args.rates)
                else:
                    capacity = max(
                        (run["throughput_rps"] or 0.0)
                        for done in points
                        if done["batch"] == batch and "concurrency" in done
                        for runs in done["runs"].values()
                        for run in runs
                    )
                    rates = [round(fraction * capacity, 2) for fraction in floats(args.rate_fractions)]
                todo += [{"batch": batch, "rate": rate} for rate in rates if rate > 0]
        else:
            todo = closed
        if template is None:
            for point in todo:
                point["runs"] = {name: [] for name in names}
        points += todo
        for round_index in range(args.rounds):
            for point in todo:
                order = names[turn % len(names) :] + names[: turn % len(names)]
                turn += 1
                label = f"B={point['batch']} " + (
                    f"c={point['concurrency']}" if "concurrency" in point else f"{point['rate']}/s"
                )
                for name in order:
                    spec = {key: point[key] for key in ("concurrency", "rate") if key in point}
                    report = asyncio.run(
                        measure(
                            targets[name],
                            args.model,
                            point["batch"],
                            spec,
                            args.duration,
                            args.warmup,
                            args.timeout,
                            seed=round_index,
                        )
                    )
                    report["load_average"] = round(os.getloadavg()[0], 2)  # the machine's, the run's own included
                    point["runs"][name].append(report)
                    log(
                        f"{label} round {round_index + 1}: {name} p50 {report['latency_ms']['p50']} "
                        f"p99 {report['latency_ms']['p99']} ms, {report['throughput_rps']}/s, "
                        f"errors {report['errors']}, load {report['load_average']}"
                    )
    return points


def run_loadgen(
    args: argparse.Namespace, targets: dict[str, dict[str, Any]], bound_ms: float, out: Path
) -> dict[str, Any]:
    """bench/peers/loadgen.py in LoadGen's own environment, for each target in turn: SingleStream, then the
    Server scenario's search for the highest QPS whose p99 is under `bound_ms`."""
    python = str(require("loadgen") / "bin/python")
    results: dict[str, Any] = {
        "bound_ms": bound_ms,
        "summaries": str(out.relative_to(REPO)) if out.is_relative_to(REPO) else str(out),
    }
    for scenario in ("SingleStream", "Server"):
        for name, target in targets.items():
            log(f"LoadGen {scenario}: {name}")
            command = [
                python,
                str(LOADGEN),
                "--target",
                json.dumps(target),
                "--name",
                name,
                "--model",
                args.model,
                "--scenario",
                scenario,
                "--duration",
                str(args.loadgen_duration),
                "--bound-ms",
                str(bound_ms),
                "--timeout",
                str(args.timeout),
                "--out",
                str(out / name),
            ]
            done = subprocess.run(command, capture_output=True, text=True)
            if done.returncode != 0:
                raise RuntimeError(f"loadgen.py failed for {name} {scenario}: {done.stderr[-3000:]}")
            results.setdefault(name, {})[scenario] = json.loads(done.stdout)
    return results
