"""`packrat report`: PNG plots of a profile, the plans it leads to, and a `packrat load` sweep.

    packrat report --profile profile.csv --out report/          # heat map, latency per batch size, plans
    packrat report --load sweep.json --out report/              # the latency–throughput curve
    packrat report --profile profile.csv --cores 16 --load sweep.json --out report/

matplotlib is an optional extra (`pip install -e '.[plot]'`); it is checked before anything is read.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from packrat_daemon.commands.options import positive_int
from packrat_daemon.wire.errors import ConfigError
from policies.planning.profile import Profile
from policies.planning.topology import Topology

MAX_LINES = 12
HEATMAP, LATENCY, PLANS, LOAD = "profile-heatmap.png", "profile-latency.png", "plans.png", "load-curve.png"


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    summary = "draw PNG plots of a profile, its plans and a packrat load sweep"
    parser = subparsers.add_parser(
        "report",
        help=summary,
        description=f"{summary[0].upper()}{summary[1:]} (needs matplotlib: pip install -e '.[plot]'). "
        f"From --profile: {HEATMAP}, {LATENCY} and {PLANS}; from --load: {LOAD}.",
    )
    parser.add_argument(
        "--profile", help="profile CSV (header threads,batch,latency_ms), as packrat profile writes, or a daemon's "
        "state file (learned-profile.json)",
    )  # fmt: skip
    parser.add_argument(
        "--runtime", help="which runtime's rows to draw when the profile holds several (openvino, openvino/bf16)"
    )
    parser.add_argument(
        "--cores", type=positive_int, help="cores to plan for (default: the profile's largest thread count)"
    )
    parser.add_argument("--load", metavar="LOAD.json", help="output of packrat load --json (one rate or a --sweep)")
    parser.add_argument("--out", default=".", help="folder for the PNG files (made if missing; default: here)")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from packrat_daemon.load.plot import check_plotting, plot_sweep

    if not args.profile and not args.load:
        raise ConfigError("nothing to draw: give --profile PROFILE.csv, --load LOAD.json or both")
    check_plotting("packrat report")
    profile, notes = read_profile(args.profile, args.runtime) if args.profile else (None, [])
    reports = read_load(args.load) if args.load else None
    out = Path(args.out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"cannot make the folder {out}: {exc.strerror or exc}") from None
    written = []
    if profile is not None:
        if not len(profile):
            raise ConfigError(f"{args.profile} has no cells to draw")
        cores = args.cores or max(profile.threads())
        name = Path(args.profile).name
        rows = plan_rows(profile, cores)
        check_predicted(rows, profile, cores, name)  # before any file is written: an empty chart says nothing
        warnings = [*notes, *implausible(profile, rows, cores)]
        for warning in warnings:
            print(f"packrat report: warning: {warning}", file=sys.stderr)
        written += [
            save(draw_heatmap(profile, name), out / HEATMAP),
            save(draw_latency(profile, name), out / LATENCY),
            save(draw_plans(profile, cores, name, rows, bool(warnings)), out / PLANS),
        ]
    if reports is not None:
        plot_sweep(reports, out / LOAD, title=f"{Path(args.load).name}: latency against throughput")
        written.append(out / LOAD)
    for path in written:
        print(path)
    return 0


def read_profile(path: str, runtime: str | None) -> tuple[Profile, list[str]]:
    """The profile to draw and what to warn about it: a CSV as `packrat profile` writes it, or a daemon's state
    file (`learned-profile.json`: the served candidate's cells, or --runtime's, e.g. openvino or openvino/bf16)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read {path}: {getattr(exc, 'strerror', None) or exc}") from None
    if not text.lstrip().startswith("{"):
        return Profile.parse_csv(text, source=path, runtime=runtime), []
    from packrat_daemon.ops.state_document import Entry
    from packrat_daemon.ops.state_files import StateError

    try:
        data = json.loads(text)
        entries = data["entries"]
        key = runtime or (data.get("served") or {}).get("key") or next(iter(entries), None)
        if key not in entries:
            raise ConfigError(f"{path} holds no profile of {key!r}; it has {', '.join(sorted(entries)) or 'none'}: "
                              "name one with --runtime")  # fmt: skip
        entry = Entry.from_json(entries[key])
    except (ValueError, KeyError, TypeError, AttributeError, StateError) as exc:
        raise ConfigError(
            f"{path} is neither a profile CSV nor a daemon's state file that can be read ({exc}); give a CSV with "
            "the header threads,batch,latency_ms or a learned-profile.json"
        ) from None
    contention = getattr(entry, "contention", None)
    notes = [f"{key}'s profile was {contention.describe()}"] if contention is not None and contention.contended else []
    return entry.profile, notes


def implausible(profile: Profile, rows: list[dict[str, Any]], cores: int) -> list[str]:
    """What in the profile says it was measured under load, not on a quiet machine. A split of `cores` cores
    beats one instance on all of them by more than `cores` times only when that instance is slower than one
    thread alone: more threads slowing a batch down is what other work on the cores does (a multi-threaded step
    waits for its slowest thread), so both are said, with the batch sizes."""
    said = []
    beyond = [row for row in rows if row["speedup"] is not None and row["speedup"] > cores]
    if beyond:
        listed = ", ".join(f"{row['speedup']:.1f}× at batch {row['batch']}" for row in beyond)
        said.append(
            f"predicted speed-up(s) {listed} exceed the {cores} cores planned for: one instance on every core would "
            "have to be slower than on one core, so the profile was likely measured while other work ran on its "
            "cores; measure it again on a quiet machine before trusting these bars"
        )
    slower = [b for b in profile.batches() if (1, b) in profile and (cores, b) in profile
              and profile.latency(cores, b) > profile.latency(1, b)]  # fmt: skip
    if slower and cores > 1:
        said.append(
            f"at batch size(s) {', '.join(map(str, slower))} the profile has {cores} threads slower than 1: a sign "
            "of other work on the cores while it was measured"
        )
    return said


def read_load(path: str) -> list[dict[str, Any]]:
    """The reports of `packrat load --json`: a sweep's list, or the one report of a single rate."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror or exc}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{path} is not JSON ({exc}); give the output of packrat load --json") from None
    reports = data.get("sweep", [data]) if isinstance(data, dict) else None
    if not reports or not all(isinstance(r, dict) and {"throughput_rps", "latency_ms"} <= r.keys() for r in reports):
        raise ConfigError(f"{path} is not the output of packrat load --json (no throughput_rps and latency_ms)")
    return reports


def title(axes: Any, text: str, width_in: float, fontsize: int = 10) -> None:
    """`text` as the axes' title, wrapped to the figure's width (a long file name would be cut off otherwise)."""
    import textwrap

    per_line = max(20, int(width_in * 72 / (fontsize * 0.62)))  # a character is about 0.6 em wide
    axes.set_title("\n".join(textwrap.wrap(text, per_line)), fontsize=fontsize)


def save(figure: Any, path: Path) -> Path:
    try:
        figure.savefig(path, dpi=120)
    except OSError as exc:
        raise ConfigError(f"cannot write {path}: {exc.strerror or exc}") from None
    return path


def draw_heatmap(profile: Profile, name: str) -> Any:
    """Latency per cell, threads down and batch sizes across; the colour on a log scale, the value written."""
    from matplotlib.colors import LogNorm
    from matplotlib.figure import Figure

    threads, batches = profile.threads(), profile.batches()
    grid = [[profile.latency(t, b) if (t, b) in profile else math.nan for b in batches] for t in threads]
    width, height = min(16.0, max(5.0, 0.7 * len(batches) + 2.5)), min(10.0, max(3.5, 0.4 * len(threads) + 1.5))
    figure = Figure(figsize=(width, height), layout="constrained")
    axes = figure.subplots()
    values = [v for row in grid for v in row if not math.isnan(v)]
    image = axes.imshow(grid, aspect="auto", cmap="viridis", norm=LogNorm(min(values), max(values)))
    axes.set_xticks(range(len(batches)), [str(b) for b in batches])
    axes.set_yticks(range(len(threads)), [str(t) for t in threads])
    axes.set_xlabel("batch size")
    axes.set_ylabel("threads")
    if len(batches) * len(threads) <= 400:  # beyond that the numbers would not fit their cells
        middle = math.sqrt(min(values) * max(values))
        for y, row in enumerate(grid):
            for x, value in enumerate(row):
                if not math.isnan(value):
                    colour = "white" if value < middle else "black"
                    axes.text(x, y, f"{value:.3g}", ha="center", va="center", fontsize=7, color=colour)
    figure.colorbar(image, ax=axes, label="latency (ms)")
    title(axes, f"{name}: latency per ⟨threads, batch⟩ cell", width * 0.85)  # the colour bar takes the rest
    return figure


def draw_latency(profile: Profile, name: str) -> Any:
    """Latency against threads, one line per batch size: where adding threads stops paying."""
    from matplotlib import colormaps
    from matplotlib.figure import Figure

    every = profile.batches()
    # More than a dozen lines cannot be told apart: the powers of two, and the largest batch.
    shown = every if len(every) <= MAX_LINES else [b for b in every if b & (b - 1) == 0 or b == every[-1]]
    figure = Figure(figsize=(8, 4.5), layout="constrained")
    axes = figure.subplots()
    colours = colormaps["viridis"]
    for k, batch in enumerate(shown):
        points = [(t, profile.latency(t, batch)) for t in profile.threads() if (t, batch) in profile]
        colour = colours(k / max(1, len(shown) - 1))
        axes.plot(*zip(*points, strict=True), "o-", markersize=3, color=colour, label=f"batch {batch}")
    axes.set_xticks(profile.threads())  # whole threads only: never 1.2, 1.4 ...
    axes.set_xlabel("threads")
    axes.set_ylabel("latency (ms)")
    axes.set_yscale("log")
    axes.grid(alpha=0.3, which="both")
    axes.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    subset = "" if shown == every else f" ({len(shown)} of {len(every)})"
    title(axes, f"{name}: latency against threads, per batch size{subset}", 8 * 0.8)  # the legend takes a fifth
    return figure


def plan_rows(profile: Profile, cores: int) -> list[dict[str, Any]]:
    """Per batch size of the profile: the packrat policy's plan and its predicted speed-up over `single`'s."""
    from packrat_daemon.commands.solve import solve_plans

    topology = Topology.synthetic(cores)
    batches = profile.batches()
    packrat = solve_plans(profile, topology, batches, "packrat")
    single = solve_plans(profile, topology, batches, "single")
    rows = []
    for ours, theirs in zip(packrat, single, strict=True):
        speedup = None
        if ours["latency_ms"] and theirs["latency_ms"]:
            speedup = theirs["latency_ms"] / ours["latency_ms"]
        threads = [i["threads"] for i in ours["instances"]]
        layout = " + ".join(f"{n}×{t}" if n > 1 else str(t) for t, n in Counter(threads).items())
        rows.append({"batch": ours["batch"], "layout": layout, "speedup": speedup})
    return rows


def check_predicted(rows: list[dict[str, Any]], profile: Profile, cores: int, name: str) -> None:
    """ConfigError when no batch size has a speed-up to draw; a warning naming those without one otherwise.

    The speed-up is over `single`, one instance of `cores` threads: a profile without `cores`-thread cells has
    nothing to compare with (`--cores 16` on a profile measured with up to 2 threads)."""
    missing = [row["batch"] for row in rows if row["speedup"] is None]
    if not missing:
        return
    largest = max(profile.threads())
    why = (
        f"{name}'s largest thread count is {largest}, so it has no {cores}-thread cells for `single`, the one "
        f"instance on every core that the speed-up is over"
        if cores > largest
        else f"{name} has no {cores}-thread cell for `single` (or no plan) at batch size(s) "
        f"{', '.join(map(str, missing))}"
    )
    if len(missing) == len(rows):
        raise ConfigError(
            f"no plan's speed-up can be drawn for {cores} cores: {why}; give --cores {largest} or fewer, or a "
            f"profile measured with up to {cores} threads"
        )
    print(f"packrat report: warning: {why}; those bars are drawn empty", file=sys.stderr)


def draw_plans(
    profile: Profile, cores: int, name: str, rows: list[dict[str, Any]] | None = None, doubtful: bool = False
) -> Any:
    """For each batch size: the packrat plan's predicted speed-up over one instance on every core, each
    bar labelled with its layout ("2×6 + 4": two 6-thread instances and a 4-thread one). `doubtful`: the
    profile looks measured under load (`implausible`), said in the title."""
    from matplotlib.figure import Figure

    rows = plan_rows(profile, cores) if rows is None else rows
    width = min(16.0, max(6.0, 0.6 * len(rows) + 2))
    figure = Figure(figsize=(width, 5.0 if doubtful else 4.5), layout="constrained")  # a line more of title
    axes = figure.subplots()
    positions = range(len(rows))
    heights = [row["speedup"] or 0.0 for row in rows]
    bars = axes.bar(positions, heights, color=["tab:green" if h > 1.0 else "tab:gray" for h in heights])
    for bar, row in zip(bars, rows, strict=True):
        label = row["layout"] if row["speedup"] else f"{row['layout']} (no prediction)"
        axes.annotate(label, (bar.get_x() + bar.get_width() / 2, bar.get_height()), textcoords="offset points",
                      xytext=(0, 3), ha="center", fontsize=7, rotation=90 if len(label) > 5 else 0)  # fmt: skip
    axes.axhline(1.0, color="black", linewidth=0.8)
    axes.set_xticks(list(positions), [str(row["batch"]) for row in rows])
    axes.set_xlabel("batch size")
    axes.set_ylabel("predicted speed-up over single")
    axes.set_ylim(0, max(heights + [1.0]) * 1.25)
    warning = " — WARNING: the profile looks measured under load (warnings printed)" if doubtful else ""
    title(axes, f"{name}: packrat's plan per batch size on {cores} cores (labels: instances × threads){warning}", width)
    return figure
