"""The daemon's metrics port: /metrics, /healthz, /readyz, served by one thread whatever its connections.

`http.server.ThreadingHTTPServer`, which served it before, starts a thread per connection and keeps it while the
connection idles: 500 idle connections made 505 threads in the daemon. Here one thread runs an asyncio loop that
serves every connection, and a connection costs its socket and a few KiB while it waits, for a bounded time:

- at most `MAX_CONNECTIONS` open at once; one more evicts the oldest that has not sent its request yet (idle or
  slow), so a flood of idle connections cannot keep a scrape or a probe out; when every one is being answered,
  the newcomer is closed at once;
- a request head must come whole within `HEAD_TIMEOUT_S` of the connection, and be at most `MAX_HEAD_BYTES`;
  else the connection is closed;
- one request per connection (`Connection: close`, as before), written within `WRITE_TIMEOUT_S`.

The port is bound with SO_REUSEADDR (a restart rebinds at once), never SO_REUSEPORT: a port another process
listens on is a ConfigError naming it and the option, not a port shared with it.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
from typing import Protocol

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from packrat_daemon.wire.curve import is_loopback_address
from packrat_daemon.wire.errors import ConfigError

log = logging.getLogger("packrat.security")

# Prometheus and a kubelet's probes need a few connections at a time; an attacker's extra ones evict each other.
MAX_CONNECTIONS = 64
# Prometheus and probes send their request as soon as they connect.
HEAD_TIMEOUT_S = 5.0
MAX_HEAD_BYTES = 8 << 10  # a request line and a few headers
WRITE_TIMEOUT_S = 10.0  # a /metrics answer is tens of KiB: a client that does not read it is let go
_TEXT = "text/plain; charset=utf-8"
_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed", 503: "Service Unavailable"}


class Metrics(Protocol):
    """What the server reads of `metrics.Metrics` (named here, not imported: that module imports this one)."""

    registry: CollectorRegistry
    serving_workers: int
    planned_workers: int
    server: MetricsServer | None

    def ready(self) -> bool: ...


class MetricsServer:
    """Serves `metrics` on `address`:`port` from a thread of its own until `close()`; the port is bound (or a
    ConfigError raised) before the constructor returns."""

    def __init__(self, metrics: Metrics, address: str, port: int) -> None:
        self.metrics = metrics
        sock = _bound(address, port)
        self.server_address: tuple[str, int] = sock.getsockname()[:2]
        self._loop = asyncio.new_event_loop()
        self._waiting: dict[asyncio.StreamWriter, None] = {}  # connections still reading their head, oldest first
        self._open: set[asyncio.StreamWriter] = set()
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(sock,), name="metrics-http", daemon=True)
        self._thread.start()
        self._started.wait()

    def close(self) -> None:
        """Stop serving and let go of the port; connections open are closed."""
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop.set)
            self._thread.join(5)

    def _run(self, sock: socket.socket) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._serve(sock))
        finally:
            self._started.set()  # never leave the constructor waiting, whatever happened
            self._loop.close()

    async def _serve(self, sock: socket.socket) -> None:
        self._stop = asyncio.Event()
        server = await asyncio.start_server(self._connection, sock=sock, limit=MAX_HEAD_BYTES)
        self._started.set()
        try:
            await self._stop.wait()
        finally:
            server.close()
            for writer in list(self._open):
                writer.transport.abort()
            await server.wait_closed()

    def _admit(self, writer: asyncio.StreamWriter) -> bool:
        """Room for one more connection: the oldest still waiting for its head gives way, if need be."""
        if len(self._open) >= MAX_CONNECTIONS:
            if not self._waiting:
                return False
            oldest = next(iter(self._waiting))
            self._forget(oldest)
            oldest.transport.abort()
        self._open.add(writer)
        self._waiting[writer] = None
        return True

    def _forget(self, writer: asyncio.StreamWriter) -> None:
        self._open.discard(writer)
        self._waiting.pop(writer, None)

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if not self._admit(writer):
            writer.transport.abort()
            return
        try:
            async with asyncio.timeout(HEAD_TIMEOUT_S):
                head = await reader.readuntil(b"\r\n\r\n")
            self._waiting.pop(writer, None)
            status, body, content_type = self._answer(head)
            writer.write(
                f"HTTP/1.1 {status} {_REASONS[status]}\r\nContent-Type: {content_type}\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
                + body
            )
            async with asyncio.timeout(WRITE_TIMEOUT_S):
                await writer.drain()
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            pass  # slow, too long, or gone: closed below, nothing to tell anyone
        finally:
            self._forget(writer)
            writer.close()

    def _answer(self, head: bytes) -> tuple[int, bytes, str]:
        """/metrics, /healthz (the process answers), /readyz (503 until the workers serve, and while the pool is
        below its plan, so a load balancer or Kubernetes sends no traffic then); any other path is a 404."""
        request = head.split(b"\r\n", 1)[0].split()
        if len(request) != 3:
            return 400, b"not an HTTP request\n", _TEXT
        if request[0] != b"GET":
            return 405, b"only GET is served here\n", _TEXT
        path = request[1].split(b"?", 1)[0]
        metrics = self.metrics
        if path == b"/metrics":
            return 200, generate_latest(metrics.registry), CONTENT_TYPE_LATEST
        if path == b"/healthz":
            return 200, b"ok\n", _TEXT
        if path == b"/readyz":
            body = f"{metrics.serving_workers} of {metrics.planned_workers} planned workers serving\n".encode()
            return (200 if metrics.ready() else 503), body, _TEXT
        return 404, b"not found: try /metrics, /healthz or /readyz\n", _TEXT


def serve(metrics: Metrics, port: int, address: str) -> MetricsServer:
    """A MetricsServer for `metrics`, with a warning when the address is reachable beyond this machine."""
    server = MetricsServer(metrics, address, port)
    if not is_loopback_address(address):  # the endpoint has no authentication of its own
        log.warning(
            "metrics on %s:%d can be read by anyone who reaches it (the model, the plan, request counts); "
            "bind 127.0.0.1 and let a local Prometheus or a TLS proxy fetch them (docs/security.md)",
            address, port,
        )  # fmt: skip
    return server


def rebind(metrics: Metrics, port: int, address: str) -> None:
    """A reload: serve on `address`:`port` from now on (port 0: not at all). ConfigError when that cannot be
    bound; the endpoint from before then serves on."""
    old = metrics.server
    before: tuple[str, int] | None = None if old is None else old.server_address
    if old is not None and (not port or old.server_address[1] == port):  # the same port: let go of it first
        old.close()
        old = metrics.server = None
    try:
        if port:
            metrics.server = serve(metrics, port, address)
    except ConfigError:
        metrics.server = old
        if old is None and before is not None:  # the port was let go of: take it back where it was
            metrics.server = serve(metrics, before[1], before[0])
        raise
    if old is not None:
        old.close()


def _bound(address: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((address, port))
        sock.listen(128)
    except OSError as exc:
        sock.close()
        raise ConfigError(
            f"cannot serve metrics on {address}:{port}: {exc.strerror}; choose another --metrics-port"
        ) from None
    return sock
