"""`packrat oip`: the Open Inference Protocol (KServe v2) gateway, REST and gRPC, in front of a running daemon.

`packrat serve --http-port P --grpc-port Q` starts the same gateway beside the daemon by itself; this command is
for a gateway of its own (another container, another user, CURVE towards the daemon). Never imports torch.
"""

from __future__ import annotations

import argparse

from packrat_daemon.commands.options import add_command
from packrat_daemon.config import BY_NAME


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    summary = "serve the Open Inference Protocol (KServe v2, REST and gRPC) in front of a running daemon"
    parser = add_command(subparsers, "oip", summary, "Triton's and KServe's clients and tools then work; docs/oip.md.")
    endpoint = BY_NAME["endpoint"].default
    parser.add_argument(
        "--connect", "--endpoint", dest="endpoint", default=endpoint,
        help=f"the daemon's ZeroMQ endpoint (default {endpoint})",
    )  # fmt: skip
    parser.add_argument("--http-port", type=int, default=0, help="serve REST on this port (0: off, the default)")
    parser.add_argument("--grpc-port", type=int, default=0, help="serve gRPC on this port (0: off, the default)")
    parser.add_argument("--address", default="127.0.0.1", help="where to bind (default 127.0.0.1)")
    parser.add_argument("--model-name", help="the name the model is served as (default: from its spec)")
    parser.add_argument("--tls-cert", help="PEM certificate: serve both over TLS (needed beyond loopback)")
    parser.add_argument("--tls-key", help="PEM private key of --tls-cert")
    parser.add_argument(
        "--insecure-public", action="store_true",
        help="bind beyond loopback without TLS (refused otherwise): anyone who reaches it may use the model",
    )  # fmt: skip
    parser.add_argument(
        "--max-request-mb", type=int, default=64, help="gRPC: the largest message read, in MiB (default 64)"
    )
    parser.add_argument(
        "--timeout", type=float, default=60.0, help="seconds a request without a deadline may take (default 60)"
    )
    parser.add_argument(
        "--grpc-server", choices=("threads", "aio"), default="threads",
        help="gRPC on grpcio's threaded server, each thread with its own connection to the daemon (the default), "
        "or on grpc.aio in the gateway's event loop (docs/oip.md compares them)",
    )  # fmt: skip
    parser.add_argument(
        "--limit", action="append", default=[], metavar="NAME=VALUE",
        help="change one of REST's limits, e.g. max_connections=2000 or body_timeout_s=300 (repeatable; each "
        "limit, its default and its worst-case memory: docs/oip.md, Limits)",
    )  # fmt: skip
    parser.add_argument(
        "--metrics-port", type=int, default=0,
        help="serve the gateway's metrics at /metrics on this port too (0: off; with --http-port they are at its "
        "/metrics): for a gRPC-only gateway",
    )  # fmt: skip
    parser.add_argument("--key", help="a daemon serving CURVE: this gateway's .key_secret file (docs/security.md)")
    parser.add_argument("--server-key", help="a daemon serving CURVE: its public .key file")
    # Given by `packrat serve`, which started this gateway (launch.GatewayProcess): not for users.
    parser.add_argument("--status-fd", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--log-level", choices=("debug", "info", "warning", "error"), default="info")
    parser.add_argument("--log-format", choices=("text", "json"), default="text")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from packrat_daemon.ops.logs import setup_logging
    from packrat_daemon.protocol.gateway import GatewayOptions, run_gateway
    from packrat_daemon.protocol.limits import GatewayLimits

    setup_logging(args.log_level, args.log_format)
    options = GatewayOptions(
        connect=args.endpoint,
        http_port=args.http_port,
        grpc_port=args.grpc_port,
        address=args.address,
        model_name=args.model_name,
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
        insecure_public=args.insecure_public,
        max_request_mb=args.max_request_mb,
        timeout_s=args.timeout,
        key=args.key,
        server_key=args.server_key,
        grpc_server=args.grpc_server,
        status_fd=args.status_fd,
        metrics_port=args.metrics_port,
        limits=GatewayLimits().with_settings(args.limit),
    )
    return run_gateway(options)
