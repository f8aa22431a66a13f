"""`packrat serve`: run the daemon for one model, configured by flags and an optional TOML file."""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable

from packrat_daemon.commands.options import add_settings, typed_settings
from packrat_daemon.config import ServeConfig, load_config
from packrat_daemon.ops.logs import setup_logging
from workers.models.folder import resolve_model


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    summary = "serve a model over ZeroMQ with a tuned pool of pinned workers"
    details = "The pool of pinned workers follows the chosen policy. Every setting is in docs/configuration.md."
    parser = subparsers.add_parser("serve", help=summary, description=f"{summary[0].upper()}{summary[1:]}. {details}")
    parser.add_argument(
        "--config", help="TOML file of these settings (underscores for dashes); flags typed here win over it"
    )
    add_settings(parser, typed_only=True)
    parser.set_defaults(run=run)


def config_loader(args: argparse.Namespace) -> Callable[[], ServeConfig]:
    """The flags typed over the config file as it is at each call: at start, and again on SIGHUP. A model
    folder is served as the one model in it (`workers.models.folder`): KServe's /mnt/models."""
    flags = typed_settings(args)

    def load() -> ServeConfig:
        config = load_config(flags, args.config)
        return dataclasses.replace(config, model=resolve_model(config.model))

    return load


def run(args: argparse.Namespace) -> int:
    from packrat_daemon.repository.daemons import follow_parent
    from packrat_daemon.service import serve

    follow_parent()  # a model daemon of a repository ends with it
    flags = typed_settings(args)
    if flags.get("repository") or (args.config and load_config(flags, args.config).repository):
        # Every model of a repository, one daemon each, behind one gateway (docs/repository.md).
        from packrat_daemon.repository.server import serve_repository

        config = load_config(flags, args.config)
        setup_logging(config.log_level, config.log_format)
        return serve_repository(config, flags)
    load = config_loader(args)
    config = load()
    setup_logging(config.log_level, config.log_format)
    return serve(config, load)
