"""`packrat serve`: run the daemon for one model."""

from __future__ import annotations

import argparse
import copy
import logging

from packrat_daemon.commands.options import int_list, positive_int


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "serve",
        help="serve a model over ZeroMQ with a tuned pool of pinned workers",
        description="Serve a model over ZeroMQ; the pool of pinned workers follows the chosen policy.",
    )
    add_serve_options(parser)
    parser.set_defaults(run=run)


def add_serve_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="TOML file of these options (underscores for dashes); flags win")
    parser.add_argument("--model", default="builtin:resnet50", help="model spec (default: builtin:resnet50)")
    parser.add_argument("--input", help="input of a model file that does not declare it, e.g. float32:3x224x224")
    parser.add_argument("--endpoint", default="tcp://127.0.0.1:5555", help="where clients connect (tcp:// or ipc://)")
    parser.add_argument("--policy", default="packrat", help="packrat, single, torchserve or fixed (default: packrat)")
    parser.add_argument("--plan", help="the plan for --policy fixed, e.g. 2*1x8")
    parser.add_argument("--profile", help="latency profile CSV; without it, the needed cells are measured at start")
    parser.add_argument("--save-profile", help="write the profile measured at start to this CSV")
    parser.add_argument("--max-batch", type=positive_int, default=16, help="most inputs in one batch (default 16)")
    parser.add_argument("--max-delay-ms", type=float, default=1.0, help="longest wait to fill a batch (default 1)")
    parser.add_argument("--max-queue", type=positive_int, default=1024, help="inputs that may wait (default 1024)")
    parser.add_argument("--batches", type=int_list, help="batch sizes to plan for (default: --max-batch)")
    parser.add_argument(
        "--min-split-gain",
        type=float,
        default=0.05,
        help="packrat policy: serve several instances only if predicted this much faster than one (default 0.05)",
    )
    parser.add_argument(
        "--split-check-rounds",
        type=int,
        default=5,
        help="packrat policy: at start, run each split the plan makes against one instance this many "
        "interleaved rounds and plan on what was measured (default 5; 0: off)",
    )
    parser.add_argument(
        "--allocator", default="system", choices=["system", "jemalloc", "tcmalloc"], help="malloc to preload"
    )
    parser.add_argument(
        "--runtime",
        default="torch",
        help="torch, onnxruntime, openvino, or auto: measure each installed one, serve the fastest (default: torch)",
    )
    parser.add_argument("--run-dir", help="folder for the internal ipc sockets (default: a private temp folder)")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    parser.add_argument(
        "--metrics-port", type=int, default=0, help="serve Prometheus metrics on this port (default 0: off)"
    )
    parser.add_argument("--metrics-address", default="127.0.0.1", help="metrics address (default: loopback only)")
    parser.add_argument("--no-adapt", dest="adapt", action="store_false", help="never re-plan for the live batch sizes")
    parser.add_argument("--adapt-interval-s", type=float, default=5.0, help="how often to look at them (default 5)")
    parser.add_argument(
        "--adapt-min-batches", type=positive_int, default=50, help="batches seen before re-planning (default 50)"
    )
    parser.add_argument("--adapt-cooldown-s", type=float, default=30.0, help="least time between re-plans (default 30)")
    parser.add_argument(
        "--adapt-min-gain", type=float, default=0.05, help="predicted gain needed to re-plan (default 0.05)"
    )


def config_from(args: argparse.Namespace):  # noqa: ANN201
    from packrat_daemon.config import ServeConfig

    return ServeConfig(
        model=args.model, input=args.input, endpoint=args.endpoint, policy=args.policy, plan=args.plan,
        profile=args.profile, save_profile=args.save_profile, max_batch=args.max_batch,
        max_delay_ms=args.max_delay_ms, max_queue=args.max_queue, allocator=args.allocator,
        runtime=args.runtime, run_dir=args.run_dir, batches=args.batches or [],
        min_split_gain=args.min_split_gain, split_check_rounds=args.split_check_rounds, adapt=args.adapt,
        adapt_interval_s=args.adapt_interval_s, adapt_min_batches=args.adapt_min_batches,
        adapt_cooldown_s=args.adapt_cooldown_s, adapt_min_gain=args.adapt_min_gain,
        metrics_port=args.metrics_port, metrics_address=args.metrics_address,
    )  # fmt: skip


def setup_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper()),
        format="%(asctime)s packrat[%(process)d] %(levelname)s %(name)s: %(message)s",
    )


def apply_config_file(args: argparse.Namespace, defaults: dict[str, object]) -> None:
    """Fill options the command line left at their defaults from the TOML file given by --config."""
    import tomllib

    from packrat_daemon.wire.errors import ConfigError

    try:
        with open(args.config, "rb") as handle:
            values = tomllib.load(handle)
    except FileNotFoundError:
        raise ConfigError(f"config file {args.config} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {args.config} is not valid TOML: {exc}") from None
    explicit = _typed_flags(getattr(args, "argv", None))
    for key, value in values.items():
        if key not in defaults or key in ("config", "run", "command"):
            known = ", ".join(sorted(k for k in defaults if k not in ("config", "run", "command")))
            raise ConfigError(f"{args.config}: unknown option {key!r}; known options: {known}")
        if key == "batches" and isinstance(value, str):
            value = int_list(value)
        if key not in explicit:
            setattr(args, key, value)


def run(args: argparse.Namespace) -> int:
    from packrat_daemon.daemon import serve

    defaults = {action.dest: action.default for action in _serve_parser()._actions}
    pristine = copy.copy(args)

    def reload_config():  # noqa: ANN202 - SIGHUP: the same command line over the file as it is now
        fresh = copy.copy(pristine)
        if fresh.config:
            apply_config_file(fresh, defaults)
        return config_from(fresh)

    if args.config:
        apply_config_file(args, defaults)
    setup_logging(args.log_level)
    return serve(config_from(args), reload_config)


def _typed_flags(argv: list[str] | None) -> set[str]:
    """The options given on the command line (they win over the config file)."""
    if argv is None:
        return set()
    parser = argparse.ArgumentParser(add_help=False)
    add_serve_options(parser)
    for action in parser._actions:
        action.default = argparse.SUPPRESS  # only what was typed lands in the namespace
    known, _ = parser.parse_known_args([a for a in argv if a != "serve"])
    return set(vars(known))


def _serve_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(add_help=False)
    add_serve_options(parser)
    return parser
