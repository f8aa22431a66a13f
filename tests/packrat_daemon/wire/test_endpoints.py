"""The client's endpoint ring: round robin, back-off after a timeout or a draining daemon, and the best
bet when every endpoint is in back-off."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import zmq

from packrat_daemon.wire.endpoints import EndpointRing, allow_ipv6, is_ipv6_endpoint

LONG = 3600.0  # a back-off that cannot run out during a test
OK = {"v": 1, "id": 1, "ok": True}
DRAINING = {"v": 1, "id": 1, "ok": False, "error": {"code": "SHUTTING_DOWN", "message": "draining"}}  # as decoded


def picks(ring: EndpointRing, count: int) -> list[int]:
    return [ring.pick() for _ in range(count)]


def test_endpoints_take_turns() -> None:
    assert picks(EndpointRing(3, LONG), 7) == [0, 1, 2, 0, 1, 2, 0]


def test_one_endpoint_is_always_picked_even_in_back_off() -> None:
    ring = EndpointRing(1, LONG)
    ring.timed_out(0)
    assert picks(ring, 3) == [0, 0, 0]


def test_an_endpoint_that_timed_out_is_skipped_until_it_answers() -> None:
    ring = EndpointRing(3, LONG)
    ring.timed_out(1)
    assert picks(ring, 4) == [0, 2, 0, 2]
    ring.answered(1, OK)  # a late reply from it: back in the ring
    assert picks(ring, 3) == [0, 1, 2]


def test_a_draining_daemon_is_skipped_and_an_error_of_another_kind_is_not() -> None:
    ring = EndpointRing(2, LONG)
    ring.answered(0, DRAINING)
    assert picks(ring, 3) == [1, 1, 1]
    overloaded = {"ok": False, "error": {"code": "OVERLOADED", "message": "queue full"}}
    ring.answered(0, overloaded)  # busy, not going away: still worth asking
    assert sorted(picks(ring, 2)) == [0, 1]


def test_with_every_endpoint_in_back_off_the_one_that_waited_longest_is_picked() -> None:
    ring = EndpointRing(3, LONG)
    for index in (2, 0, 1):  # 2 timed out first, so its back-off ends first
        ring.timed_out(index)
    assert ring.pick() == 2
    assert ring.pick() == 2  # still the best bet: the turn does not move past it


def test_a_back_off_of_zero_skips_nothing() -> None:
    ring = EndpointRing(2, 0.0)
    ring.timed_out(0)
    assert picks(ring, 2) == [0, 1]


# -- IPv6 addresses --------------------------------------------------------------------------------------
def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError:
        return False
    return True


@pytest.mark.parametrize(
    ("endpoint", "ipv6"),
    [("tcp://[::1]:5555", True), ("tcp://[::]:5555", True), ("tcp://[fe80::1%eth0]:5555", True),
     ("tcp://127.0.0.1:5555", False), ("tcp://*:5555", False), ("tcp://localhost:5555", False),
     ("ipc:///run/x.ipc", False), ("inproc://[::1]:1", False)],
)  # fmt: skip
def test_which_endpoints_are_ipv6(endpoint: str, ipv6: bool) -> None:
    assert is_ipv6_endpoint(endpoint) is ipv6


@pytest.mark.skipif(not _ipv6_loopback(), reason="no IPv6 loopback here")
def test_a_server_and_client_on_ipv6_loopback_talk() -> None:
    # Before: binding tcp://[::1]:P failed with "No such device ... free the port".
    context = zmq.Context()
    server = context.socket(zmq.ROUTER)
    try:
        server.setsockopt(zmq.LINGER, 0)
        allow_ipv6(server, "tcp://[::1]:1")
        port = server.bind_to_random_port("tcp://[::1]")
        endpoint = f"tcp://[::1]:{port}"
        client = context.socket(zmq.DEALER)
        client.setsockopt(zmq.LINGER, 0)
        allow_ipv6(client, endpoint)
        client.connect(endpoint)
        client.send(b"hello")
        assert server.poll(5000) and server.recv_multipart()[-1] == b"hello"
        client.close()
    finally:
        server.close()
        context.term()


@pytest.mark.skipif(not _ipv6_loopback(), reason="no IPv6 loopback here")
def test_the_start_up_bind_check_takes_an_ipv6_endpoint() -> None:
    from packrat_daemon.ops.hardening import check_endpoint

    with socket.socket(socket.AF_INET6) as free:
        free.bind(("::1", 0))
        port = free.getsockname()[1]
    context = zmq.Context()
    try:
        check_endpoint(context, f"tcp://[::1]:{port}")  # raised ConfigError "No such device" before
    finally:
        context.term()


@pytest.mark.slow
@pytest.mark.skipif(not _ipv6_loopback(), reason="no IPv6 loopback here")
def test_a_daemon_serves_on_ipv6_loopback(tmp_path: Path) -> None:
    import numpy as np

    from packrat_daemon.wire.client import Client
    from tests.helpers.daemons import running_daemon

    with socket.socket(socket.AF_INET6) as free:
        free.bind(("::1", 0))
        port = free.getsockname()[1]
    args = ("--model", "builtin:tiny-mlp", "--policy", "fixed", "--plan", "1x1", "--max-batch", "2")
    endpoint = f"tcp://[::1]:{port}"
    with running_daemon(tmp_path, *args, bind=endpoint), Client(endpoint, timeout=30) as client:
        assert client.infer(np.zeros((1, 16), dtype=np.float32)).shape[0] == 1
