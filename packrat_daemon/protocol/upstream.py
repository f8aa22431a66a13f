"""The gateway's one connection to the daemon: a DEALER speaking Packrat's own protocol (docs/protocol.md),
any number of requests in flight, each reply matched to its request by id.

Unlike `packrat_daemon.wire.client.AsyncClient` it hands back the reply's whole header, whose `timing`
feeds the statistics extension, and it raises nothing for an error reply: the data plane maps the code.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import zmq
from zmq.utils.monitor import recv_monitor_message

from packrat_daemon.wire.client_side import (
    Result,
    decode_reply,
    encode_cancel_request,
    encode_infer_request,
    encode_info_request,
    encode_tensors_request,
)
from packrat_daemon.wire.codec import ProtocolError
from packrat_daemon.wire.curve import ClientKeys
from packrat_daemon.wire.endpoints import allow_ipv6
from packrat_daemon.wire.zmqio import ZERO_COPY_MIN_BYTES

log = logging.getLogger("packrat.oip")

Reply = tuple[dict[str, Any], Result | None]
# How often a blocked handler thread asks whether its gRPC call was cancelled (grpcio tells a thread-pool handler
# only through `is_active()`): a cancelled request leaves the daemon's queue within this.
CANCEL_POLL_S = 0.02


def _infer_frames(
    request_id: int, array: np.ndarray | dict[str, np.ndarray], timeout_s: float, dtype: str | None, client: str | None
) -> list[Any]:
    if isinstance(array, dict):
        return encode_tensors_request(request_id, array, timeout_ms=timeout_s * 1000.0, client=client)
    return encode_infer_request(request_id, array, timeout_ms=timeout_s * 1000.0, dtype=dtype, client=client)


class UpstreamTimeout(Exception):
    """No reply from the daemon in time: it is not running, still starting, or the reply was lost."""


class UpstreamCancelled(Exception):
    """The call's client went away while its request waited: the request was cancelled in the daemon's queue."""


class UpstreamGone(UpstreamTimeout):
    """No connection to the daemon (not started, stopped, restarting), or it went away with the request."""


class Upstream:
    """One DEALER to the daemon's ZeroMQ frontend; replies are read when the loop sees its descriptor readable.

    A plain socket on the loop's own reader rather than zmq.asyncio: this is the request path, and each
    zmq.asyncio call adds futures and a poll of its own. ZeroMQ's descriptor is edge-triggered, so every
    wake-up (and every send, which may take the edge) reads until no message is left.

    The socket's monitor says whether the daemon is connected: while it is not, a request fails at once
    instead of waiting in ZeroMQ's queue for its timeout, and requests in flight when the connection drops
    (the daemon stopped or crashed) fail then.
    """

    def __init__(self, endpoint: str, keys: ClientKeys | None = None, context: zmq.Context | None = None) -> None:
        self.endpoint = endpoint
        self._socket = (context or zmq.Context.instance()).socket(zmq.DEALER)
        if keys is not None:
            keys.apply(self._socket)
        self._socket.setsockopt(zmq.LINGER, 0)
        # Many requests may be in flight (the daemon bounds its queue and answers OVERLOADED past it); these only
        # keep a daemon that is down from growing the gateway without bound: sends then wait, within the timeout.
        self._socket.setsockopt(zmq.SNDHWM, 10_000)
        self._socket.setsockopt(zmq.RCVHWM, 10_000)
        self._monitor = self._socket.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED)
        self.connected = False
        allow_ipv6(self._socket, endpoint)  # a daemon on tcp://[::1]:P, which ZeroMQ refuses without ZMQ_IPV6
        self._socket.connect(endpoint)
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[Reply]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False

    async def infer(
        self,
        array: np.ndarray | dict[str, np.ndarray],
        timeout_s: float,
        dtype: str | None = None,
        client: str | None = None,
    ) -> Reply:
        """The daemon's reply to an infer request of `array`, or of named arrays (protocol version 2; the reply's
        outputs are then named too); the header says ok or the error. Cancelled while it waits (its client left),
        it cancels the request in the daemon's queue (op "cancel"): a request not started is never computed."""
        request_id = next(self._ids)
        frames = _infer_frames(request_id, array, timeout_s, dtype, client)
        try:
            return await self._request(request_id, frames, timeout_s)
        except asyncio.CancelledError:
            if not self._closed:
                self._send(encode_cancel_request(request_id))  # its reply, CANCELLED or the result, finds no waiter
            raise

    async def describe(self, op: str, timeout_s: float) -> dict[str, Any]:
        """The daemon's `info` or `status` reply header."""
        request_id = next(self._ids)
        header, _ = await self._request(request_id, encode_info_request(request_id, op), timeout_s)
        return header

    async def _request(self, request_id: int, frames: list[Any], timeout_s: float) -> Reply:
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            self._loop = loop
            loop.add_reader(self._socket.getsockopt(zmq.FD), self._read)
            loop.add_reader(self._monitor.getsockopt(zmq.FD), self._watch)
            self._watch()
        if not self.connected:
            raise UpstreamGone(f"no connection to the daemon at {self.endpoint}: not started, stopped or restarting")
        waiter: asyncio.Future[Reply] = loop.create_future()
        self._pending[request_id] = waiter
        # A timer on the waiter rather than asyncio.timeout(): no task to cancel, one handle a request.
        timer = loop.call_later(timeout_s, self._expire, waiter, timeout_s)
        try:
            if not self._send(frames):
                await self._send_when_there_is_room(frames, waiter)
            self._read()  # the send may have taken the descriptor's edge for a reply already here
            return await waiter
        finally:
            timer.cancel()
            self._pending.pop(request_id, None)

    def _send(self, frames: list[Any]) -> bool:
        """Send at once if ZeroMQ has room (it nearly always has); False if its queue is full."""
        # Zero-copy only for a big tensor: for a small one pyzmq's tracked frames (released through its
        # garbage-collector thread) cost far more than the copy.
        large = len(frames) > 1 and len(frames[-1]) >= ZERO_COPY_MIN_BYTES
        try:
            self._socket.send_multipart(frames, zmq.NOBLOCK, copy=not large)
        except zmq.Again:
            return False
        return True

    async def _send_when_there_is_room(self, frames: list[Any], waiter: asyncio.Future[Reply]) -> None:
        # 10 000 requests queued for a daemon that does not read them: wait, until the request's own timeout.
        while not waiter.done():
            await asyncio.sleep(0.01)
            if self._send(frames):
                return

    def _expire(self, waiter: asyncio.Future[Reply], timeout_s: float) -> None:
        if not waiter.done():
            waiter.set_exception(UpstreamTimeout(f"no reply from the daemon at {self.endpoint} within {timeout_s:g} s"))

    def _read(self) -> None:
        socket = self._socket
        while not self._closed and socket.getsockopt(zmq.EVENTS) & zmq.POLLIN:
            frames = socket.recv_multipart(zmq.NOBLOCK, copy=False)
            try:
                reply: Reply = decode_reply(frames)
            except ProtocolError as exc:
                log.warning("dropping a reply from the daemon that breaks its protocol: %s", exc)
                continue
            request_id = reply[0].get("id")
            waiter = self._pending.get(request_id) if isinstance(request_id, int) else None
            if waiter is not None and not waiter.done():
                waiter.set_result(reply)

    def _watch(self) -> None:
        monitor = self._monitor
        while not self._closed and monitor.getsockopt(zmq.EVENTS) & zmq.POLLIN:
            event = recv_monitor_message(monitor, zmq.NOBLOCK)["event"]
            self.connected = event == zmq.EVENT_HANDSHAKE_SUCCEEDED
            if not self.connected:
                gone = UpstreamGone(f"the daemon at {self.endpoint} went away while this request was in flight")
                for waiter in self._pending.values():
                    if not waiter.done():
                        waiter.set_exception(gone)
                log.warning("lost the connection to the daemon at %s", self.endpoint)

    def close(self) -> None:
        self._closed = True
        if self._loop is not None and not self._loop.is_closed():
            self._loop.remove_reader(self._socket.getsockopt(zmq.FD))
            self._loop.remove_reader(self._monitor.getsockopt(zmq.FD))
        self._socket.disable_monitor()
        self._monitor.close(linger=0)
        self._socket.close(linger=0)


class ThreadUpstreams:
    """A DEALER to the daemon for each thread that asks (the threaded gRPC server's handlers), each used blocking.

    A handler thread then sends its request and waits for the reply itself: no hop through the event loop. Each
    socket watches its own connection, as `Upstream` does: a request on a socket with no connection is refused at
    once (after waiting for a first handshake while the loop's own `Upstream` says the daemon is there), and one in
    flight when the connection drops fails then.
    """

    def __init__(
        self, endpoint: str, keys: ClientKeys | None, shared: Upstream, context: zmq.Context | None = None
    ) -> None:
        self.endpoint = endpoint
        self._keys = keys
        self._shared = shared  # the loop's connection: whether the daemon is there at all
        self._context = context or zmq.Context.instance()
        self._local = threading.local()
        self._lock = threading.Lock()
        self._all: list[BlockingUpstream] = []
        self._closed = False

    def mine(self) -> BlockingUpstream:
        """The calling thread's connection, made on its first request."""
        upstream: BlockingUpstream | None = getattr(self._local, "upstream", None)
        if self._closed:
            raise UpstreamGone("the gateway is stopping")
        if upstream is None:
            with self._lock:
                if self._closed:
                    raise UpstreamGone("the gateway is stopping")
                upstream = BlockingUpstream(self.endpoint, self._keys, self._shared, self._context)
                self._all.append(upstream)
            self._local.upstream = upstream
        return upstream

    def close(self) -> None:
        """Close every thread's socket, once the gRPC server has stopped. A socket is used by its thread alone: one
        whose handler still waits for the daemon (past the server's grace) is left to the process's exit."""
        with self._lock:
            self._closed = True
            for upstream in self._all:
                if not upstream.busy:
                    upstream.close()
            self._all.clear()


class BlockingUpstream:
    """One thread's DEALER to the daemon: send, then wait on the socket and its monitor for the reply."""

    # How long a fresh socket waits for its first handshake while the daemon is known to be there.
    FIRST_HANDSHAKE_S = 2.0

    def __init__(self, endpoint: str, keys: ClientKeys | None, shared: Upstream, context: zmq.Context) -> None:
        self.endpoint = endpoint
        self._shared = shared
        self._socket = context.socket(zmq.DEALER)
        if keys is not None:
            keys.apply(self._socket)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._monitor = self._socket.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED)
        allow_ipv6(self._socket, endpoint)
        self._socket.connect(endpoint)
        self._poller = zmq.Poller()
        self._poller.register(self._socket, zmq.POLLIN)
        self._poller.register(self._monitor, zmq.POLLIN)
        self.connected = False
        self.busy = False  # a request of its thread is in flight
        self._ids = itertools.count(1)

    def infer(
        self,
        array: np.ndarray | dict[str, np.ndarray],
        timeout_s: float,
        dtype: str | None = None,
        client: str | None = None,
        cancelled: Callable[[], bool] | None = None,
    ) -> Reply:
        """As `Upstream.infer`, blocking the calling thread; `cancelled()` (the gRPC call's client gone) is asked
        every CANCEL_POLL_S while it waits: once true, the request is cancelled in the daemon's queue and
        `UpstreamCancelled` raised."""
        self.busy = True
        try:
            return self._infer(array, timeout_s, dtype, client, cancelled)
        finally:
            self.busy = False

    def _infer(
        self,
        array: np.ndarray | dict[str, np.ndarray],
        timeout_s: float,
        dtype: str | None,
        client: str | None,
        cancelled: Callable[[], bool] | None,
    ) -> Reply:
        deadline = time.monotonic() + timeout_s
        request_id = next(self._ids)
        if cancelled is not None and cancelled():  # cancelled while it waited for a handler thread: never sent
            raise UpstreamCancelled("the client cancelled the call")
        frames = _infer_frames(request_id, array, timeout_s, dtype, client)
        self._watch()
        if not self.connected:
            self._first_handshake(min(deadline, time.monotonic() + self.FIRST_HANDSHAKE_S))
        large = len(frames) > 1 and len(frames[-1]) >= ZERO_COPY_MIN_BYTES  # as Upstream._send
        while True:
            try:
                self._socket.send_multipart(frames, zmq.NOBLOCK, copy=not large)
                break
            except zmq.Again:  # ZeroMQ's queue is full: wait for room, within the timeout
                if time.monotonic() >= deadline:
                    raise self._timeout(timeout_s) from None
                time.sleep(0.01)
        socket = self._socket
        while True:
            while socket.getsockopt(zmq.EVENTS) & zmq.POLLIN:
                reply = self._decode(socket.recv_multipart(zmq.NOBLOCK, copy=False))
                if reply is not None and reply[0].get("id") == request_id:
                    return reply
                # else: the late reply to an earlier request of this thread that timed out
            left = deadline - time.monotonic()
            if left <= 0:
                raise self._timeout(timeout_s)
            if cancelled is not None and cancelled():
                # Its reply (CANCELLED, or the result if it had started) is skipped by the next request's wait.
                self._socket.send_multipart(encode_cancel_request(request_id), zmq.NOBLOCK)
                raise UpstreamCancelled("the client cancelled the call")
            wait_s = left if cancelled is None else min(left, CANCEL_POLL_S)
            ready = dict(self._poller.poll(max(1, math.ceil(wait_s * 1000.0))))
            if self._monitor in ready:
                self._watch()
                if not self.connected:
                    raise UpstreamGone(f"the daemon at {self.endpoint} went away while this request was in flight")

    def _first_handshake(self, until: float) -> None:
        while not self.connected:
            left = until - time.monotonic()
            if not self._shared.connected or left <= 0:
                raise UpstreamGone(
                    f"no connection to the daemon at {self.endpoint}: not started, stopped or restarting"
                )
            if self._monitor.poll(max(1, math.ceil(min(left, 0.05) * 1000.0))):
                self._watch()

    def _watch(self) -> None:
        monitor = self._monitor
        while monitor.getsockopt(zmq.EVENTS) & zmq.POLLIN:
            self.connected = recv_monitor_message(monitor, zmq.NOBLOCK)["event"] == zmq.EVENT_HANDSHAKE_SUCCEEDED

    def _timeout(self, timeout_s: float) -> UpstreamTimeout:
        return UpstreamTimeout(f"no reply from the daemon at {self.endpoint} within {timeout_s:g} s")

    @staticmethod
    def _decode(frames: list[Any]) -> Reply | None:
        try:
            return decode_reply(frames)
        except ProtocolError as exc:
            log.warning("dropping a reply from the daemon that breaks its protocol: %s", exc)
            return None

    def close(self) -> None:
        self._socket.disable_monitor()
        self._monitor.close(linger=0)
        self._socket.close(linger=0)
