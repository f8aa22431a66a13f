"""The `packrat` command line. One module per command under `packrat_daemon.commands`.

Commands import their heavy dependencies lazily, so `packrat solve` never imports torch.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from packrat_daemon import __version__
from packrat_daemon.wire.errors import PackratError

COMMANDS = (
    "solve",
    "profile",
    "serve",
    "demo",
    "simulate",
    "keygen",
    "load",
    "report",
    "status",
    "reconfigure",
    "oip",
    "coordinate",
)


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


# What a shell reports for a process that SIGPIPE ended (128 + 13): `packrat status | head` stops reading early.
BROKEN_PIPE_EXIT = 141


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code = int(args.run(args) or 0)
        sys.stdout.flush()  # here, not at exit: a reader that went away is then seen below, not as a traceback
        return code
    except BrokenPipeError:
        # Python's advice (library/signal, "Note on SIGPIPE"): point stdout at /dev/null so that the flush at
        # exit does not fail again; the reader has what it wanted.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return BROKEN_PIPE_EXIT
    except PackratError as exc:
        print(f"packrat {args.command}: error: {exc}", file=sys.stderr)
        # 2: what cannot start (systemd's RestartPreventExitStatus=2); an error that says otherwise (a template
        # lost while serving, which a restart repairs) carries its own status.
        return int(getattr(exc, "exit_status", 2))
    except KeyboardInterrupt:
        print(f"packrat {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
