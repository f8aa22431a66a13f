"""Packrat client library: send tensors to one or more Packrat daemons over ZeroMQ and get results back.

    with Client("tcp://127.0.0.1:5555") as client:
        logits = client.infer(batch)          # batch.shape[0] samples in, as many rows out
        outputs = client.infer({"input_ids": ids, "attention_mask": mask})  # named inputs; named outputs

The client speaks protocol versions 1 (one array) and 2 (named arrays; docs/protocol.md) over one DEALER
socket per endpoint and spreads requests round-robin across endpoints. It never imports torch, so it starts
in milliseconds.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

import zmq
import zmq.asyncio

from packrat_daemon.wire.client_base import DEFAULT_BACKOFF_S, ClientBase, Inputs, ceil_ms, sample_count
from packrat_daemon.wire.client_side import (
    Result,
    decode_reply,
    infer_result,
    info_result,
    server_error,
)
from packrat_daemon.wire.codec import ProtocolError
from packrat_daemon.wire.curve import KeyPair
from packrat_daemon.wire.errors import (
    BadRequest,
    Cancelled,
    ClientClosed,
    ClientTimeout,
    InternalError,
    Overloaded,
    ServerError,
    ServerTimeout,
    ShuttingDown,
    TooLarge,
    UnsupportedVersion,
)
from packrat_daemon.wire.zmqio import NOBLOCK, recv_frames, send_frames

log = logging.getLogger(__name__)

__all__ = [
    "AsyncClient",
    "BadRequest",
    "Cancelled",
    "Client",
    "ClientClosed",
    "ClientTimeout",
    "InternalError",
    "KeyPair",
    "Overloaded",
    "ServerError",
    "ServerTimeout",
    "ShuttingDown",
    "TooLarge",
    "UnsupportedVersion",
    "server_error",
]

# ------------------------------------------------------------------------------------ blocking client


class Client(ClientBase):
    """Blocking client. Thread-safe: concurrent calls are serialised; use AsyncClient for concurrency.

    ``timeout`` (seconds) bounds each call and is also sent to the server as the request's
    ``timeout_ms``, so the server drops work whose answer nobody waits for any more.

    For a daemon that serves CURVE (docs/security.md), ``key`` is this client's ``.key_secret`` file
    (or a ``KeyPair``) and ``server_key`` the server's public ``.key`` file (or its 40 Z85 characters).
    """

    def __init__(
        self,
        endpoints: str | Sequence[str],
        *,
        timeout: float = 30.0,
        context: zmq.Context | None = None,
        backoff: float = DEFAULT_BACKOFF_S,
        key: str | os.PathLike[str] | KeyPair | None = None,
        server_key: str | os.PathLike[str] | bytes | None = None,
    ) -> None:
        context = context if context is not None else zmq.Context.instance()
        super().__init__(endpoints, timeout, context, backoff, key, server_key)
        self._lock = threading.Lock()
        self._receive_timeout_ms = [-1] * len(self._sockets)  # RCVTIMEO as last set, per socket

    def infer(
        self, array: Inputs, *, timeout: float | None = None, dtype: str | Mapping[str, str] | None = None
    ) -> Result:
        """Run the model on ``array`` (first axis = samples); returns one output row per sample.

        ``array`` is one array (a model of one input), or a dict of arrays by input name (any model; each counts
        the same samples). A model of several outputs answers a dict of arrays by output name when given a dict;
        one array in gets its first output, as protocol version 1 carries one. ``dtype`` is only needed for
        bfloat16: pass the raw bits as uint16 with ``dtype="bfloat16"`` (for named arrays, a dict by name).
        """
        header, result = self._request(*self._infer_request(array, timeout, dtype))
        return infer_result(header, result, sample_count(array))

    def info(self, *, timeout: float | None = None) -> dict[str, Any]:
        """The server's description: versions, model, input dtype/shape, max_batch, plan."""
        header, _ = self._request(*self._info_request(timeout))
        return info_result(header)

    def status(self, *, timeout: float | None = None) -> dict[str, Any]:
        """`info` plus the live state: workers, batch sizes, queue, profile provenance, plan history."""
        header, _ = self._request(*self._info_request(timeout, "status"))
        return info_result(header)

    def _request(self, frames: list[Any], request_id: int, timeout: float) -> tuple[dict[str, Any], Result | None]:
        deadline = time.monotonic() + timeout
        with self._lock:
            self._check_open()
            index = self._ring.pick()
            try:
                self._send(index, frames, deadline, timeout)
                reply = self._receive(index, request_id, deadline, timeout)
            except ClientTimeout:
                self._ring.timed_out(index)
                raise
            self._ring.answered(index, reply[0])
            return reply

    def _send(self, index: int, frames: list[Any], deadline: float, timeout: float) -> None:
        socket = self._sockets[index]
        while True:
            try:
                send_frames(socket, frames, NOBLOCK, copy=False)
                return
            except zmq.Again:
                # The endpoint's queue is full (high-water mark): wait for room, within the deadline.
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not socket.poll(ceil_ms(remaining), zmq.POLLOUT):
                    raise self._no_reply(index, timeout) from None

    def _receive(
        self, index: int, request_id: int, deadline: float, timeout: float
    ) -> tuple[dict[str, Any], Result | None]:
        socket = self._sockets[index]
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise self._no_reply(index, timeout)
            # A receive that blocks up to the deadline, not poll-then-receive: one wake-up per reply. The
            # timeout is set only when it changes (calls with the same timeout round to the same ms).
            wait_ms = max(1, ceil_ms(remaining))
            if wait_ms != self._receive_timeout_ms[index]:
                socket.setsockopt(zmq.RCVTIMEO, wait_ms)
                self._receive_timeout_ms[index] = wait_ms
            try:
                frames = recv_frames(socket)
            except zmq.Again:
                raise self._no_reply(index, timeout) from None
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


class AsyncClient(ClientBase):
    """asyncio client; many concurrent ``infer`` calls may share one instance (and one event loop).

    One reader task per socket routes each reply to the waiting call by its request id, so replies may
    come back in any order; replies nobody waits for (late ones after a timeout) are dropped.
    ``context`` may be a ``zmq.asyncio.Context`` or a plain one, whose I/O threads it then shares.
    ``key`` and ``server_key``: as for ``Client``.
    """

    def __init__(
        self,
        endpoints: str | Sequence[str],
        *,
        timeout: float = 30.0,
        context: zmq.asyncio.Context | zmq.Context | None = None,
        backoff: float = DEFAULT_BACKOFF_S,
        key: str | os.PathLike[str] | KeyPair | None = None,
        server_key: str | os.PathLike[str] | bytes | None = None,
    ) -> None:
        if context is None:
            async_context: zmq.asyncio.Context = zmq.asyncio.Context.instance()
        elif isinstance(context, zmq.asyncio.Context):
            async_context = context
        else:
            async_context = zmq.asyncio.Context(shadow=context)  # share the caller's I/O threads
        super().__init__(endpoints, timeout, async_context, backoff, key, server_key)
        self._pending: dict[int, asyncio.Future[tuple[dict[str, Any], Result | None]]] = {}
        self._readers: list[asyncio.Task[None]] = []

    async def infer(
        self, array: Inputs, *, timeout: float | None = None, dtype: str | Mapping[str, str] | None = None
    ) -> Result:
        """As `Client.infer`, awaited."""
        header, result = await self._request(*self._infer_request(array, timeout, dtype))
        return infer_result(header, result, sample_count(array))

    async def info(self, *, timeout: float | None = None) -> dict[str, Any]:
        """The server's description: versions, model, input dtype/shape, max_batch, plan."""
        header, _ = await self._request(*self._info_request(timeout))
        return info_result(header)

    async def status(self, *, timeout: float | None = None) -> dict[str, Any]:
        """`info` plus the live state: workers, batch sizes, queue, profile provenance, plan history."""
        header, _ = await self._request(*self._info_request(timeout, "status"))
        return info_result(header)

    async def _request(
        self, frames: list[Any], request_id: int, timeout: float
    ) -> tuple[dict[str, Any], Result | None]:
        self._check_open()
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
            raise self._no_reply(index, timeout) from None
        finally:
            self._pending.pop(request_id, None)
        self._ring.answered(index, result[0])
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
