"""The daemon's metrics port (`ops.metrics_http`) on real sockets: bounded in threads and connections whatever
clients do (idle, slow, oversized), still answering a scrape, and bound to its port alone."""

from __future__ import annotations

import socket
import threading
import time
import urllib.request
from collections.abc import Iterator

import pytest

from packrat_daemon.ops import metrics_http
from packrat_daemon.ops.metrics import Metrics
from packrat_daemon.wire.errors import ConfigError


@pytest.fixture
def metrics() -> Iterator[Metrics]:
    served = Metrics("m")
    served.serve(0)
    yield served
    served.close()


def port_of(metrics: Metrics) -> int:
    assert metrics.server is not None
    return metrics.server.server_address[1]


def scrape(port: int, path: str = "/metrics") -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as reply:
            return reply.status, reply.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def closed_within(sock: socket.socket, seconds: float) -> bool:
    sock.settimeout(seconds)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


@pytest.mark.slow  # 3.4 s waiting for 500 connections, little CPU
def test_500_idle_connections_take_no_thread_and_a_scrape_still_answers(metrics: Metrics) -> None:
    port = port_of(metrics)
    threads = threading.active_count()
    idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(500)]  # 505 threads, before
    try:
        time.sleep(0.3)  # every one accepted (or evicted) by now
        assert threading.active_count() == threads  # the one thread serving them was there before
        status, body = scrape(port)
        assert status == 200 and b"packrat_queued_inputs" in body
        assert scrape(port, "/healthz") == (200, b"ok\n")
        # Only the newest MAX_CONNECTIONS are held; the others were closed as newer ones came.
        assert closed_within(idle[0], 1.0)
    finally:
        for sock in idle:
            sock.close()


def test_a_slow_or_oversized_request_is_let_go(metrics: Metrics, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(metrics_http, "HEAD_TIMEOUT_S", 0.1)
    port = port_of(metrics)
    with socket.create_connection(("127.0.0.1", port)) as slow:
        slow.sendall(b"GET /metrics HTTP/1.1\r\nHost: x")  # and nothing more
        assert closed_within(slow, 2.0)
    with socket.create_connection(("127.0.0.1", port)) as long:
        long.sendall(b"GET /metrics HTTP/1.1\r\nX: " + b"a" * (2 * metrics_http.MAX_HEAD_BYTES))
        assert closed_within(long, 2.0)
    assert scrape(port, "/healthz")[0] == 200


def test_answers_by_path_and_method(metrics: Metrics) -> None:
    port = port_of(metrics)
    assert scrape(port, "/readyz")[0] == 503  # no plan yet
    assert scrape(port, "/nope")[0] == 404
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(b"POST /metrics HTTP/1.1\r\n\r\n")
        assert sock.recv(100).startswith(b"HTTP/1.1 405 ")


def test_a_taken_port_is_a_config_error_naming_it_even_with_so_reuseport() -> None:
    with socket.socket() as taken:
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)  # the holder allows sharing; this server does not
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ConfigError, match=rf"127\.0\.0\.1:{port}: .*choose another --metrics-port"):
            Metrics("m").serve(port)


def test_rebind_moves_the_port_and_keeps_the_old_one_when_the_new_is_taken(metrics: Metrics) -> None:
    first = port_of(metrics)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(ConfigError, match="choose another --metrics-port"):
            metrics.rebind(taken.getsockname()[1], "127.0.0.1")
    assert port_of(metrics) == first and scrape(first, "/healthz")[0] == 200
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        second = probe.getsockname()[1]
    metrics.rebind(second, "127.0.0.1")
    assert scrape(second, "/healthz")[0] == 200
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", first), timeout=1).close()
    metrics.rebind(0, "127.0.0.1")
    assert metrics.server is None
