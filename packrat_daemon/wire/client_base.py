"""What the blocking and the asyncio clients share: endpoints, sockets (CURVE when keys are given),
timeouts, request ids and the encoding of requests. `packrat_daemon.wire.client` builds on it."""

from __future__ import annotations

import itertools
import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import zmq

from packrat_daemon.wire.client_side import encode_infer_request, encode_info_request, encode_tensors_request
from packrat_daemon.wire.curve import ClientKeys, KeyPair
from packrat_daemon.wire.endpoints import EndpointRing, allow_ipv6
from packrat_daemon.wire.errors import BadEndpoint, ClientClosed, ClientTimeout

# How long an endpoint that timed out is skipped while other endpoints remain.
DEFAULT_BACKOFF_S = 1.0
# Bounded queues: a client that outruns a dead endpoint blocks (and times out) instead of growing.
_HWM = 1000


def check_timeout(timeout: float) -> float:
    if not timeout > 0 or not math.isfinite(timeout):
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    return timeout


def ceil_ms(seconds: float) -> int:
    return max(0, math.ceil(seconds * 1000))


def sample_count(array: Any) -> int:
    if type(array) is np.ndarray:
        return array.shape[0]
    if isinstance(array, Mapping):  # named inputs: each counts the same samples (encode_tensors_request checks)
        return np.shape(next(iter(array.values())))[0] if array else 0
    return np.shape(array)[0]


# What `infer` takes: one array (protocol version 1), or named arrays (version 2).
Inputs = np.ndarray | Mapping[str, np.ndarray]


class ClientBase:
    """Endpoints, their sockets and round robin, the default timeout and request ids: what the blocking
    and the asyncio client share. Each adds how it sends a request and waits for its reply."""

    def __init__(
        self,
        endpoints: str | Sequence[str],
        timeout: float,
        context: zmq.Context,
        backoff: float,
        key: str | os.PathLike[str] | KeyPair | None,
        server_key: str | os.PathLike[str] | bytes | None,
    ) -> None:
        self.endpoints = [endpoints] if isinstance(endpoints, str) else list(endpoints)
        if not self.endpoints:
            raise ValueError("give at least one endpoint, e.g. 'tcp://127.0.0.1:5555'")
        if (key is None) != (server_key is None):
            raise ValueError(
                "CURVE needs both: key (this client's .key_secret file) and server_key (the server's .key)"
            )
        self.timeout = timeout
        self._keys = None if key is None or server_key is None else ClientKeys.load(key, server_key)
        self._sockets: list[Any] = [self._connect(context, endpoint, self._keys) for endpoint in self.endpoints]
        self._ring = EndpointRing(len(self.endpoints), backoff)
        self._ids = itertools.count(1)
        self._closed = False

    @staticmethod
    def _connect(context: zmq.Context, endpoint: str, keys: ClientKeys | None) -> zmq.Socket:
        socket = context.socket(zmq.DEALER)
        if keys is not None:
            keys.apply(socket)
        # LINGER 0: closing must not hang on requests queued for an endpoint that is down.
        socket.setsockopt(zmq.LINGER, 0)
        socket.setsockopt(zmq.SNDHWM, _HWM)
        socket.setsockopt(zmq.RCVHWM, _HWM)
        allow_ipv6(socket, endpoint)
        try:
            socket.connect(endpoint)
        except zmq.ZMQError as exc:
            socket.close()
            raise BadEndpoint(
                f"cannot connect to endpoint {endpoint!r}: {exc}; give tcp://HOST:PORT, ipc://PATH or inproc://NAME"
            ) from None
        return socket

    @property
    def timeout(self) -> float:
        """Seconds each call waits by default (also sent to the server as the request's ``timeout_ms``)."""
        return self._timeout

    @timeout.setter
    def timeout(self, seconds: float) -> None:
        self._timeout = check_timeout(seconds)
        self._timeout_ms = self._timeout * 1000  # what every request header carries, computed once

    def _infer_request(
        self, array: Inputs, timeout: float | None, dtype: str | Mapping[str, str] | None
    ) -> tuple[list[Any], int, float]:
        """``(frames, request_id, timeout)`` of one infer call: version 1 for one array, 2 for named arrays."""
        if timeout is None:
            timeout, timeout_ms = self._timeout, self._timeout_ms
        else:
            timeout = check_timeout(timeout)
            timeout_ms = timeout * 1000
        request_id = next(self._ids)
        if type(array) is not np.ndarray and isinstance(array, Mapping):  # (the type first: one array is the hot path)
            dtypes = dtype if isinstance(dtype, Mapping) else None
            return encode_tensors_request(request_id, array, timeout_ms, dtypes=dtypes), request_id, timeout
        if dtype is not None and isinstance(dtype, Mapping):
            raise ValueError("dtype= as a dict names the dtypes of named arrays; for one array give one dtype name")
        return encode_infer_request(request_id, array, timeout_ms=timeout_ms, dtype=dtype), request_id, timeout

    def _info_request(self, timeout: float | None, op: str = "info") -> tuple[list[Any], int, float]:
        """``(frames, request_id, timeout)`` of one info (or status) call."""
        timeout = self._timeout if timeout is None else check_timeout(timeout)
        request_id = next(self._ids)
        return encode_info_request(request_id, op), request_id, timeout

    def _check_open(self) -> None:
        if self._closed:
            raise ClientClosed("the client is closed; create a new one")

    def _no_reply(self, index: int, timeout: float) -> ClientTimeout:
        # A CURVE handshake that fails is silent by design: the client only ever sees no reply.
        keys = "; does it know this client's key, and is server_key its key?" if self._keys else ""
        # The timeout first: a call given less time than the model takes looks like a daemon that is down.
        return ClientTimeout(
            f"no reply from {self.endpoints[index]} within the call's timeout of {timeout:g} s; if the model takes "
            f"longer, give a larger timeout (timeout=SECONDS); else, is the daemon running and reachable{keys}?"
        )
