"""The command-line side of the settings table (packrat_daemon.config), and option types for every command."""

from __future__ import annotations

import argparse
import copy
from collections.abc import Callable, Iterable
from typing import Any

from packrat_daemon.config import BY_NAME, SETTINGS
from packrat_daemon.settings import POSITIVE_INT, SIZES, SWITCH, Kind


def argument_type(kind: Kind) -> Callable[[str], Any]:
    """An argparse `type` that checks a flag's text against `kind` and says what is allowed."""

    def parse(text: str) -> Any:
        try:
            return kind.parse_text(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return parse


int_list = argument_type(SIZES)  # '1,2,4' or '1-4' or '1,2,8-16' → sorted unique positive ints
positive_int = argument_type(POSITIVE_INT)


def add_settings(
    parser: argparse.ArgumentParser, names: Iterable[str] | None = None, *, typed_only: bool = False
) -> None:
    """Add the flags of the named settings (default: every one) to `parser`, as the table declares them.

    typed_only: a setting whose flag was not typed stays out of the parsed namespace, so that a config
    file can fill it and the flags typed still win (see `typed_settings`).
    """
    for setting in SETTINGS if names is None else [BY_NAME[name] for name in names]:
        default = argparse.SUPPRESS if typed_only else copy.copy(setting.default)
        help_text = setting.describe().replace("%", "%%")  # argparse %-formats help
        if setting.kind is SWITCH:
            action = "store_false" if setting.default else "store_true"
            switch_help = f"turn this off: {help_text}" if setting.default else help_text
            parser.add_argument(setting.flag, dest=setting.name, action=action, default=default, help=switch_help)
        else:
            parser.add_argument(
                setting.flag,
                dest=setting.name,
                type=argument_type(setting.kind),
                choices=setting.kind.choices,
                default=default,
                help=help_text,
            )


def add_command(
    subparsers: argparse._SubParsersAction, name: str, summary: str, details: str
) -> argparse.ArgumentParser:
    """A command's parser: `summary` is its line in `packrat --help`, and `packrat NAME --help` says it again,
    as a sentence, before `details`."""
    return subparsers.add_parser(name, help=summary, description=f"{summary[0].upper()}{summary[1:]}. {details}")


def add_client_options(parser: argparse.ArgumentParser) -> None:
    """The flags of a command that talks to a running daemon: where it serves, and its CURVE keys."""
    endpoint = BY_NAME["endpoint"].default
    parser.add_argument("--endpoint", default=endpoint, help=f"the daemon's endpoint (default {endpoint})")
    parser.add_argument("--key", help="a daemon serving CURVE: this client's .key_secret file (docs/security.md)")
    parser.add_argument("--server-key", help="a daemon serving CURVE: its public .key file")


def typed_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The settings whose flags were typed, from a namespace parsed with add_settings(typed_only=True)."""
    return {name: value for name, value in vars(args).items() if name in BY_NAME}


def add_poisson_count(group: Any) -> None:
    """--poisson-count, as `packrat load` and `packrat simulate` both take it (a parser or an argument group)."""
    group.add_argument(
        "--poisson-count", choices=("fixed", "drawn"), default="fixed",
        help="with --rate and --duration: fixed (default) sends exactly rate × duration requests at Poisson "
        "times; drawn lets the count vary as a Poisson process's does (docs/load.md)",
    )  # fmt: skip
