"""`packrat keygen`: a CURVE key pair for a daemon or a client (docs/security.md). Never imports torch."""

from __future__ import annotations

import argparse

from packrat_daemon.wire.curve import PUBLIC_SUFFIX, load_public_key, write_key_pair


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "keygen",
        help="write a CURVE key pair for a daemon (--server-key) or a client",
        description=f"Write NAME{PUBLIC_SUFFIX} (the public key, to share) and NAME.key_secret (the key pair, "
        "mode 0600, to keep private). Existing files are never overwritten. See docs/security.md.",
    )
    parser.add_argument("name", help="the keys' file name without suffix, e.g. server or client-alice")
    parser.add_argument("--dir", default=".", help="folder to write them in (default: the current one)")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    public_path, secret_path = write_key_pair(args.dir, args.name)
    print(f"public key {load_public_key(public_path).decode()}")
    print(f"  {public_path}: share it; a daemon lists a client by copying this file into its --allowed-clients")
    print("    folder, and a client names a daemon's with server_key=")
    print(f"  {secret_path}: keep it private; a daemon takes it as --server-key, a client as key=")
    return 0
