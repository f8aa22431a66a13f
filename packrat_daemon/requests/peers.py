"""The frontend's clients by connection, so that the requests still queued from a client that disconnected can be
dropped (`Frontend.forget_departed`).

A client that disconnects leaves its queued requests to be computed for nobody (64 requests of 16 inputs held
another client's up for 47 s). Each queued request's connection is known by its descriptor (ZMQ_SRCFD), which the
socket monitor's DISCONNECTED names. ZMQ_ROUTER_NOTIFY would say it directly, but it is a draft option pyzmq's libzmq
lacks.
"""

from __future__ import annotations

import zmq
from zmq.utils.monitor import recv_monitor_message


class Peers:
    def __init__(self, socket: zmq.Socket) -> None:
        self.monitor = socket.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        self._peers: dict[bytes, int] = {}  # a client's identity -> the descriptor its requests came on
        self._connections: dict[int, set[bytes]] = {}  # a descriptor -> the identities seen on it

    def known(self, identity: bytes, descriptor: int) -> bool:
        """Whether `identity`'s requests are known to come on the connection `descriptor`."""
        return self._peers.get(identity) == descriptor

    def note(self, identity: bytes, descriptor: int) -> None:
        """A client's first request on a connection: remember the connection's descriptor. The monitor's events are
        to be taken first (`departed`): a descriptor is reused only after its last connection closed, and that close
        was reported before this connection's first message arrived, so it is never taken for this one's."""
        old = self._peers.get(identity)
        if old is not None:  # the same identity (ZMQ_ROUTING_ID) reconnected: only the new connection is its own
            self._connections.get(old, set()).discard(identity)
        self._peers[identity] = descriptor
        self._connections.setdefault(descriptor, set()).add(identity)

    def departed(self) -> set[bytes]:
        """The identities whose connection closed since the last call, forgotten."""
        gone: set[bytes] = set()
        while self.monitor.poll(0):
            event = recv_monitor_message(self.monitor, zmq.NOBLOCK)
            if event["event"] == zmq.EVENT_DISCONNECTED:
                for identity in self._connections.pop(event["value"], set()):
                    self._peers.pop(identity, None)
                    gone.add(identity)
        return gone

    def close(self) -> None:
        self.monitor.close(linger=0)
