"""Packrat client library: send tensors to one or more Packrat daemons over ZeroMQ and get results back.

    with Client("tcp://127.0.0.1:5555") as client:
        logits = client.infer(batch)          # batch.shape[0] samples in, as many rows out

The client speaks protocol version 1 (docs/protocol.md) over one DEALER socket per endpoint and spreads
requests round-robin across endpoints. It never imports torch, so it starts in milliseconds.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import zmq
import zmq.asyncio

from packrat_daemon.wire.errors import PackratError
from packrat_daemon.wire.protocol import (
    ErrorCode,
    ProtocolError,
    RequestId,
    decode_reply,
    encode_infer_request,
    encode_info_request,
)
from packrat_daemon.wire.zmqio import NOBLOCK, recv_frames, send_frames

log = logging.getLogger(__name__)

__all__ = [
    "AsyncClient",
    "BadRequest",
    "Client",
    "ClientClosed",
    "ClientTimeout",
    "InternalError",
    "Overloaded",
    "ServerError",
    "ServerTimeout",
    "ShuttingDown",
    "TooLarge",
    "UnsupportedVersion",
    "server_error",
]

# How long an endpoint that timed out is skipped while other endpoints remain.
DEFAULT_BACKOFF_S = 1.0
# Bounded queues: a client that outruns a dead endpoint blocks (and times out) instead of growing.
_HWM = 1000


# ------------------------------------------------------------------------------------------- errors


class ServerError(PackratError):
    """The server answered with an error reply; ``code`` says which (an ErrorCode, or the raw string
    for a code this client does not know)."""

    def __init__(self, code: ErrorCode | str, message: str, request_id: RequestId | None = None) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.request_id = request_id


class BadRequest(ServerError):
    """The request was malformed or does not fit the model; fix it before sending it again."""


class UnsupportedVersion(ServerError):
    """The server does not speak this protocol version; ``versions`` lists the ones it does."""

    def __init__(
        self,
        code: ErrorCode | str,
        message: str,
        request_id: RequestId | None = None,
        versions: Sequence[int] = (),
    ) -> None:
        super().__init__(code, message, request_id)
        self.versions = tuple(versions)


class TooLarge(ServerError):
    """The message is over the server's size limit; send fewer samples per request."""


class Overloaded(ServerError):
    """The server's queue is full; retry later, preferably with back-off."""


class ServerTimeout(ServerError):
    """The server could not start the work within the request's timeout."""


class ShuttingDown(ServerError):
    """The server is draining; send the request to another server or retry after it restarts."""


class InternalError(ServerError):
    """The server failed while serving the request."""


_ERROR_CLASSES: dict[str, type[ServerError]] = {
    ErrorCode.BAD_REQUEST: BadRequest,
    ErrorCode.UNSUPPORTED_VERSION: UnsupportedVersion,
    ErrorCode.TOO_LARGE: TooLarge,
    ErrorCode.OVERLOADED: Overloaded,
    ErrorCode.TIMEOUT: ServerTimeout,
    ErrorCode.SHUTTING_DOWN: ShuttingDown,
    ErrorCode.INTERNAL: InternalError,
}


class ClientTimeout(PackratError, TimeoutError):
    """No reply came within the client's timeout; the endpoint is skipped for a short back-off."""


class ClientClosed(PackratError):
    """The client was closed while the request was waiting for its reply."""


def server_error(header: dict[str, Any]) -> ServerError:
    """The exception for an error reply header (as returned by decode_reply)."""
    error = header["error"]
    raw_code: str = error["code"]
    try:
        code: ErrorCode | str = ErrorCode(raw_code)
    except ValueError:
        code = raw_code  # a newer server's code: still a ServerError, with the code kept as sent
    cls = _ERROR_CLASSES.get(code, ServerError)
    if cls is UnsupportedVersion:
        versions = header.get("versions")
        return UnsupportedVersion(code, error["message"], header.get("id"), versions or ())
    return cls(code, error["message"], header.get("id"))


def _infer_result(header: dict[str, Any], array: np.ndarray | None, samples: int) -> np.ndarray:
    if not header["ok"]:
        raise server_error(header)
    if array is None or array.ndim == 0 or array.shape[0] != samples:
        got = "no tensor" if array is None else f"shape {list(array.shape)}"
        raise ProtocolError(ErrorCode.INTERNAL, f"server answered {samples} samples with {got}", header.get("id"))
    return array


def _info_result(header: dict[str, Any]) -> dict[str, Any]:
    if not header["ok"]:
        raise server_error(header)
    return {key: value for key, value in header.items() if key not in ("v", "id", "ok")}


# ---------------------------------------------------------------------------------------- endpoints


class _EndpointRing:
    """Round-robin over endpoints, skipping those in back-off after a timeout while others remain."""

    def __init__(self, count: int, backoff: float) -> None:
        self._backoff = backoff
        self._skip_until = [0.0] * count
        self._next = 0

    def pick(self) -> int:
        count = len(self._skip_until)
        if count == 1:
            return 0  # one endpoint: nothing to balance or skip
        now = time.monotonic()
        for step in range(count):
            index = (self._next + step) % count
            if self._skip_until[index] <= now:
                self._next = index + 1
                return index
        # Every endpoint is in back-off: the one that has waited longest is the best remaining bet.
        index = min(range(count), key=self._skip_until.__getitem__)
        self._next = index + 1
        return index

    def timed_out(self, index: int) -> None:
        self._skip_until[index] = time.monotonic() + self._backoff

    def answered(self, index: int) -> None:
        self._skip_until[index] = 0.0


def _endpoint_list(endpoints: str | Sequence[str]) -> list[str]:
    listed = [endpoints] if isinstance(endpoints, str) else list(endpoints)
    if not listed:
        raise ValueError("give at least one endpoint, e.g. 'tcp://127.0.0.1:5555'")
    return listed


def _check_timeout(timeout: float) -> float:
    if not timeout > 0 or not math.isfinite(timeout):
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    return timeout


def _configure(socket: zmq.Socket, endpoint: str) -> None:
    # LINGER 0: closing must not hang on requests queued for an endpoint that is down.
    socket.setsockopt(zmq.LINGER, 0)
    socket.setsockopt(zmq.SNDHWM, _HWM)
    socket.setsockopt(zmq.RCVHWM, _HWM)
    socket.connect(endpoint)


def _timeout_ms(seconds: float) -> int:
    return max(0, math.ceil(seconds * 1000))


# ------------------------------------------------------------------------------------ blocking client


class Client:
    """Blocking client. Thread-safe: concurrent calls are serialised; use AsyncClient for concurrency.

    ``timeout`` (seconds) bounds each call and is also sent to the server as the request's
    ``timeout_ms``, so the server drops work whose answer nobody waits for any more.
    """

    def __init__(
        self,
        endpoints: str | Sequence[str],
        *,
        timeout: float = 30.0,
        context: zmq.Context | None = None,
        backoff: float = DEFAULT_BACKOFF_S,
    ) -> None:
        self.endpoints = _endpoint_list(endpoints)
        self.timeout = timeout
        context = context if context is not None else zmq.Context.instance()
        self._sockets: list[zmq.Socket] = []
        for endpoint in self.endpoints:
            socket = context.socket(zmq.DEALER)
            self._sockets.append(socket)
            _configure(socket, endpoint)
        self._ring = _EndpointRing(len(self.endpoints), backoff)
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._closed = False
        self._receive_timeout_ms = [-1] * len(self._sockets)  # RCVTIMEO as last set, per socket

    @property
    def timeout(self) -> float:
        """Seconds each call waits by default (also sent to the server as the request's ``timeout_ms``)."""
        return self._timeout

    @timeout.setter
    def timeout(self, seconds: float) -> None:
        self._timeout = _check_timeout(seconds)
        self._timeout_ms = self._timeout * 1000  # what every request header carries, computed once

    def infer(self, array: np.ndarray, *, timeout: float | None = None, dtype: str | None = None) -> np.ndarray:
        """Run the model on ``array`` (first axis = samples); returns one output row per sample.

        ``dtype`` is only needed for bfloat16: pass the raw bits as uint16 with ``dtype="bfloat16"``.
        """
        if timeout is None:
            timeout, timeout_ms = self.timeout, self._timeout_ms
        else:
            timeout = _check_timeout(timeout)
            timeout_ms = timeout * 1000
        request_id = next(self._ids)
        frames = encode_infer_request(request_id, array, timeout_ms=timeout_ms, dtype=dtype)
        header, result = self._request(frames, request_id, timeout)
        return _infer_result(header, result, array.shape[0] if type(array) is np.ndarray else np.shape(array)[0])

    def info(self, *, timeout: float | None = None) -> dict[str, Any]:
        """The server's description: versions, model, input dtype/shape, max_batch, plan."""
        timeout = self.timeout if timeout is None else _check_timeout(timeout)
        request_id = next(self._ids)
        header, _ = self._request(encode_info_request(request_id), request_id, timeout)
        return _info_result(header)

    def _request(self, frames: list[Any], request_id: int, timeout: float) -> tuple[dict[str, Any], np.ndarray | None]:
        deadline = time.monotonic() + timeout
        with self._lock:
            if self._closed:
                raise ClientClosed("the client is closed; create a new one")
            index = self._ring.pick()
            socket = self._sockets[index]
            try:
                self._send(socket, frames, deadline)
                reply = self._receive(index, request_id, deadline)
            except ClientTimeout:
                self._ring.timed_out(index)
                raise
            self._ring.answered(index)
            return reply

    def _send(self, socket: zmq.Socket, frames: list[Any], deadline: float) -> None:
        while True:
            try:
                send_frames(socket, frames, NOBLOCK, copy=False)
                return
            except zmq.Again:
                # The endpoint's queue is full (high-water mark): wait for room, within the deadline.
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not socket.poll(_timeout_ms(remaining), zmq.POLLOUT):
                    raise ClientTimeout(self._timeout_message(socket)) from None

    def _receive(self, index: int, request_id: int, deadline: float) -> tuple[dict[str, Any], np.ndarray | None]:
        socket = self._sockets[index]
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ClientTimeout(self._timeout_message(socket))
            # A receive that blocks up to the deadline, not poll-then-receive: one wake-up per reply. The
            # timeout is set only when it changes (calls with the same timeout round to the same ms).
            wait_ms = max(1, _timeout_ms(remaining))
            if wait_ms != self._receive_timeout_ms[index]:
                socket.setsockopt(zmq.RCVTIMEO, wait_ms)
                self._receive_timeout_ms[index] = wait_ms
            try:
                frames = recv_frames(socket)
            except zmq.Again:
                raise ClientTimeout(self._timeout_message(socket)) from None
            try:
                header, array = decode_reply(frames)
            except ProtocolError as exc:
                # Only this request is outstanding on the socket (others timed out): an unreadable reply
                # without an id is most likely ours, and reporting it beats waiting for the timeout.
                if exc.request_id in (request_id, None):
                    raise
                continue
            if header.get("id") == request_id:
                return header, array
            # A late reply to a request that already timed out: nobody waits for it any more.
            log.debug("discarding a stale reply for request %r", header.get("id"))

    def _timeout_message(self, socket: zmq.Socket) -> str:
        endpoint = self.endpoints[self._sockets.index(socket)]
        return f"no reply from {endpoint} in time; is the daemon running and reachable?"

    def close(self) -> None:
        """Close the sockets; requests still queued for unreachable endpoints are dropped."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for socket in self._sockets:
                socket.close(linger=0)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


# --------------------------------------------------------------------------------------- async client


class AsyncClient:
    """asyncio client; many concurrent ``infer`` calls may share one instance (and one event loop).

    One reader task per socket routes each reply to the waiting call by its request id, so replies may
    come back in any order; replies nobody waits for (late ones after a timeout) are dropped.
    """

    def __init__(
        self,
        endpoints: str | Sequence[str],
        *,
        timeout: float = 30.0,
        context: zmq.Context | None = None,
        backoff: float = DEFAULT_BACKOFF_S,
    ) -> None:
        self.endpoints = _endpoint_list(endpoints)
        self.timeout = _check_timeout(timeout)
        if context is None:
            async_context: zmq.asyncio.Context = zmq.asyncio.Context.instance()
        elif isinstance(context, zmq.asyncio.Context):
            async_context = context
        else:
            async_context = zmq.asyncio.Context(shadow=context)  # share the caller's I/O threads
        self._sockets: list[zmq.asyncio.Socket] = []
        for endpoint in self.endpoints:
            socket = async_context.socket(zmq.DEALER)
            self._sockets.append(socket)
            _configure(socket, endpoint)
        self._ring = _EndpointRing(len(self.endpoints), backoff)
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[tuple[dict[str, Any], np.ndarray | None]]] = {}
        self._readers: list[asyncio.Task[None]] = []
        self._closed = False

    async def infer(self, array: np.ndarray, *, timeout: float | None = None, dtype: str | None = None) -> np.ndarray:
        """Run the model on ``array`` (first axis = samples); returns one output row per sample.

        ``dtype`` is only needed for bfloat16: pass the raw bits as uint16 with ``dtype="bfloat16"``.
        """
        timeout = self.timeout if timeout is None else _check_timeout(timeout)
        request_id = next(self._ids)
        frames = encode_infer_request(request_id, array, timeout_ms=timeout * 1000, dtype=dtype)
        header, result = await self._request(frames, request_id, timeout)
        return _infer_result(header, result, np.shape(array)[0])

    async def info(self, *, timeout: float | None = None) -> dict[str, Any]:
        """The server's description: versions, model, input dtype/shape, max_batch, plan."""
        timeout = self.timeout if timeout is None else _check_timeout(timeout)
        request_id = next(self._ids)
        header, _ = await self._request(encode_info_request(request_id), request_id, timeout)
        return _info_result(header)

    async def _request(
        self, frames: list[Any], request_id: int, timeout: float
    ) -> tuple[dict[str, Any], np.ndarray | None]:
        if self._closed:
            raise ClientClosed("the client is closed; create a new one")
        self._start_readers()
        index = self._ring.pick()
        reply = asyncio.get_running_loop().create_future()
        self._pending[request_id] = reply
        try:
            async with asyncio.timeout(timeout):
                await self._sockets[index].send_multipart(frames, copy=False)
                result = await reply
        except TimeoutError:
            self._ring.timed_out(index)
            raise ClientTimeout(
                f"no reply from {self.endpoints[index]} in time; is the daemon running and reachable?"
            ) from None
        finally:
            self._pending.pop(request_id, None)
        self._ring.answered(index)
        return result

    def _start_readers(self) -> None:
        # Started on first use, not in __init__, so that the client can be built outside a running loop.
        if not self._readers:
            self._readers = [asyncio.create_task(self._read(socket)) for socket in self._sockets]
            return
        for index, reader in enumerate(self._readers):
            if reader.done():  # it failed (logged below); without a reader every call would time out
                self._readers[index] = asyncio.create_task(self._read(self._sockets[index]))

    async def _read(self, socket: zmq.asyncio.Socket) -> None:
        while True:
            try:
                frames = await socket.recv_multipart(copy=False)
            except zmq.ZMQError:
                if self._closed:
                    return
                log.exception("receiving a reply failed; the reader restarts with the next request")
                raise
            try:
                header, array = decode_reply(frames)
            except ProtocolError as exc:
                self._resolve(exc.request_id, exc)
                continue
            self._resolve(header.get("id"), (header, array))

    def _resolve(self, request_id: Any, outcome: Any) -> None:
        waiter = self._pending.get(request_id) if isinstance(request_id, int) else None
        if waiter is None or waiter.done():
            # Late (its caller timed out) or unattributable: with many requests in flight nobody else
            # can claim it, so it is logged and dropped; the affected caller, if any, times out.
            if isinstance(outcome, ProtocolError):
                log.warning("discarding a reply that breaks the protocol: %s", outcome)
            else:
                log.debug("discarding a reply for request %r that nobody waits for", request_id)
            return
        if isinstance(outcome, BaseException):
            waiter.set_exception(outcome)
        else:
            waiter.set_result(outcome)

    def close(self) -> None:
        """Stop the reader tasks, fail waiting calls with ClientClosed and close the sockets."""
        if self._closed:
            return
        self._closed = True
        for reader in self._readers:
            reader.cancel()
        for waiter in self._pending.values():
            if not waiter.done():
                waiter.set_exception(ClientClosed("the client was closed while this request waited"))
        for socket in self._sockets:
            socket.close(linger=0)

    async def aclose(self) -> None:
        """close(), then wait until the reader tasks have finished."""
        self.close()
        await asyncio.gather(*self._readers, return_exceptions=True)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()
