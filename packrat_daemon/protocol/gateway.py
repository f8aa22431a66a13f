"""The Open Inference Protocol gateway: REST (uvicorn) and gRPC (grpc.aio) on one asyncio loop, one DEALER to
the daemon's ZeroMQ frontend, in a process of its own (`packrat oip`, or started by `packrat serve
--http-port/--grpc-port`). docs/oip.md says why a process of its own, measured against a thread of the daemon.

The same refusal as the ZeroMQ frontend's: a bind beyond loopback needs TLS (or --insecure-public).
On SIGTERM the gateway stops being ready, refuses new inferences (503 / UNAVAILABLE, and REST closes the
connection after the answer), lets those in flight finish (at most `DRAIN_GRACE_S`), lingers `DRAIN_LINGER_S` so
that clients between two requests get their refusal rather than a closed connection, and exits.

With `--status-fd` (the daemon that started it: `launch.GatewayProcess`) it writes "serving" there once every
port is bound and serving, "failed REASON" when it cannot start, and "draining" on its stop signal.

`bound`, `rest_started` and `drain` are how this gateway binds, starts and drains; `packrat serve --repository`'s
gateway (packrat_daemon.repository.server) does the same with them.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import signal
import socket
import time
from dataclasses import dataclass

import grpc
import uvicorn

from packrat_daemon.protocol.dataplane import DataPlane
from packrat_daemon.protocol.limits import GatewayLimits
from packrat_daemon.protocol.upstream import ThreadUpstreams, Upstream
from packrat_daemon.wire.curve import ClientKeys, is_loopback_address
from packrat_daemon.wire.errors import ConfigError

log = logging.getLogger("packrat.oip")

DRAIN_GRACE_S = 10.0
# A closed-loop client sends its next request within microseconds of an answer: this long after the last
# inference in flight has ended, every such client has had its refusal, and closing the listener resets no one.
DRAIN_LINGER_S = 0.5
# How often the drain looks whether the inferences in flight have ended.
DRAIN_POLL_S = 0.02
# How often the gateway asks whether the daemon serves, until it does (then only when asked: readiness probes).
WARM_UP_POLL_S = 0.5
DEFAULT_MAX_REQUEST_MB = 64
GRPC_SERVERS = ("threads", "aio")


@dataclass(frozen=True)
class GatewayOptions:
    connect: str  # the daemon's ZeroMQ endpoint
    http_port: int = 0  # 0: no REST
    grpc_port: int = 0  # 0: no gRPC
    address: str = "127.0.0.1"
    model_name: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    insecure_public: bool = False
    max_request_mb: int = DEFAULT_MAX_REQUEST_MB  # gRPC's message limit, checked before a message is read
    timeout_s: float = 60.0
    key: str | None = None  # CURVE towards the daemon: this gateway's .key_secret and the daemon's .key
    server_key: str | None = None
    # "threads": grpcio's threaded server, each handler thread with a connection of its own to the daemon;
    # "aio": grpc.aio on the loop, through the loop's one connection (docs/oip.md measures both).
    grpc_server: str = "threads"
    status_fd: int | None = None  # the daemon's end of a status pipe (launch.GatewayProcess), when it started us
    metrics_port: int = 0  # the gateway's metrics on a port of their own (they are at /metrics on http_port too)
    limits: GatewayLimits = GatewayLimits()  # REST's (docs/oip.md, "Limits"); `packrat oip --limit NAME=VALUE`

    def check(self) -> None:
        """ConfigError saying what to change, before anything is bound."""
        if not self.http_port and not self.grpc_port:
            raise ConfigError("give --http-port or --grpc-port (or both): the gateway would serve nothing")
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ConfigError("TLS needs both a certificate (--tls-cert) and its private key (--tls-key)")
        if not is_loopback_address(self.address) and self.tls_cert is None and not self.insecure_public:
            raise ConfigError(
                f"{self.address} is reachable beyond this machine, so anyone who can reach it could use the model "
                "and read its results; give a TLS certificate and key (--tls-cert, --tls-key), bind 127.0.0.1 "
                "(behind a mesh or proxy that terminates TLS), or accept the risk with --insecure-public"
            )
        if self.grpc_server not in GRPC_SERVERS:
            raise ConfigError(f"--grpc-server is one of {', '.join(GRPC_SERVERS)}, not {self.grpc_server!r}")
        if (self.key is None) != (self.server_key is None):
            raise ConfigError("CURVE towards the daemon needs both --key (this gateway's) and --server-key")

    def describe(self) -> str:
        if self.tls_cert is not None:
            return "TLS"
        return "plaintext, this machine only" if is_loopback_address(self.address) else "PLAINTEXT AND PUBLIC"


def host_port(address: str, port: int) -> str:
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"


def run_gateway(options: GatewayOptions) -> int:
    """Serve until SIGTERM or SIGINT; 0 once drained."""
    try:
        options.check()
        asyncio.run(serve_gateway(options, install_signals=True))
    except ConfigError as exc:
        _say(options.status_fd, f"failed {exc}")
        raise
    return 0


def _say(status_fd: int | None, line: str) -> None:
    """One line on the status pipe of the daemon that started this gateway, if one did."""
    if status_fd is not None:
        with contextlib.suppress(OSError):  # the daemon is gone: PR_SET_PDEATHSIG stops this gateway anyway
            os.write(status_fd, line.replace("\n", " ").encode() + b"\n")


async def serve_gateway(options: GatewayOptions, install_signals: bool, stop: asyncio.Event | None = None) -> None:
    """Serve until `stop` is set (or, with `install_signals`, a stop signal comes), then drain and return."""
    from packrat_daemon.protocol.gateway_metrics import serve_metrics

    options.check()
    stop = stop or asyncio.Event()
    if install_signals:
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
    keys = (
        None if options.key is None or options.server_key is None else ClientKeys.load(options.key, options.server_key)
    )
    upstream = Upstream(options.connect, keys)
    plane = DataPlane(upstream, options.model_name, options.timeout_s)
    servers = _Servers()
    target = host_port(options.address, options.grpc_port)
    served = False
    try:
        # First: a taken metrics port fails before anything else binds. It stops by itself once `stop` is set.
        serve_metrics(plane.metrics, options.address, options.metrics_port, stop)
        await servers.start_grpc(options, plane, upstream, keys, target)
        if options.http_port:
            servers.start_rest(options, plane)
        log.info(
            "Open Inference Protocol for %s: %s%s (%s)",
            options.connect,
            f"HTTP on {host_port(options.address, options.http_port)}" if options.http_port else "",
            f"{' and ' if options.http_port else ''}gRPC on {target}" if options.grpc_port else "",
            options.describe(),
        )
        if servers.rest is not None and servers.rest_task is not None:
            await rest_started(servers.rest, servers.rest_task)
        _say(options.status_fd, "serving")
        served = True
        await _serve_until(plane, stop, servers.rest_task)
    finally:
        plane.draining = True  # not ready from now on; new inferences are refused, those in flight go on
        if served:
            _say(options.status_fd, "draining")
            await drain(plane)
        await servers.stop()
        upstream.close()
        log.info("Open Inference Protocol gateway stopped")


@dataclass
class _Servers:
    """The gateway's REST and gRPC servers, each once it is made, so that whatever was made is stopped."""

    rest: uvicorn.Server | None = None
    rest_task: asyncio.Task[None] | None = None
    rpc: grpc.aio.Server | grpc.Server | None = None
    threads: ThreadUpstreams | None = None

    async def start_grpc(
        self, options: GatewayOptions, plane: DataPlane, upstream: Upstream, keys: ClientKeys | None, target: str
    ) -> None:
        """The gRPC server of `options.grpc_server`'s kind bound to `target` and started; none without a gRPC port."""
        from packrat_daemon.protocol.grpc.server import grpc_server, threaded_grpc_server

        if options.grpc_port and options.grpc_server == "threads":
            self.threads = ThreadUpstreams(options.connect, keys, upstream)
            self.rpc = threaded_grpc_server(
                plane, self.threads, asyncio.get_running_loop(), options.max_request_mb << 20
            )
        elif options.grpc_port:
            self.rpc = grpc_server(plane, options.max_request_mb << 20)
        rpc = self.rpc
        if rpc is None:
            return
        try:
            if options.tls_cert:
                bound_port = rpc.add_secure_port(target, _grpc_credentials(options))
            else:
                bound_port = rpc.add_insecure_port(target)
        except RuntimeError:  # what grpcio raises for a port it cannot bind
            bound_port = 0
        if not bound_port:
            raise ConfigError(f"cannot bind gRPC to {target}; is the port in use?")
        if isinstance(rpc, grpc.aio.Server):
            await rpc.start()
        else:
            rpc.start()

    def start_rest(self, options: GatewayOptions, plane: DataPlane) -> None:
        """The REST server bound to its port, its serving started as a task."""
        from packrat_daemon.protocol.http_server import rest_server
        from packrat_daemon.protocol.rest import RestApp

        # What the server refuses before the app sees a request (a head too large, too many connections) is
        # counted with the app's refusals.
        refused = functools.partial(plane.metrics.refused, "rest")
        self.rest = rest_server(RestApp(plane, options.limits), options, DRAIN_GRACE_S, refused)
        # Bound here, not by uvicorn, whose failure to bind is a sys.exit: a port in use is a ConfigError.
        self.rest_task = asyncio.create_task(self.rest.serve(sockets=[bound(options.address, options.http_port)]))

    async def stop(self) -> None:
        """Each server stopped, those in flight given DRAIN_GRACE_S."""
        if self.rest is not None:
            self.rest.should_exit = True
        if isinstance(self.rpc, grpc.aio.Server):
            await self.rpc.stop(DRAIN_GRACE_S)
        elif self.rpc is not None:  # its handlers block their threads, not the loop, which answers their other calls
            stopped_event = self.rpc.stop(DRAIN_GRACE_S)
            await asyncio.get_running_loop().run_in_executor(None, stopped_event.wait)
        if self.threads is not None:
            self.threads.close()
        if self.rest_task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self.rest_task


async def _serve_until(plane: DataPlane, stop: asyncio.Event, rest_task: asyncio.Task[None] | None) -> None:
    """Serve until `stop` is set, warming up meanwhile; RuntimeError if the REST server ends by itself first."""
    warm_up = asyncio.create_task(_warm_up(plane, stop))
    stopped = asyncio.create_task(stop.wait())
    done, _ = await asyncio.wait([stopped, *filter(None, [rest_task])], return_when=asyncio.FIRST_COMPLETED)
    warm_up.cancel()
    stopped.cancel()
    if rest_task is not None and rest_task in done:
        rest_task.result()  # uvicorn ended by itself: it could not bind (it says why), and this raises
        raise RuntimeError("the REST server stopped by itself")  # the daemon starts the gateway again


async def rest_started(rest: uvicorn.Server, task: asyncio.Task[None]) -> None:
    """Wait until uvicorn serves on its socket; its failure to start, raised."""
    while not rest.started:
        if task.done():
            task.result()
            raise RuntimeError("the REST server stopped before it started")
        await asyncio.sleep(0.005)


async def drain(plane: DataPlane) -> None:
    """Wait for the inferences in flight (at most DRAIN_GRACE_S), then linger: see DRAIN_LINGER_S."""
    deadline = time.monotonic() + DRAIN_GRACE_S
    while plane.in_flight and time.monotonic() < deadline:
        await asyncio.sleep(DRAIN_POLL_S)
    if plane.in_flight:
        log.warning("%d inference(s) still in flight after %.0f s; stopping anyway", plane.in_flight, DRAIN_GRACE_S)
    await asyncio.sleep(DRAIN_LINGER_S)


async def _warm_up(plane: DataPlane, stop: asyncio.Event) -> None:
    """Ask until the daemon serves, so the model's description is known before the first client asks."""
    while not stop.is_set() and not await plane.ready():
        await asyncio.sleep(WARM_UP_POLL_S)


def bound(address: str, port: int) -> socket.socket:
    """A TCP socket bound to `address` and `port` for the REST server (uvicorn serves on it); ConfigError if not."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    # IPPROTO_TCP named, not left 0: asyncio sets TCP_NODELAY only on accepted sockets whose proto says TCP, and
    # without it a reply written as headers then body waits for the client's delayed ACK (tens of ms a request).
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a restart rebinds at once after the last one
    try:
        sock.bind((address, port))
    except OSError as exc:
        sock.close()
        where = host_port(address, port)
        raise ConfigError(f"cannot bind REST to {where}: {exc.strerror}; is the port in use?") from None
    return sock


def _grpc_credentials(options: GatewayOptions) -> grpc.ServerCredentials:
    assert options.tls_cert is not None and options.tls_key is not None
    with open(options.tls_key, "rb") as key, open(options.tls_cert, "rb") as cert:
        return grpc.ssl_server_credentials([(key.read(), cert.read())])
