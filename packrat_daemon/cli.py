"""The `packrat` command line. One module per command under `packrat_daemon.commands`.

Commands import their heavy dependencies lazily, so `packrat solve` never imports torch.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from packrat_daemon import __version__
from packrat_daemon.wire.errors import PackratError

COMMANDS = ("solve", "profile", "serve", "demo", "simulate", "keygen", "load", "report", "status", "reconfigure", "oip")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="packrat",
        description="Serve a PyTorch model on a multi-core CPU at minimum latency.",
    )
    parser.add_argument("--version", action="version", version=f"packrat {__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMANDS:
        module = importlib.import_module(f"packrat_daemon.commands.{name}")
        module.add_parser(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.run(args) or 0)
    except PackratError as exc:
        print(f"packrat {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"packrat {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
