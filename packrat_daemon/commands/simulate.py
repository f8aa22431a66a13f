"""`packrat simulate`: the daemon's batcher, splitter, policy and online adaptation on a virtual clock,
with the emulated workers' service times (L̂ × interference), for core counts this machine does not have. Never
imports torch. Prints `packrat load`'s report (a simulation, and labelled so) plus the plan changes."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from packrat_daemon.commands.options import add_poisson_count, add_settings, argument_type, positive_int
from packrat_daemon.config import BY_NAME, ServeConfig
from packrat_daemon.settings import SIZES
from packrat_daemon.wire.errors import ConfigError

# The serve settings that change what the simulated daemon does; the rest (sockets, workers, logging)
# have nothing to act on here.
SERVE_SETTINGS = [
    "policy", "plan", "min_split_gain", "max_batch", "max_delay_ms", "max_queue", "max_batch_tokens", "length_batching",
    "adapt", "adapt_interval_s", "adapt_min_batches", "adapt_cooldown_s", "adapt_min_gain",
]  # fmt: skip


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "simulate",
        help="simulate the daemon on a virtual clock for T cores (a simulation: labelled so in its output)",
        description=(
            "Run the daemon's own batcher, splitter, policy and online adaptation against a virtual clock, "
            "each batch taking the profile's L̂(threads, rows) times an interference factor. Hours of traffic "
            "on up to 128 cores take seconds; the same seed gives the same result."
        ),
    )
    parser.add_argument("--profile", required=True, help="profile CSV (header threads,batch,latency_ms)")
    parser.add_argument("--runtime", help="which runtime's rows to use when the profile holds several")
    # As serve --runtime emulated takes them; unset, the cores are the profile's most threads.
    add_settings(parser, ["emulate_cores", "emulate_interference"])
    parser.add_argument(
        "--model",
        help="with --emulate-interference auto: the model whose own slow-down side by side to measure on this "
        "machine (as serve's --model, e.g. builtin:bert-base; measured once, then cached)",
    )
    parser.add_argument("--input", help="with --model: its input, where the model does not declare it")
    add_settings(parser, SERVE_SETTINGS)
    # serve's --batches (the sizes the start-up plan is made for) under another flag: here --batches is
    # the traffic's mix, as packrat load spells it.
    parser.add_argument(
        "--plan-batches", dest="batches", type=argument_type(SIZES), default=[], help=BY_NAME["batches"].describe()
    )
    traffic = parser.add_argument_group("traffic (as packrat load sends it)")
    sender = traffic.add_mutually_exclusive_group(required=True)
    sender.add_argument("--rate", type=float, help="open-loop Poisson arrivals at this many requests per second")
    sender.add_argument("--burst", metavar="ON_S:OFF_S:RATE", help="on/off Poisson arrivals, e.g. 2:8:500")
    sender.add_argument("--trace", metavar="F.csv", help="replay arrivals from a CSV with columns t_s,samples")
    sender.add_argument("--concurrency", type=positive_int, help="closed loop: this many clients, one request each")
    sizes = traffic.add_mutually_exclusive_group()
    sizes.add_argument("--batch", type=positive_int, help="samples per request (default 1)")
    sizes.add_argument("--batches", dest="mix", metavar="B:W,…", help="weighted samples per request, e.g. 1:0.5,8:0.5")
    traffic.add_argument(
        "--lengths",
        metavar="DIST",
        help="each request's length along a free axis (tokens), as packrat load's --lengths, e.g. "
        "lognormal:median=12,p99=64,max=128: the model is then a masked text model of that longest, the profile "
        "measured there, each slice waiting the length rule (docs/design.md)",
    )
    traffic.add_argument("--duration", type=float, help="seconds of virtual time to send for")
    traffic.add_argument("--requests", type=positive_int, help="requests to send")
    add_poisson_count(traffic)
    traffic.add_argument("--seed", type=int, default=0, help="seed of the arrivals and sample counts (default 0)")
    costs = parser.add_argument_group(
        "the daemon's own costs in ms, 0 unless given (measured on a running daemon: docs/evaluation.md)"
    )
    costs.add_argument(
        "--transport-ms", type=_pair, default=(0.0, 0.0), metavar="FIXED[:PER_SAMPLE]",
        help="a request's trip from the client to the daemon and back",
    )  # fmt: skip
    costs.add_argument(
        "--read-ms", type=_pair, default=(0.0, 0.0), metavar="FIXED[:PER_SAMPLE]",
        help="the daemon's loop taking in one request (receive, parse, copy its rows)",
    )  # fmt: skip
    costs.add_argument("--dispatch-ms", type=float, default=0.0, help="the loop starting a batch (split, send)")
    costs.add_argument(
        "--answer-ms", type=_pair, default=(0.0, 0.0), metavar="FIXED[:PER_REQUEST]",
        help="the loop answering a batch once its last slice is back (gather, reply)",
    )  # fmt: skip
    costs.add_argument("--hop-ms", type=float, default=0.0, help="a slice's trip to its worker beyond its compute")
    costs.add_argument(
        "--switch-ms", type=float, default=0.0,
        help="the reconciler's time from a re-plan until the new plan serves (the old one serves meanwhile)",
    )  # fmt: skip
    parser.add_argument(
        "--uptime-s", type=float, default=0.0,
        help="how long the daemon has served when the traffic starts (its adaptation looks count from its start)",
    )  # fmt: skip
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.set_defaults(run=run)


def _pair(text: str) -> tuple[float, float]:
    first, _, second = text.partition(":")
    try:
        return float(first), float(second or 0.0)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected FIXED or FIXED:PER_UNIT in ms, e.g. 0.5:0.2; got {text!r}"
        ) from None


def costs_from(args: argparse.Namespace) -> Any:
    """The daemon's costs from the flags (DaemonCosts refuses a negative one)."""
    from packrat_daemon.simulate import DaemonCosts

    return DaemonCosts(args.transport_ms, args.read_ms, args.dispatch_ms, args.answer_ms, args.hop_ms, args.switch_ms)


def traffic_from(args: argparse.Namespace) -> Any:
    from packrat_daemon.load.arrivals import BatchMix, Burst, Poisson, Trace
    from packrat_daemon.load.lengths import parse_lengths
    from packrat_daemon.simulate import Traffic

    mix = BatchMix.parse(args.mix) if args.mix else BatchMix.single(args.batch or 1)
    if args.rate is not None:
        process: Any = Poisson(args.rate, args.poisson_count == "fixed")
    elif args.burst is not None:
        process = Burst.parse(args.burst)
    elif args.trace is not None:
        process = Trace.read(args.trace)
    else:
        process = None
    if args.duration is not None and not args.duration > 0:
        raise ConfigError(f"--duration must be a positive number of seconds, got {args.duration}")
    lengths = None if args.lengths is None else parse_lengths(args.lengths)
    return Traffic(mix, process, args.concurrency, args.duration, args.requests, args.seed, args.uptime_s, lengths)


def run(args: argparse.Namespace) -> int:
    from packrat_daemon.measure.emulation import Interference
    from packrat_daemon.simulate import Simulation
    from policies.planning.profile import Profile

    profile = Profile.read_csv(args.profile, runtime=args.runtime)
    cores = args.emulate_cores or max(profile.threads())
    interference = Interference.named(args.emulate_interference, args.model, args.input)
    config = ServeConfig(batches=args.batches, **{name: getattr(args, name) for name in SERVE_SETTINGS})
    traffic = traffic_from(args)
    started = time.monotonic()
    costs = costs_from(args)
    simulation = Simulation(config, profile, cores, interference, costs)
    report = simulation.run(traffic).to_json()
    report["traffic"] = traffic.describe()
    report["inputs"] = {
        "profile": args.profile, "cores": cores, "policy": args.policy, "seed": args.seed,
        "interference": interference.describe(), "costs": costs.to_json(), "uptime_s": args.uptime_s,
    }  # fmt: skip
    wall = time.monotonic() - started
    if args.json:
        print(json.dumps(report))
    else:
        _print_table(report)
    sys.stdout.flush()  # the report first, then the notes on stderr
    print(f"simulated {report['window_s']:.1f} s of traffic in {wall:.1f} s", file=sys.stderr)
    looks = simulation.adapt_wall_s
    if looks:  # the daemon's own planning cost, which the virtual clock does not advance for
        print(f"online adaptation looked {len(looks)} times: {max(looks) * 1000:.0f} ms of CPU at most, "
              f"{sum(looks) / len(looks) * 1000:.0f} ms on average (the real daemon's loop would spend it)",
              file=sys.stderr)  # fmt: skip
    return 0


def _print_table(report: dict[str, Any]) -> None:
    from packrat_daemon.load.report import format_report

    inputs = report["inputs"]
    print(f"SIMULATION (virtual clock, emulated service times): {inputs['policy']} on {inputs['cores']} cores, "
          f"interference {inputs['interference']}, seed {inputs['seed']}")  # fmt: skip
    print(format_report(report))
    print(f"batches: {report['batches']}, mean {report['mean_batch']} inputs; plan changes:")
    for change in report["plan_changes"]:
        print(f"  {change['t_s']:>10.3f} s  {change['reason']:<6} {change['plan']}")
