"""Which endpoint a client sends its next request to, and what a socket needs for an endpoint's address."""

from __future__ import annotations

import time
from typing import Any

import zmq

from packrat_daemon.wire.codec import ErrorCode


def is_ipv6_endpoint(endpoint: str) -> bool:
    """True for tcp:// with an IPv6 address, bracketed as ZeroMQ writes it (tcp://[::1]:5555, tcp://[::]:5555)."""
    transport, _, address = endpoint.partition("://")
    host = address.rpartition(":")[0]
    return transport == "tcp" and host.startswith("[") and ":" in host


def allow_ipv6(socket: zmq.Socket, endpoint: str) -> None:
    """Let `socket` bind or connect to `endpoint` when its address is IPv6: ZeroMQ sockets are IPv4-only unless
    told (ZMQ_IPV6), and otherwise refuse tcp://[::1]:P with the misleading "No such device". Only then: IPV6
    on a tcp://*:P bind would make it dual-stack, which fails where IPv6 is disabled."""
    if is_ipv6_endpoint(endpoint):
        socket.setsockopt(zmq.IPV6, 1)


class EndpointRing:
    """Round-robin over endpoints, skipping those in back-off (after a timeout, or a SHUTTING_DOWN reply: that
    daemon is draining) while others remain."""

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

    def answered(self, index: int, header: dict[str, Any]) -> None:
        """A reply came; one that says the daemon is draining sends the next requests to the others first."""
        error = header.get("error")
        draining = isinstance(error, dict) and error.get("code") == ErrorCode.SHUTTING_DOWN
        self._skip_until[index] = time.monotonic() + self._backoff if draining else 0.0
