"""`packrat profile --adaptive`: measure the cells that decide the plan, not the whole grid.

Two sources of measurements:
- a real model (the default): cells are measured in pinned workers forked from a template, and the
  winning plans are then confirmed by running their instances side by side;
- `--replay FULL.csv`: every measurement is looked up in a full table (with optional `--noise`
  jitter), for research and tests; confirmation is the table's own L̂ of the plan.

See docs/profiling.md for when to use the full grid and when adaptive.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from packrat_daemon.commands.solve import solve_plans
from packrat_daemon.search import AdaptiveResult, Budget, StepReport, adaptive_profile
from packrat_daemon.search.loop import MODEL_NOISE
from packrat_daemon.wire.errors import ProfileError
from policies.planning.profile import Cell, Profile
from policies.planning.topology import Topology

if TYPE_CHECKING:
    from packrat_daemon.measure.bench import Bench


def run_adaptive(args: argparse.Namespace) -> int:
    budget = Budget.parse(args.budget)
    if args.noise < 0 or not math.isfinite(args.noise):
        raise ProfileError(f"--noise must be a non-negative fraction like 0.01, got {args.noise}")
    if args.replay:
        return _run_replay(args, budget)
    return _run_model(args, budget)


# -- replay ---------------------------------------------------------------------------------------
def _run_replay(args: argparse.Namespace, budget: Budget) -> int:
    full = Profile.read_csv(args.replay)
    # A replayed table was measured on some machine: by default plan for the cores it covers.
    cores = args.cores or max(full.threads())
    cells = [key for key in full if not args.threads or key[0] in args.threads]
    if not cells:
        raise ProfileError(f"{args.replay} has no cells for threads {args.threads}")
    rng = np.random.default_rng(args.seed)

    def measure(threads: int, batch: int) -> float:
        jitter = math.exp(args.noise * float(rng.standard_normal())) if args.noise else 1.0
        return full.latency(threads, batch) * jitter

    progress = _progress(budget, len(cells), enabled=not args.json)
    try:
        result = adaptive_profile(
            measure, cells, args.batches, cores, budget=budget, seed=args.seed, noise=args.noise,
            on_step=progress.step,
        )  # fmt: skip
    finally:
        progress.close()
    plans = solve_plans(result.profile, Topology.synthetic(cores), args.batches, "packrat")
    confirmed = [
        {
            "batch": plan["batch"],
            "latency_ms": round(table_confirmation(full.lhat, _pairs(plan["instances"])), 6),
            "predicted_ms": plan["latency_ms"],
        }
        for plan in plans
    ]
    report = _report(result, plans, confirmed, cores)
    _emit(report, args.json, source=f"replay of {args.replay}")
    return 0


def table_confirmation(
    lhat: Callable[[int, int], float | None], instances: Sequence[tuple[int, int]], interference: float = 1.0
) -> float:
    """Replay's stand-in for a side-by-side run: the slowest instance's L̂ from the full table, times an
    interference factor (1.0: the table is taken as the truth)."""
    values = [lhat(int(t), int(b)) for t, b in instances]
    if any(v is None for v in values):
        raise ProfileError("the replayed table has no cell large enough for one of the plan's instances")
    return max(v for v in values if v is not None) * interference


def _pairs(instances: Sequence[Mapping[str, int]]) -> list[tuple[int, int]]:
    return [(i["threads"], i["batch"]) for i in instances]


# -- a real model --------------------------------------------------------------------------------
def _run_model(args: argparse.Namespace, budget: Budget) -> int:
    from packrat_daemon.measure.bench import Bench, default_grid, model_session

    topology = Topology.detect()
    cores = args.cores or topology.usable_cores
    if cores > topology.usable_cores:
        raise ProfileError(
            f"--cores {cores} exceeds the {topology.usable_cores} usable cores here; "
            "measure on the machine that will serve, or use --replay"
        )
    threads = [t for t in (args.threads or range(1, topology.usable_cores + 1)) if t <= cores]
    if not threads:
        raise ProfileError(f"no thread count in {args.threads} fits the {cores} usable cores")
    # Instances may take any batch up to the target: profile the powers of two in between as well.
    batches = sorted(set(default_grid(cores, max(args.batches))[1]) | set(args.batches))
    grid = [(t, b) for t in threads for b in batches]
    cells: dict[tuple[int, int], Cell] = {}
    progress = _progress(budget, len(grid), enabled=True)
    started = time.monotonic()
    with model_session(args.model, input_override=args.input, runtime=args.runtime, allocator=args.allocator) as (
        backend,
        info,
    ):
        # One worker per cell, each thread count's kept alive: the search visits them in any order.
        bench = Bench(
            backend, topology, info, warmup=args.warmup, repeats=args.repeats, side_by_side=False, keep_workers=True
        )
        try:

            def measure(t: int, b: int) -> float:
                cell = bench.measure_cell(t, b)
                cells[(t, b)] = cells[(t, b)].merged(cell) if (t, b) in cells else cell
                return cell.latency_ms

            progress.note(f"profiling {args.model} adaptively on {cores} cores")
            try:
                result = adaptive_profile(
                    measure, grid, args.batches, cores, budget=budget, seed=args.seed, noise=MODEL_NOISE,
                    on_step=progress.step,
                )  # fmt: skip
            except KeyboardInterrupt:
                return _save_partial(cells, args)
            finally:
                progress.close()
            seconds = time.monotonic() - started
            write_profile(result, cells, args.out, model=args.model, runtime=args.runtime)
            plans = solve_plans(result.profile, Topology.synthetic(cores), args.batches, "packrat")
            print("confirming the plans side by side", file=sys.stderr)
            confirmed = _confirm(bench, plans, rounds=args.repeats)
        finally:
            bench.close()
    report = _report(result, plans, confirmed, cores)
    report["seconds"] = round(seconds, 3)
    report["out"] = str(args.out)
    _emit(report, args.json, source=args.model)
    return 0


def _save_partial(cells: Mapping[tuple[int, int], Cell], args: argparse.Namespace) -> int:
    """Ctrl-C: keep what was measured (only measured cells; no surrogate without a finished search)."""
    if cells:
        Profile(dict(cells), model=args.model, runtime=args.runtime).write_csv(args.out)
        print(f"interrupted: wrote the {len(cells)} measured cells to {args.out}", file=sys.stderr)
    else:
        print("interrupted before any cell was measured; nothing written", file=sys.stderr)
    return 130


def _confirm(bench: Bench, plans: list[dict[str, Any]], rounds: int) -> list[dict[str, Any]]:
    """Every distinct plan run side by side in one interleaved session."""
    distinct: dict[tuple[tuple[int, int], ...], str] = {}
    for plan in plans:
        distinct.setdefault(tuple(_pairs(plan["instances"])), f"plan{len(distinct)}")
    timings = bench.compare({name: list(key) for key, name in distinct.items()}, rounds=rounds)
    confirmed = []
    for plan in plans:
        key = tuple(_pairs(plan["instances"]))
        timing = timings[distinct[key]]
        confirmed.append(
            {
                "batch": plan["batch"],
                "latency_ms": round(timing.latency_ms, 3),
                "wall_ms": round(timing.wall_ms, 3),
                "predicted_ms": plan["latency_ms"],
            }
        )
    return confirmed


def write_profile(
    result: AdaptiveResult, cells: Mapping[tuple[int, int], Cell], path: str | os.PathLike[str], *,
    model: str = "", runtime: str = "",
) -> None:  # fmt: skip
    """The filled profile, atomically, with a `source` column: `measured` or `surrogate`.

    Writing every cell means `packrat solve` on this file gives the plans the adaptive run chose;
    the column keeps estimates from passing for measurements.
    """
    out = io.StringIO()
    if model:
        out.write(f"# model: {model}\n")
    if runtime:
        out.write(f"# runtime: {runtime}\n")
    out.write(
        f"# adaptive: {len(result.measured)} of {result.grid_size} cells measured "
        f"({result.measurements} measurements); the rest estimated by the surrogate\n"
    )
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["threads", "batch", "latency_ms", "samples", "p90_ms", "source"])
    for (t, b), cell in result.profile.items():
        measured = cells.get((t, b))
        if measured is None:
            writer.writerow([t, b, f"{cell.latency_ms:.4f}", "", "", "surrogate"])
        else:
            p90 = "" if measured.p90_ms is None else f"{measured.p90_ms:.4f}"
            writer.writerow([t, b, f"{cell.latency_ms:.4f}", measured.samples, p90, "measured"])
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(out.getvalue(), encoding="utf-8")
    os.replace(tmp, path)


# -- output --------------------------------------------------------------------------------------
def _report(
    result: AdaptiveResult, plans: list[dict[str, Any]], confirmed: list[dict[str, Any]], cores: int
) -> dict[str, Any]:
    return {
        "measured": result.measured_cells(),
        "plans": plans,
        "confirmed": confirmed,
        "cores": int(cores),
        "measurements": int(result.measurements),
        "grid_cells": int(result.grid_size),
        "stopped": result.stopped,
    }


def _emit(report: dict[str, Any], as_json: bool, source: str) -> None:
    if as_json:
        print(json.dumps(report))
        return
    print(
        f"adaptive profile of {source}: {len(report['measured'])} of {report['grid_cells']} cells measured "
        f"({report['measurements']} measurements, stopped: {report['stopped']}) on {report['cores']} cores"
    )
    print(f"{'batch':>7}  {'predicted ms':>12}  {'confirmed ms':>12}  instances (threads×inputs)")
    for plan, check in zip(report["plans"], report["confirmed"], strict=True):
        print(
            f"{plan['batch']:>7}  {plan['latency_ms']:>12.2f}  {check['latency_ms']:>12.2f}  "
            f"{describe_instances(plan['instances'])}"
        )
    if "out" in report:
        print(f"wrote the filled profile to {report['out']} (column source: measured or surrogate)")


def describe_instances(instances: Sequence[Mapping[str, int]]) -> str:
    """'2× 1t×4' style: how many instances of each (threads, inputs)."""
    groups: dict[tuple[int, int], int] = {}
    for inst in instances:
        key = (inst["threads"], inst["batch"])
        groups[key] = groups.get(key, 0) + 1
    return ", ".join(f"{n}× {t}t×{b}" for (t, b), n in groups.items())


class _StepProgress:
    """The progress line: cells measured, the current plans and their predicted latency."""

    def __init__(self, total: int, enabled: bool) -> None:
        from packrat_daemon.ops.progress import Progress

        self.progress = Progress(total, "adaptive profiling", enabled=enabled)

    def step(self, report: StepReport) -> None:
        t, b = report.cell
        plans = "; ".join(
            f"B={batch}: {describe_instances([{'threads': x, 'batch': y} for x, y in s.instances])} "
            f"≈{s.latency_ms:.1f} ms"
            for batch, s in sorted(report.solutions.items())
        )
        note = f"t={t} b={b}: {report.latency_ms:.2f} ms" + (f" | {plans}" if plans else " (anchor)")
        self.progress.advance(note)

    def note(self, text: str) -> None:
        self.progress.note(text)

    def close(self) -> None:
        self.progress.close()


def _progress(budget: Budget, grid_size: int, enabled: bool) -> _StepProgress:
    return _StepProgress(budget.max_cells(grid_size), enabled)
