"""`packrat reconfigure`: change a running daemon's plan through its control socket (docs/status.md).

Never through the serving endpoint: the control socket is an ipc socket in the daemon's private run dir
(or tcp on loopback), so only the daemon's own user on its own machine can change the pool.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from packrat_daemon.commands.options import add_command


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    summary = "change a running daemon's plan: a fixed plan, another policy, or back to automatic"
    details = "Through its control socket; it answers once the new pool serves. SIGHUP restores the configured policy."
    parser = add_command(subparsers, "reconfigure", summary, details)
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--control", help="the daemon's control endpoint (its log names it at start)")
    where.add_argument("--run-dir", help="the daemon's --run-dir: its control socket is RUN_DIR/control.ipc")
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--plan", help="a fixed plan in the fixed policy's syntax, e.g. 2*1x8 or 2x8")
    what.add_argument("--policy", help="plan with this policy (packrat, single, torchserve, …) on the live batch sizes")
    what.add_argument("--auto", action="store_true", help="back to the configured policy, with adaptation")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for the answer (default 60)")
    parser.add_argument("--json", action="store_true", help="print the daemon's answer as JSON")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from packrat_daemon.control.server import control_endpoint, request

    endpoint = control_endpoint(args.control, args.run_dir or ".")
    body: dict[str, Any] = {"op": "reconfigure"}
    if args.auto:
        body["auto"] = True
    elif args.plan is not None:
        body["plan"] = args.plan
    else:
        body["policy"] = args.policy
    reply = request(endpoint, body, args.timeout)
    print(json.dumps(reply, indent=2) if args.json else reply["done"])
    return 0
