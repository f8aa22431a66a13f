"""The Open Inference Protocol gateway's own metrics (docs/metrics.md, "The gateway"): its requests by protocol,
endpoint and status, their latency, those in flight, and its refusals by reason, in a registry of its own.

The gateway is a process of its own (docs/oip.md), so the daemon's registry cannot count what it refuses: a
request refused by the gateway (too large, draining, malformed, a deadline passed) never reaches the daemon.
Each `DataPlane` holds one `GatewayMetrics`, which the REST app and both gRPC servers of that gateway share.

They are served where the gateway serves: `GET /metrics` on its REST port (`rest.RestApp`), and, for a gateway
without REST or to keep them off a public REST port, on a plain HTTP port of their own (`serve_metrics`). One
scrape target per gateway, beside the daemon's own `--metrics-port`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import Iterator
from typing import Any

import uvicorn
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.process_collector import ProcessCollector

from packrat_daemon.protocol.errors import Status
from packrat_daemon.wire.codec import ErrorCode
from packrat_daemon.wire.curve import is_loopback_address
from packrat_daemon.wire.errors import ConfigError

log = logging.getLogger("packrat.oip")

REST, GRPC = "rest", "grpc"
PROTOCOLS = (REST, GRPC)
# One endpoint name per call of the protocol, the same over REST and gRPC so that a dashboard compares them.
GRPC_ENDPOINTS = {
    "ServerLive": "live",
    "ServerReady": "ready",
    "ServerMetadata": "server_metadata",
    "ModelReady": "model_ready",
    "ModelMetadata": "model_metadata",
    "ModelConfig": "model_config",
    "ModelStatistics": "statistics",
    "ModelInfer": "infer",
}
_REST_ACTIONS = {"ready": "model_ready", "config": "model_config", "stats": "statistics", "infer": "infer"}
UNKNOWN = "unknown"  # a path that is no route (REST): one label for all, so a scanner cannot grow the series

# Why a request was refused, by the Status it was answered with. UNAVAILABLE is split: `draining` when the
# gateway or its daemon is shutting down (the client should go elsewhere), `unavailable` otherwise (the daemon is
# not serving yet, or cannot be reached).
REASONS: dict[Status, str] = {
    Status.INVALID_ARGUMENT: "bad_request",
    Status.NOT_FOUND: "not_found",
    Status.TOO_LARGE: "too_large",
    Status.OVERLOADED: "overloaded",
    Status.UNAVAILABLE: "unavailable",
    Status.DEADLINE_EXCEEDED: "timeout",
    Status.INTERNAL: "internal",
    Status.BAD_GATEWAY: "bad_gateway",
    Status.UNIMPLEMENTED: "unimplemented",
    Status.METHOD_NOT_ALLOWED: "method_not_allowed",
    Status.CANCELLED: "cancelled",
}
DRAINING = "draining"
# What a transport refuses before any handler runs (http_server's limits, rest_body's body timeout): counted by
# reason alone (`GatewayMetrics.refused`), each series there from the start.
TRANSPORT_REASONS = ("connections", "header_bytes", "header_fields", "header_timeout", "body_timeout")

# From a health answer (about 0.1 ms) to a large batch on a slow model; 60 s is the gateway's default timeout.
LATENCY_BUCKETS = (1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
# The metrics port of its own: connections answered at once (more get 503), and how long an idle one is kept.
METRICS_CONCURRENCY = 16
METRICS_KEEP_ALIVE_S = 5


def rest_endpoint(path: str) -> str:
    """The endpoint a REST path asks for (rest.RestApp's routes), or UNKNOWN; the method is not looked at (a
    wrong one is counted under its endpoint, with its 405)."""
    parts = path.rstrip("/").split("/")[1:]
    if parts == ["metrics"]:
        return "metrics"
    if not parts or parts[0] != "v2":
        return UNKNOWN
    rest = parts[1:]
    fixed = {(): "server_metadata", ("health", "live"): "live", ("health", "ready"): "ready"}
    if tuple(rest) in fixed:
        return fixed[tuple(rest)]
    if rest == ["models", "stats"]:
        return "statistics"
    if len(rest) < 2 or rest[0] != "models":
        return UNKNOWN
    tail = rest[2:]
    if len(tail) >= 2 and tail[0] == "versions":
        tail = tail[2:]
    if not tail:
        return "model_metadata"
    return _REST_ACTIONS.get(tail[0], UNKNOWN) if len(tail) == 1 else UNKNOWN


class GatewayMetrics:
    """The gateway's metrics, in `registry` (prometheus_client's metrics are safe to update from the threaded gRPC
    server's handler threads and the loop at once)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "packrat_gateway_requests", "Requests the gateway answered, by protocol, endpoint and status "
            "(the HTTP status, or the gRPC status code)", ["protocol", "endpoint", "status"], registry=self.registry,
        )  # fmt: skip
        self.latency = Histogram(
            "packrat_gateway_request_latency_seconds", "From the request's arrival at the gateway's handler to its "
            "answer, by protocol and endpoint", ["protocol", "endpoint"], buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )  # fmt: skip
        self.in_flight = Gauge(
            "packrat_gateway_in_flight_requests", "Requests the gateway is handling now, by protocol", ["protocol"],
            registry=self.registry,
        )  # fmt: skip
        self.refusals = Counter(
            "packrat_gateway_refusals", "Requests the gateway answered with an error, by protocol and reason",
            ["protocol", "reason"], registry=self.registry,
        )  # fmt: skip
        # The gateway process's memory, CPU and descriptors: where a flood of connections or bytes shows first.
        ProcessCollector(namespace="packrat_gateway", registry=self.registry)
        for protocol in PROTOCOLS:  # every series a rate() or an alert reads exists from the start, at 0
            self.in_flight.labels(protocol)
            for reason in {*REASONS.values(), DRAINING, *TRANSPORT_REASONS}:
                self.refusals.labels(protocol, reason)
        self._latency: dict[tuple[str, str], Any] = {}
        self._requests: dict[tuple[str, str, str], Any] = {}

    def call(self, protocol: str, endpoint: str) -> Call:
        """One request, to be run as `with metrics.call(...) as call:`."""
        return Call(self, protocol, endpoint)

    def refused(self, protocol: str, reason: str) -> None:
        """A refusal counted by reason alone: for what a transport refuses before any handler runs."""
        self.refusals.labels(protocol, reason).inc()

    def exposition(self) -> bytes:
        return generate_latest(self.registry)

    def _done(self, protocol: str, endpoint: str, status: str, seconds: float) -> None:
        # The children are kept: `labels()` takes a lock and builds a key, on every request otherwise.
        latency = self._latency.get((protocol, endpoint))
        if latency is None:
            latency = self._latency[protocol, endpoint] = self.latency.labels(protocol, endpoint)
        requests = self._requests.get((protocol, endpoint, status))
        if requests is None:
            requests = self._requests[protocol, endpoint, status] = self.requests.labels(protocol, endpoint, status)
        latency.observe(seconds)
        requests.inc()


class Call:
    """One request while it is handled: in flight inside its `with`, then counted by the status it was given
    (`status`, or `refused`); one that leaves by an exception with none given was cancelled (its client left)."""

    __slots__ = ("metrics", "protocol", "endpoint", "status", "_started")

    def __init__(self, metrics: GatewayMetrics, protocol: str, endpoint: str) -> None:
        self.metrics = metrics
        self.protocol = protocol
        self.endpoint = endpoint
        self.status: str | None = None  # the HTTP status ("200") or the gRPC code ("OK")
        self._started = 0.0

    def refused(self, status: Status, packrat_code: str | None = None) -> None:
        """Answered with an error of `status`; `packrat_code` the daemon's own code, when the daemon refused it."""
        reason = DRAINING if packrat_code == ErrorCode.SHUTTING_DOWN else REASONS[status]
        self.metrics.refusals.labels(self.protocol, reason).inc()
        self.status = str(status.http) if self.protocol == REST else status.grpc

    def __enter__(self) -> Call:
        self.metrics.in_flight.labels(self.protocol).inc()
        self._started = time.perf_counter()
        return self

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        seconds = time.perf_counter() - self._started
        self.metrics.in_flight.labels(self.protocol).dec()
        status = self.status
        if status is None:
            # 499: nginx's "client closed request", for REST; gRPC has a code of its own.
            status = ("200" if self.protocol == REST else "OK") if kind is None else ("499" if self.protocol == REST
                                                                                     else "CANCELLED")  # fmt: skip
        self.metrics._done(self.protocol, self.endpoint, status, seconds)


class MetricsApp:
    """The ASGI application of the metrics port: `GET /metrics`, and a 404 for anything else."""

    def __init__(self, metrics: GatewayMetrics) -> None:
        self.metrics = metrics

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        if scope["path"] == "/metrics" and scope["method"] == "GET":
            status, kind, body = 200, CONTENT_TYPE_LATEST, self.metrics.exposition()
        else:
            status, kind, body = 404, "text/plain; charset=utf-8", b"not found: this port serves GET /metrics\n"
        headers = [(b"content-type", kind.encode()), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})


def serve_metrics(metrics: GatewayMetrics, address: str, port: int, stop: asyncio.Event) -> asyncio.Task[None] | None:
    """Serve `metrics` at http://ADDRESS:PORT/metrics on the running loop until `stop` is set (port 0: not at all,
    None). The port is bound before this returns: ConfigError naming it and `--metrics-port` if it is taken.
    At most METRICS_CONCURRENCY connections are answered at once and an idle one is closed after
    METRICS_KEEP_ALIVE_S: a flood of connections to it costs no thread and bounded memory."""
    if not port:
        return None
    sock = _bound(address, port)
    config = uvicorn.Config(
        MetricsApp(metrics), lifespan="off", access_log=False, log_level="warning",
        limit_concurrency=METRICS_CONCURRENCY, timeout_keep_alive=METRICS_KEEP_ALIVE_S,
    )  # fmt: skip
    server = _QuietServer(config)
    if not is_loopback_address(address):  # plain HTTP, no authentication: as the daemon's own metrics port
        log.warning(
            "the gateway's metrics on %s:%d can be read by anyone who reaches it (request counts, the model's "
            "endpoints); bind 127.0.0.1 and let a local Prometheus or a TLS proxy fetch them (docs/security.md)",
            address, port,
        )  # fmt: skip

    async def run() -> None:
        serving = asyncio.create_task(server.serve(sockets=[sock]))
        stopped = asyncio.create_task(stop.wait())
        try:
            await asyncio.wait([serving, stopped], return_when=asyncio.FIRST_COMPLETED)
        finally:
            server.should_exit = True
            stopped.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await serving
            sock.close()

    return asyncio.create_task(run(), name="oip-metrics")


def _bound(address: str, port: int) -> socket.socket:
    """A listening socket of this port alone: SO_REUSEADDR (a restart rebinds at once), never SO_REUSEPORT."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((address, port))
    except OSError as exc:
        sock.close()
        where = f"[{address}]:{port}" if ":" in address else f"{address}:{port}"
        raise ConfigError(
            f"cannot serve the gateway's metrics on {where}: {exc.strerror}; choose another --metrics-port"
        ) from None
    sock.listen(METRICS_CONCURRENCY)  # now: connections wait in the backlog until uvicorn serves, none refused
    return sock


class _QuietServer(uvicorn.Server):
    """uvicorn's Server without its signal handlers: the gateway owns SIGTERM and SIGINT."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield
