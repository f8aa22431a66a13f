"""`packrat load`: traffic against a running daemon, and its latency and throughput.

    packrat load --rate 200 --batches 1:0.5,8:0.3,32:0.2 --duration 60      # open loop, Poisson
    packrat load --concurrency 4 --batch 8 --requests 2000                  # closed loop
    packrat load --sweep 50,100,200,400 --duration 20 --plot curve.png      # a latency–throughput curve
    packrat load --rate 20 --lengths lognormal:median=12,p99=64,max=128     # text: a length per request

Every model: each input generated from `info`'s declaration and sent by name (packrat_daemon/load/inputs.py). A
run in which no request was answered exits 1, with the server's messages. Never imports torch. It targets the
daemon's default endpoint on loopback and warns when told to send elsewhere, since a network then adds its own
latency to every figure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from packrat_daemon.commands.options import add_client_options, add_command, add_poisson_count, positive_int
from packrat_daemon.load.arrivals import ArrivalProcess, BatchMix, Burst, Poisson, Trace
from packrat_daemon.load.lengths import parse_lengths
from packrat_daemon.wire.errors import ConfigError

if TYPE_CHECKING:  # the generator imports numpy and the client: only when a run starts
    from packrat_daemon.load.generator import LoadSpec
    from packrat_daemon.load.report import Tally

DEFAULT_DURATION_S = 10.0
# The daemon's description is asked first, with its own timeout: a short --timeout is for the requests.
INFO_TIMEOUT_S = 10.0
# What the JSON carries of the daemon's `info`: enough to tell which server and plan a result belongs to.
# An emulating daemon's `emulation` is always carried, and a run against one is labelled `emulated`: its
# latencies are a profile's, not this machine's.
SERVER_KEYS = ("model", "runtime", "max_batch", "plan", "emulation")


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


def _seconds_or_zero(text: str) -> float:
    return 0.0 if text.strip() in ("0", "0.0") else _positive_float(text)


def _typed(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """An argparse `type` from a parser that raises ConfigError: argparse then prints its message."""

    def wrapped(text: str) -> Any:
        try:
            return parse(text)
        except ConfigError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return wrapped


def _rates(text: str) -> list[float]:
    return [_positive_float(item) for item in text.split(",")]


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    summary = "send traffic to a running daemon and report its latency and throughput"
    parser = add_command(
        subparsers, "load", summary, "Open loop (Poisson, bursty, a trace) or closed loop; docs/load.md."
    )
    add_client_options(parser)
    traffic = parser.add_mutually_exclusive_group()
    traffic.add_argument("--rate", type=_positive_float, help="open loop: Poisson arrivals at R requests/s")
    traffic.add_argument(
        "--burst", type=_typed(Burst.parse), metavar="ON_S:OFF_S:RATE", help="open loop, on/off bursts"
    )
    traffic.add_argument(
        "--trace", type=_typed(Trace.read), metavar="F.csv", help="open loop: replay a t_s,samples CSV"
    )
    traffic.add_argument(
        "--concurrency", type=positive_int, help="closed loop: N clients, each waits for its reply (default 1)"
    )
    sizes = parser.add_mutually_exclusive_group()
    sizes.add_argument("--batch", type=positive_int, help="samples per request (default 1)")
    sizes.add_argument(
        "--batches", type=_typed(BatchMix.parse), metavar="B:W,…", help="weighted sizes, e.g. 1:0.5,8:0.5"
    )
    parser.add_argument(
        "--lengths", type=_typed(parse_lengths), metavar="DIST",
        help="tokens per request, drawn per request: fixed:N, uniform:LO..HI, lognormal:median=M,p99=P,max=X, or "
        "file:PATH (one length a line); a fixed-length model gets each request padded, its mask marking the tokens",
    )  # fmt: skip
    parser.add_argument(
        "--duration",
        type=_positive_float,
        help=f"seconds of traffic (default {DEFAULT_DURATION_S:g} without --requests)",
    )
    parser.add_argument("--requests", type=positive_int, help="requests to send (with --duration: whichever first)")
    add_poisson_count(parser)
    parser.add_argument("--warmup", type=_seconds_or_zero, default=1.0, help="seconds of uncounted warm-up (default 1)")
    parser.add_argument("--timeout", type=_positive_float, default=30.0, help="seconds per request (default 30)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the arrivals and sizes (default 0)")
    parser.add_argument("--sweep", type=_rates, metavar="R1,R2,…", help="one run per rate: a latency–throughput curve")
    parser.add_argument("--plot", metavar="FILE.png", help="draw the sweep (needs matplotlib: .[plot])")
    parser.add_argument(
        "--save-trace", metavar="F.csv",
        help="write the requests as they left (t_s,samples, the format --trace reads): what the daemon was sent, "
        "late sends included, for packrat simulate --trace",
    )  # fmt: skip
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--quiet", action="store_true", help="no progress line on stderr")
    parser.set_defaults(run=run)


def _process(args: argparse.Namespace) -> ArrivalProcess | None:
    if args.rate is not None:
        return Poisson(args.rate, args.poisson_count == "fixed")
    return args.burst or args.trace


def _sweep_process(args: argparse.Namespace, rate: float) -> ArrivalProcess:
    """A sweep varies the rate of a Poisson process, or the on-phase rate of bursts."""
    if args.burst is not None:
        return replace(args.burst, rate_rps=rate)
    return Poisson(rate, args.poisson_count == "fixed")


def _mix(args: argparse.Namespace) -> BatchMix:
    """The sizes to send; a trace's own, so that the warm-up and the inputs cover each of them."""
    if args.trace is None:
        return args.batches or BatchMix.single(args.batch or 1)
    if args.batch is not None or args.batches is not None:
        raise ConfigError("a trace carries its own sizes (its samples column): drop --batch/--batches")
    sizes = sorted({samples for _, samples in args.trace.rows})
    return BatchMix(tuple(sizes), (1.0,) * len(sizes))


def _check(args: argparse.Namespace) -> None:
    if args.sweep and (args.trace is not None or args.concurrency is not None or args.rate is not None):
        raise ConfigError(
            "--sweep gives the rates itself: use it alone or with --burst, not with --rate/--trace/--concurrency"
        )
    if (args.key is None) != (args.server_key is None):
        raise ConfigError(
            "CURVE needs both --key (this client's .key_secret file) and --server-key (the server's .key)"
        )
    if args.plot and not args.sweep:
        raise ConfigError("--plot draws a --sweep; add --sweep R1,R2,…")
    if args.save_trace and args.sweep:
        raise ConfigError("--save-trace writes one run's requests; a --sweep makes several: run each rate alone")
    if args.save_trace and not Path(args.save_trace).resolve().parent.is_dir():
        raise ConfigError(f"--save-trace {args.save_trace}: its folder does not exist")
    if args.plot:
        from packrat_daemon.load.plot import check_plotting

        check_plotting()


async def _serve_load(args: argparse.Namespace, specs: list[LoadSpec]) -> tuple[dict[str, Any], list[Tally]]:
    from packrat_daemon.load.generator import Generator, Inputs
    from packrat_daemon.wire.client import AsyncClient

    async with AsyncClient(args.endpoint, timeout=args.timeout, key=args.key, server_key=args.server_key) as client:
        info = await client.info(timeout=INFO_TIMEOUT_S)
        largest = max(spec.mix.largest for spec in specs)
        inputs = Inputs(info, largest, args.seed, args.lengths)
        if inputs.padded_to is not None and not args.quiet:
            print(
                f"packrat load: the model's inputs are {inputs.padded_to} tokens, fixed: each request is padded to "
                "them, its first tokens (its length) real and marked so by its mask",
                file=sys.stderr,
            )
        generator = Generator(client, inputs, progress=not args.quiet)
        if args.warmup > 0:
            warm = await generator.warm_up(specs[0], args.warmup)
            if warm.errors and not args.quiet:
                said = "".join(f"\n  {code}: {message}" for code, message in sorted(warm.messages.items()))
                print(f"packrat load: warm-up errors: {dict(warm.errors)}{said}", file=sys.stderr)
        tallies = []
        for spec in specs:
            tallies.append(await generator.run(spec))
            if tallies[-1].interrupted:
                break  # Ctrl-C: report what ran, skip the rest of a sweep
    info["sent_inputs"] = inputs.describe()
    return info, tallies


def run(args: argparse.Namespace) -> int:
    from packrat_daemon.load.generator import LoadSpec
    from packrat_daemon.load.report import format_report, format_sweep, summarize
    from packrat_daemon.wire.curve import is_local_endpoint

    _check(args)
    if not is_local_endpoint(args.endpoint):
        print(
            f"packrat load: warning: {args.endpoint} is not on this machine; the network's latency is in every figure",
            file=sys.stderr,
        )
    mix = _mix(args)
    duration = args.duration
    if duration is None and args.requests is None and args.trace is None:
        duration = DEFAULT_DURATION_S
    common = {
        "mix": mix,
        "duration_s": duration,
        "requests": args.requests,
        "timeout_s": args.timeout,
        "seed": args.seed,
    }
    if args.sweep:
        specs = [LoadSpec(process=_sweep_process(args, rate), **common) for rate in args.sweep]
    else:
        process = _process(args)
        specs = [LoadSpec(process=process, concurrency=args.concurrency or 1, **common)]
    info, tallies = asyncio.run(_serve_load(args, specs))
    server = {key: info[key] for key in SERVER_KEYS if key in info}
    reports = []
    for spec, tally in zip(specs, tallies, strict=False):  # fewer tallies when interrupted
        extra: dict[str, Any] = {
            "traffic": spec.describe(),
            "mode": "closed" if spec.process is None else "open",
            "endpoint": args.endpoint,
            "duration_s": duration,
            "requests": args.requests,
            "seed": args.seed,
            "warmup_s": args.warmup,
            "emulated": bool(info.get("emulation")),
            **info["sent_inputs"],
        }
        if spec.process is None:
            extra["concurrency"] = spec.concurrency
        else:
            rate = spec.process.mean_rate_rps
            extra["rate_rps"] = rate if math.isfinite(rate) else None  # a trace of one instant has no rate
        reports.append(summarize(tally, **extra, server=server))
    if args.plot:
        from packrat_daemon.load.plot import plot_sweep

        plot_sweep(reports, args.plot, title=f"{info.get('model', '')} at {args.endpoint}")
    if args.json:
        print(json.dumps({"sweep": reports} if args.sweep else reports[0], indent=2))
    elif args.sweep:
        print(format_sweep(reports))
    else:
        print(format_report(reports[0]))
    if args.save_trace and tallies[0].sends:  # after the report: a file that cannot be written loses nothing
        try:
            Trace(tuple(sorted(tallies[0].sends))).write(args.save_trace)
        except OSError as exc:
            raise ConfigError(f"cannot write the trace to {args.save_trace}: {exc.strerror}") from None
    if tallies[-1].interrupted:
        return 130  # the shell's status for an interrupted command
    return _none_answered(reports)


def _none_answered(reports: list[dict[str, Any]]) -> int:
    """1, saying why on stderr, when a run had no request answered (every one failed); else 0."""
    failed = [report for report in reports if report["sent"] and not report["ok"]]
    for report in failed:
        said = "; ".join(f"{code}: {message}" for code, message in (report.get("error_messages") or {}).items())
        rate = f" at {report['rate_rps']:g} req/s" if len(reports) > 1 and report.get("rate_rps") else ""
        print(
            f"packrat load: no request succeeded{rate}: {report['sent']} of {report['sent']} failed "
            f"({', '.join(f'{code} {n}' for code, n in report['errors'].items())}){'; ' + said if said else ''}",
            file=sys.stderr,
        )
    return 1 if failed else 0
