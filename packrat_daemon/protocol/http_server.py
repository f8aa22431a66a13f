"""The REST gateway's HTTP server: uvicorn, its httptools protocol bounded in what one connection may cost.

uvicorn (0.55, with httptools 0.9) bounds little of a connection by itself: a head may stream without end
(httptools gathers an unfinished header value in memory, 101 MiB accepted in 40 s), a connection that sends
nothing is kept forever (its keep-alive timer is armed only after an answer), and `limit_concurrency` answers
503 only once a whole head has been read. `BoundedHttpToolsProtocol` adds, from `GatewayLimits`:

- a connection limit, checked as a connection is accepted: one more is answered 503 at once;
- the head's size and its number of fields (431): the parser is fed at most `header_bytes` at a time, so a
  head is caught within one such slice of crossing the limit, whatever the size of the reads;
- the head's timeout (408), from its first byte; before that byte the keep-alive timeout applies, to a new
  connection as to one between requests;
- after an answer given before the request's body was all read (an error), the rest of the body read and
  dropped for at most `LINGER_S`, then the connection closed: uvicorn would read it to its end however long
  it takes.

A refusal is answered with a one-line JSON error and `Connection: close`; the connection is then half-closed,
and what the client still sends is read and dropped for at most `LINGER_S` before it is closed: closing it at
once with the client's bytes unread would reset it, and the client could lose the answer. The body's own
timeouts and its share of memory are the application's (`rest.read_body`): only it knows when it waits for a
body. Parse errors are answered 400 as uvicorn does, logged at debug level: a client must not flood the log.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

import httptools
import uvicorn
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from packrat_daemon.protocol.limits import GatewayLimits

log = logging.getLogger("packrat.oip")

# How long a refused connection, or one answered before its body was all read, is read and dropped from before
# it is closed: long enough for a client still sending to finish and read its answer, short enough that such
# connections hold nothing for long (they no longer count against max_connections).
LINGER_S = 2.0

_BETWEEN, _HEAD, _BODY = "between", "head", "body"  # where the parser is: between requests, in a head, in a body


class _Refused(Exception):
    """Raised in a parser callback to stop the parser; the refusal itself is in `_refusal`."""


@dataclass
class _Shared:
    """What a server's connections share: its limits, who is told of a refusal, and the connections lingering."""

    limits: GatewayLimits
    refused: Callable[[str], None] | None = None
    lingering: set[BoundedHttpToolsProtocol] = field(default_factory=set)


class BoundedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the bounds above; `bounded_protocol` makes one per server."""

    shared: ClassVar[_Shared] = _Shared(GatewayLimits())

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.timeout_keep_alive = self.shared.limits.idle_timeout_s  # type: ignore[assignment]  # uvicorn's is int
        self._phase = _BETWEEN
        self._head_bytes = 0
        self._head_fields = 0
        self._head_timer: asyncio.TimerHandle | None = None
        self._linger: asyncio.TimerHandle | None = None
        self._refusal: tuple[int, str, str] | None = None  # set by a callback that stops the parser
        self._refused = False

    # -- connections --------------------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        limit = self.shared.limits.max_connections
        if len(self.connections) >= limit:
            self.transport = transport
            self._refuse(503, f"the server has {limit} connections open, its limit; retry shortly", "connections")
            return
        super().connection_made(transport)
        # Until its first byte, a new connection is idle as one between requests is: the keep-alive timeout.
        self.timeout_keep_alive_task = self.loop.call_later(self.timeout_keep_alive, self.timeout_keep_alive_handler)

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_timers()
        self.shared.lingering.discard(self)
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return  # answered and half-closed: read and dropped until the client closes or LINGER_S passes
        self._unset_keepalive_if_required()
        if self._phase == _BETWEEN and self._head_timer is None:
            self._start_head()  # a request's first byte (perhaps only an empty line before it)
        step = self.shared.limits.header_bytes
        view = memoryview(data)
        for start in range(0, len(view), step):
            piece = view[start : start + step]
            try:
                self.parser.feed_data(piece)
            except httptools.HttpParserUpgrade:
                # No upgrade is served (no WebSocket); the request is answered as plain HTTP, as uvicorn does.
                return
            except httptools.HttpParserError as exc:
                if self._refusal is not None:
                    self._refuse(*self._refusal)
                else:
                    log.debug("invalid HTTP request from %s: %s", self.client, exc)
                    self.send_400_response("Invalid HTTP request received.")
                return
            if self._phase == _HEAD:
                # Every byte of this piece was the head's, unless the head began inside it (a pipelined request):
                # then the count is over by what came before, at most one piece.
                self._head_bytes += len(piece)
                if self._head_bytes >= step:  # still in the head after `step` of its bytes: it is longer
                    limit = self.shared.limits.header_bytes
                    self._refuse(431, f"the request head is over {limit} bytes", "header_bytes")
                    return

    # -- parser callbacks ---------------------------------------------------------------------------------------

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._phase = _HEAD
        self._head_bytes = self._head_fields = 0
        if self._head_timer is None:  # a pipelined request, begun while the one before was answered
            self._start_head()

    def on_header(self, name: bytes, value: bytes) -> None:
        self._head_fields += 1
        if self._head_fields > self.shared.limits.header_fields:
            limit = self.shared.limits.header_fields
            self._refusal = (431, f"the request has more than {limit} header fields", "header_fields")
            raise _Refused
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._cancel_head_timer()
        self._phase = _BODY
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        answered_early = self.cycle is not None and self.cycle.response_complete
        super().on_message_complete()
        self._phase = _BETWEEN
        if answered_early and self._linger is not None and not self.transport.is_closing():
            # The rest of the body came within LINGER_S: the connection goes on, idle until its next request.
            self._linger.cancel()
            self._linger = None
            self._unset_keepalive_if_required()
            self.timeout_keep_alive_task = self.loop.call_later(
                self.timeout_keep_alive, self.timeout_keep_alive_handler
            )

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self._phase == _BODY and not self.transport.is_closing() and self._linger is None:
            # Answered before the body was all read (an error): drop the rest, for LINGER_S at most.
            self._linger = self.loop.call_later(LINGER_S, self._close)

    # -- timers and refusals ------------------------------------------------------------------------------------

    def _start_head(self) -> None:
        self._head_bytes = self._head_fields = 0
        self._head_timer = self.loop.call_later(self.shared.limits.header_timeout_s, self._head_expired)

    def _head_expired(self) -> None:
        self._head_timer = None
        if self.transport.is_closing():
            return
        if self.cycle is not None and not self.cycle.response_complete:
            # A pipelined head stalls while the request before it is computed: its answer comes first.
            self._head_timer = self.loop.call_later(self.shared.limits.header_timeout_s, self._head_expired)
            return
        timeout = self.shared.limits.header_timeout_s
        self._refuse(408, f"the request head did not arrive within {timeout:g} s", "header_timeout")

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _stop_timers(self) -> None:
        self._cancel_head_timer()
        if self._linger is not None:
            self._linger.cancel()
            self._linger = None

    def _refuse(self, status: int, message: str, reason: str) -> None:
        """Answer `status` with `message`, half-close, and close after LINGER_S (or when the client does)."""
        self._refused = True
        self._stop_timers()
        if self.cycle is not None and not self.cycle.response_complete:
            # A pipelined request's head, while the one before it is answered: no room for another answer.
            self.transport.close()
            return
        self._unset_keepalive_if_required()
        self.connections.discard(self)  # it holds nothing now but its socket, for LINGER_S at most
        body = json.dumps({"error": message}).encode()
        head = [STATUS_LINE[status], b"content-type: application/json\r\n", b"connection: close\r\n"]
        if status == 503:
            head.append(b"retry-after: 1\r\n")
        head.append(b"content-length: %d\r\n\r\n" % len(body))
        self.transport.write(b"".join([*head, body]))
        shared = self.shared
        if len(shared.lingering) < shared.limits.max_connections and self.transport.can_write_eof():
            self.transport.write_eof()
            shared.lingering.add(self)
            self._linger = self.loop.call_later(LINGER_S, self._close)
            if self.flow is not None:
                self.flow.resume_reading()  # read (and drop) what the client still sends
        else:  # as many lingering as connections allowed (or TLS, which cannot half-close): close now
            self.transport.close()
        if shared.refused is not None:
            shared.refused(reason)

    def _close(self) -> None:
        self._linger = None
        if not self.transport.is_closing():
            self.transport.close()


def bounded_protocol(
    limits: GatewayLimits, refused: Callable[[str], None] | None = None
) -> type[BoundedHttpToolsProtocol]:
    """The protocol class for one server: its connections share `limits` and the count of those lingering;
    `refused(reason)` is called for each refusal ("connections", "header_bytes", "header_fields",
    "header_timeout"), for whoever counts them."""
    return type("BoundedHttpToolsProtocol", (BoundedHttpToolsProtocol,), {"shared": _Shared(limits, refused)})


class ServerOptions(Protocol):
    """What the server takes of `gateway.GatewayOptions` (named here, not imported: the gateway imports this)."""

    @property
    def address(self) -> str: ...
    @property
    def http_port(self) -> int: ...
    @property
    def tls_cert(self) -> str | None: ...
    @property
    def tls_key(self) -> str | None: ...
    @property
    def limits(self) -> GatewayLimits: ...


class QuietServer(uvicorn.Server):
    """uvicorn's Server without its signal handlers: the gateway owns SIGTERM and SIGINT."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def rest_server(
    app: Any, options: ServerOptions, graceful_s: float, refused: Callable[[str], None] | None = None
) -> QuietServer:
    """The REST server for `app` with `options`' address, TLS and limits; the caller serves it on a socket it
    has bound (`serve(sockets=[...])`). `graceful_s`: how long a stop waits for the requests in flight."""
    config = uvicorn.Config(
        app,
        host=options.address,
        port=options.http_port,
        http=bounded_protocol(options.limits, refused),
        ws="none",  # no WebSocket route: an upgrade is answered as a plain request
        lifespan="off",
        access_log=False,
        log_level="warning",
        ssl_certfile=options.tls_cert,
        ssl_keyfile=options.tls_key,
        timeout_graceful_shutdown=int(graceful_s),
    )
    return QuietServer(config)
