"""`packrat profile`: measure L(threads, batch) for a model on this machine and write the CSV."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from packrat_daemon.commands.options import add_command, add_settings, int_list, positive_int

if TYPE_CHECKING:
    from policies.planning.profile import Cell
    from policies.planning.topology import Topology


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    summary = "measure a latency profile (threads × batch) of a model on this machine"
    details = "Each cell runs in a pinned worker. A reduced precision is timed only: `serve` runs the accuracy guard."
    parser = add_command(subparsers, "profile", summary, details)
    add_settings(parser, ["model", "input", "runtime", "precision", "allocator"])  # as `serve` takes them
    # One runtime at fp32 unless asked: a profile is a table of one runtime's cells (serve's auto default measures
    # every candidate itself); --runtime auto --precision auto measures them all here too.
    parser.set_defaults(runtime="torch", precision="fp32")
    for action in parser._actions:  # the help says so, not serve's default
        if action.dest in ("runtime", "precision") and action.help:
            action.help = action.help.replace('(default: "auto")', f'(default here: "{action.default}")')
    parser.add_argument("--threads", type=int_list, help="thread counts (default: 1..usable cores)")
    parser.add_argument("--batches", type=int_list, default=[1, 2, 4, 8, 16], help="batch sizes (default 1,2,4,8,16)")
    parser.add_argument("--out", default="profile.csv", help="output CSV (default: profile.csv)")
    parser.add_argument("--warmup", type=int, default=1, help="warm-up runs per cell (default 1)")
    parser.add_argument("--repeats", type=positive_int, default=3, help="timed runs per cell (default 3)")
    parser.add_argument(
        "--isolated",
        action="store_true",
        help="measure each cell on one worker alone (default: side by side on every core, interference included)",
    )
    # Adaptive (Bayesian) profiling and replay: see docs/profiling.md.
    parser.add_argument("--adaptive", action="store_true", help="measure only the cells that matter (Bayesian)")
    parser.add_argument("--budget", default="0.25", help="adaptive budget: a fraction of the grid or SECONDSs")
    parser.add_argument("--replay", help="answer measurements from this full profile CSV instead of a model")
    parser.add_argument("--cores", type=positive_int, help="usable cores to plan for (default: detected)")
    parser.add_argument("--seed", type=int, default=0, help="random seed of the adaptive search")
    parser.add_argument("--noise", type=float, default=0.0, help="relative jitter added to replayed cells")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.adaptive or args.replay:
        from packrat_daemon.commands.adaptive_search import run_adaptive

        return run_adaptive(args)
    return run_grid(args)


def run_grid(args: argparse.Namespace) -> int:
    from packrat_daemon.startup import candidate_pairs
    from policies.planning.profile import Profile, profile_key, write_profiles
    from policies.planning.topology import Topology

    if args.cores:
        # The full grid measures this machine: planning for other cores is what the adaptive search does.
        print(
            "packrat profile: error: --cores plans the adaptive search (--adaptive or --replay); the full grid "
            "measures this machine's cores: choose them with --threads",
            file=sys.stderr,
        )
        return 2
    topology = Topology.detect()
    threads = args.threads or list(range(1, topology.usable_cores + 1))
    too_many = [t for t in threads if t > topology.usable_cores]
    if too_many:
        # Checked before anything loads: a pinned worker cannot get more cores than exist, and finding out
        # after the smaller cells were measured wastes their time.
        print(
            f"packrat profile: error: --threads {too_many} exceed the {topology.usable_cores} usable cores; "
            f"give at most {topology.usable_cores}",
            file=sys.stderr,
        )
        return 2
    cells = [(t, b) for t in threads for b in args.batches]
    profiles: list[Profile] = []
    stopped: str | None = None
    for runtime, precision in candidate_pairs(args.runtime, args.precision, model=args.model):
        measured, stopped = _measure_runtime(topology, args, runtime, precision, cells)
        if measured:
            profiles.append(Profile(measured, model=args.model, runtime=runtime, precision=precision))
        if stopped:
            break
    if profiles:
        write_profiles(args.out, profiles)
        counts = ", ".join(f"{len(p)} {profile_key(p.runtime, p.precision)}" for p in profiles)
        print(f"wrote {counts} cell(s) of {len(cells)} per runtime to {args.out}", file=sys.stderr)
    elif stopped:
        print(f"{stopped} before any cell was measured; nothing written", file=sys.stderr)
    # 130 is the shell's code for Ctrl-C; an ordinary error is 1.
    return {None: 0, "interrupted": 130}.get(stopped, 1)


def _measure_runtime(
    topology: Topology, args: argparse.Namespace, runtime: str, precision: str, cells: list[tuple[int, int]]
) -> tuple[dict[tuple[int, int], Cell], str | None]:
    """(cells measured, why it stopped early: "interrupted", "failed" or None): both keep what was measured."""
    from packrat_daemon.measure.bench import Bench, model_session
    from packrat_daemon.ops.progress import Progress
    from packrat_daemon.wire.errors import PackratError

    measured: dict[tuple[int, int], Cell] = {}
    progress = Progress(len(cells), f"profiling {runtime} at {precision}")
    try:
        progress.note(f"loading {args.model}")
        session = model_session(
            args.model, input_override=args.input, runtime=runtime, allocator=args.allocator, precision=precision
        )
        with session as (backend, info):
            bench = Bench(
                backend, topology, info, warmup=args.warmup, repeats=args.repeats, side_by_side=not args.isolated
            )
            try:
                bench.measure_cells(cells, measured, progress)
            finally:
                bench.close()
    except KeyboardInterrupt:
        return measured, "interrupted"
    except PackratError as exc:
        # A worker or the template died: keep what was measured, and say why the rest is missing.
        print(f"packrat profile: error: {exc}", file=sys.stderr)
        return measured, "failed"
    finally:
        progress.close()
    return measured, None
