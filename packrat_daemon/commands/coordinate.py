"""`packrat coordinate`: share one machine's cores among several daemons, one per model (docs/colocation.md).

Each daemon is named and reached through its control socket (`--daemon NAME=ipc://RUN_DIR/control.ipc`, or
`NAME=RUN_DIR`). The coordinator divides its CPUs into contiguous runs of whole cores, tells each daemon its
share, and then every `--interval` plans the models jointly from their live demand and moves cores when the
move is predicted to cut the traffic-weighted mean latency by `--min-gain` or more. It holds a lock in each
daemon's run dir while it runs (`coordinator.lock`, `coordinate.lock`): a second coordinator on any of them
refuses to start, naming the first.
`--status` prints what the running coordinator last wrote to its status file.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import signal
from pathlib import Path
from typing import Any

from packrat_daemon.commands.options import add_command
from packrat_daemon.wire.errors import ConfigError

STATUS_FILE = "coordinator.json"


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    summary = "share one machine's cores among several daemons, one per model, moving cores as traffic moves"
    details = (
        "Each daemon keeps its own process (a crash stops one model only); the coordinator assigns each a disjoint "
        "CPU set through its control socket and moves cores with no failed request, shrinking before growing."
    )
    parser = add_command(subparsers, "coordinate", summary, details)
    parser.add_argument(
        "--daemon", action="append", default=[], metavar="NAME=CONTROL",
        help="a model's daemon: a name of your choice and its control socket (ipc://RUN_DIR/control.ipc) or its "
        "--run-dir; once per model, in the order their shares are laid out",
    )  # fmt: skip
    parser.add_argument("--cpus", help="the CPUs to share, a cpulist like 0-15 (default: every usable CPU)")
    parser.add_argument(
        "--emulate-cores", type=int,
        help="for daemons of --runtime emulated with this --emulate-cores: share T made-up cores (docs/emulation.md)",
    )  # fmt: skip
    parser.add_argument("--interval", type=float, default=0.5, help="seconds between two looks (default 0.5)")
    parser.add_argument(
        "--min-gain", type=float, default=0.1,
        help="move cores only for a predicted cut of the mean latency this large, a fraction (default 0.1)",
    )  # fmt: skip
    parser.add_argument(
        "--target", action="append", default=[], metavar="NAME=MS",
        help="a model's latency target in ms: the joint plan keeps it under its target before it minimises the mean",
    )  # fmt: skip
    parser.add_argument(
        "--timeout", type=float, default=120.0,
        help="seconds a daemon may take to switch to its new share before it counts as down (default 120)",
    )  # fmt: skip
    parser.add_argument(
        "--status-file",
        help=f"where to write the status (default $RUNTIME_DIRECTORY/{STATUS_FILE}, else ./{STATUS_FILE})",
    )
    parser.add_argument("--status", action="store_true", help="print the running coordinator's status and exit")
    parser.add_argument("--json", action="store_true", help="with --status: print the status file as it is")
    parser.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    parser.set_defaults(run=run)


def status_path(args: argparse.Namespace) -> Path:
    if args.status_file:
        return Path(args.status_file)
    folder = os.environ.get("RUNTIME_DIRECTORY", "").split(":")[0]  # systemd's RuntimeDirectory=
    return Path(folder or ".") / STATUS_FILE


def parse_daemons(flags: list[str]) -> list[tuple[str, str]]:
    """(name, control endpoint) per --daemon flag; ConfigError saying what to type."""
    from packrat_daemon.control.server import control_endpoint

    if not flags:
        raise ConfigError("give each model's daemon as --daemon NAME=CONTROL (its control socket or its --run-dir)")
    daemons: list[tuple[str, str]] = []
    for flag in flags:
        name, sep, where = flag.partition("=")
        if not sep or not name.strip() or not where.strip():
            raise ConfigError(
                f"--daemon {flag!r}: write NAME=CONTROL, e.g. resnet=ipc:///run/packrat/resnet/control.ipc or "
                "resnet=/run/packrat/resnet (the daemon's --run-dir)"
            )
        if any(name == seen for seen, _ in daemons):
            raise ConfigError(f"--daemon: the name {name!r} is given twice; give each model its own name")
        endpoint = where if "://" in where else None
        daemons.append((name, control_endpoint(endpoint, where)))
    return daemons


def parse_targets(flags: list[str], names: list[str]) -> dict[str, float]:
    targets: dict[str, float] = {}
    for flag in flags:
        name, _, text = flag.partition("=")
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if name not in names or not (value > 0 and math.isfinite(value)):
            raise ConfigError(
                f"--target {flag!r}: write NAME=MS with NAME one of {', '.join(names)} and MS a positive number"
            )
        targets[name] = value
    return targets


def check_numbers(args: argparse.Namespace) -> None:
    if not (args.interval > 0 and math.isfinite(args.interval)):
        raise ConfigError(f"--interval {args.interval}: give a number of seconds above 0, e.g. 0.5")
    if not 0 <= args.min_gain < 1:
        raise ConfigError(f"--min-gain {args.min_gain}: give a fraction from 0 up to (not including) 1, e.g. 0.1")
    if not (args.timeout > 0 and math.isfinite(args.timeout)):
        raise ConfigError(f"--timeout {args.timeout}: give a number of seconds above 0")


def run(args: argparse.Namespace) -> int:
    path = status_path(args)
    if args.status:
        return print_status(path, args.json)
    from packrat_daemon.coordinate.lock import coordinating

    daemons = parse_daemons(args.daemon)
    targets = parse_targets(args.target, [name for name, _ in daemons])
    check_numbers(args)
    if args.emulate_cores is not None and args.emulate_cores < 1:
        raise ConfigError(f"--emulate-cores {args.emulate_cores}: give a positive number of made-up cores")
    # Held until the coordinator has stopped and written its last status: a second coordinator on any of these
    # daemons refuses to start (exit 2, naming this one) instead of undoing this one's moves.
    with coordinating(daemons):
        return coordinate(args, daemons, targets, path)


def coordinate(args: argparse.Namespace, daemons: list[tuple[str, str]], targets: dict[str, float], path: Path) -> int:
    from packrat_daemon.coordinate.loop import Coordinator, Link
    from packrat_daemon.ops.logs import setup_logging
    from policies.planning.topology import Topology

    machine = Topology.synthetic(args.emulate_cores) if args.emulate_cores else Topology.detect()
    topology = machine.share(args.cpus)
    setup_logging(args.log_level)
    links = [Link(name, endpoint, targets.get(name)) for name, endpoint in daemons]
    coordinator = Coordinator(links, topology, args.interval, args.min_gain, args.timeout, path)
    stops: list[int] = []  # the handlers only note the signal; the loop looks between two steps

    def note(signum: int, _frame: Any) -> None:
        stops.append(signum)

    previous = {sig: signal.signal(sig, note) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        coordinator.run(lambda: bool(stops))
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    coordinator.write_status()
    if stops:  # said, as the daemon says its stop: a supervisor's log shows why the coordinator is gone
        logging.getLogger("packrat.coordinate").info(
            "%s received: stopped; each daemon keeps the CPUs it was given, the last status is in %s",
            signal.Signals(stops[0]).name, path,
        )  # fmt: skip
    return 0


def print_status(path: Path, raw: bool) -> int:
    try:
        status = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(
            f"no coordinator status at {path}: is `packrat coordinate` running with this --status-file?"
        ) from None
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read the coordinator's status {path}: {exc}") from None
    if raw:
        print(json.dumps(status, indent=2))
        return 0
    machine = status["machine"]
    print(f"machine: CPUs {machine['cpus']} ({machine['cores']} cores), {status['looks']} looks, "
          f"every {status['interval_s']:g} s")  # fmt: skip
    for model in status["models"]:
        rate = model.get("batches_per_s")
        traffic = "" if rate is None else f", {rate:.1f} batches/s"
        state = "up" if model["up"] else f"down ({model.get('error')})"
        print(f"  {model['name']}: CPUs {model['cpus']}, {state}{traffic}")
    if status.get("declined"):
        print(f"no move: {status['declined']}")
    for move in status["moves"][-5:]:
        gain = move.get("predicted_gain")
        said = "" if gain is None else f", predicted gain {gain:.1%}"
        print(f"move: {move['from']} → {move['to']}{said}")
    return 0
