"""The REST gateway's limits (`protocol.http_server`, `protocol.rest_body`, docs/oip.md "Limits"), on real sockets
against the real server: `http_server.rest_server` (uvicorn with the bounded httptools protocol) serving a real
`RestApp` on a socket bound as the gateway binds it, its loop in a thread of this process. The model is known to
the data plane from the start, so an infer request's body is read; the daemon is a stand-in that echoes (for the
one request that must be answered 200), or no daemon at all (its requests end 503 once their body is read)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gzip
import json
import select
import socket
import threading
import time
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from packrat_daemon.protocol import http_server
from packrat_daemon.protocol.dataplane import DataPlane
from packrat_daemon.protocol.errors import OipError
from packrat_daemon.protocol.gateway import GatewayOptions, bound
from packrat_daemon.protocol.limits import GatewayLimits
from packrat_daemon.protocol.model import ModelSpec, TensorSpec
from packrat_daemon.protocol.rest import MAX_TIMEOUT_US, RestApp, parse_infer_request
from packrat_daemon.protocol.upstream import Upstream
from packrat_daemon.wire.errors import ConfigError

MODEL = "tiny"
SPEC = ModelSpec(
    MODEL, "builtin:tiny", "torch", (TensorSpec("input", "FP32", (4,)),), (TensorSpec("output", "FP32", (4,)),),
    max_batch=4, max_message_bytes=4 << 20, instances=1,
)  # fmt: skip
INFER = f"/v2/models/{MODEL}/infer"


class Served:
    """`rest_server` on a loop in a thread, with `limits`; `refusals` lists what the server refused, by reason."""

    def __init__(self, endpoint: str, limits: GatewayLimits, spec: ModelSpec | None = SPEC) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.refusals: list[str] = []
        self.limits = limits
        self.endpoint = endpoint
        self.spec = spec
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(10)

    async def _start(self) -> None:
        self.upstream = Upstream(self.endpoint, None)
        self.plane = DataPlane(self.upstream, MODEL, timeout_s=2.0)
        self.plane.spec = self.spec  # known from the start: no warm-up needed to read an infer's body
        self.app = RestApp(self.plane, self.limits)
        sock = bound("127.0.0.1", 0)
        self.port = sock.getsockname()[1]
        options = GatewayOptions(connect=self.endpoint, http_port=self.port, limits=self.limits)
        self.server = http_server.rest_server(self.app, options, 1.0, self.refusals.append)
        self.task = asyncio.create_task(self.server.serve(sockets=[sock]))
        while not self.server.started:
            await asyncio.sleep(0.005)

    async def _stop(self) -> None:
        self.server.should_exit = True
        await self.task
        self.upstream.close()

    def stop(self) -> None:
        self.stop_soon()
        self.wait_stopped()

    def stop_soon(self) -> None:
        """Ask the server to stop, and return: uvicorn's own stop takes 0.1-0.2 s, idle (its loop looks every 0.1 s,
        then gives the connections 0.1 s), which the `serve` fixture lets pass while the next test runs."""
        self.stopping = asyncio.run_coroutine_threadsafe(self._stop(), self.loop)

    def wait_stopped(self) -> None:
        self.stopping.result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()

    def connect(self) -> socket.socket:
        sock = socket.create_connection(("127.0.0.1", self.port), timeout=5)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock


Serve = Callable[..., "Served"]
STOPPING: list[Served] = []  # servers asked to stop after their test, waited for at the module's end


@pytest.fixture(scope="module", autouse=True)
def _servers_stopped() -> Iterator[None]:
    yield
    while STOPPING:
        STOPPING.pop().wait_stopped()


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Serve]:
    """`serve(**limits)`: a server with those limits changed; asked to stop after the test (its own clients have
    closed by then), and waited for at the module's end."""
    started: list[Served] = []

    def start(**changes: Any) -> Served:
        served = Served(f"ipc://{tmp_path}/none.ipc", dataclasses.replace(GatewayLimits(), **changes))
        started.append(served)
        return served

    yield start
    for served in started:
        served.stop_soon()
        STOPPING.append(served)


def head(path: str = INFER, method: str = "POST", **headers: object) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: test"] + [f"{k.replace('_', '-')}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def answer(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """One response: (status, headers, body); the body by its Content-Length."""
    data = b""
    while b"\r\n\r\n" not in data:
        more = sock.recv(65536)
        assert more, f"the connection closed without an answer after {data!r}"
        data += more
    top, _, body = data.partition(b"\r\n\r\n")
    status_line, *lines = top.decode("latin-1").split("\r\n")
    headers = {name.lower(): value.strip() for name, _, value in (line.partition(":") for line in lines)}
    while len(body) < int(headers.get("content-length", 0)):
        more = sock.recv(65536)
        assert more
        body += more
    return int(status_line.split()[1]), headers, body


def closed_by_server(sock: socket.socket, within_s: float) -> bool:
    """True if the server closes (EOF or reset) within `within_s`; whatever else it sends is read and dropped."""
    sock.settimeout(within_s)
    deadline = time.monotonic() + within_s
    try:
        while time.monotonic() < deadline:
            if not sock.recv(65536):
                return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False
    return False


def infer_body(samples: int = 1) -> bytes:
    tensor = {"name": "input", "datatype": "FP32", "shape": [samples, 4], "data": [0.5] * (4 * samples)}
    return json.dumps({"inputs": [tensor]}).encode()


# -- the head --------------------------------------------------------------------------------------------------
def test_a_head_streamed_without_end_is_answered_431_holding_about_its_limit(serve: Serve) -> None:
    served = serve(header_bytes=16 << 10)
    with served.connect() as sock:
        sock.sendall(b"POST " + INFER.encode() + b" HTTP/1.1\r\nHost: test\r\nX-Long: ")
        tracemalloc.start()
        try:
            sent = 0
            while sent < 4 << 20:  # 4 MiB of one header value, 64 KiB at a time: accepted to the end before
                try:
                    sock.sendall(b"a" * (64 << 10))
                except (BrokenPipeError, ConnectionResetError):
                    break
                sent += 64 << 10
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        status, headers, body = answer(sock)
    assert status == 431 and headers["connection"] == "close"
    assert json.loads(body) == {"error": f"the request head is over {16 << 10} bytes"}
    # The server's part (this process's): the head up to its limit, plus one read of the socket (256 KiB).
    assert peak < 1 << 20, peak
    assert served.refusals == ["header_bytes"]


def test_a_head_within_the_limit_is_served(serve: Serve) -> None:
    served = serve(header_bytes=16 << 10)
    padding = "a" * ((16 << 10) - 200)
    with served.connect() as sock:
        sock.sendall(head("/v2/health/live", "GET", x_padding=padding))
        assert answer(sock)[0] == 200
        sock.sendall(head("/v2/health/live", "GET"))  # the same connection, kept alive
        assert answer(sock)[0] == 200


def test_a_head_of_too_many_fields_is_answered_431(serve: Serve) -> None:
    served = serve(header_fields=20)
    with served.connect() as sock:
        sock.sendall(head("/v2/health/live", "GET", **{f"x_{i}": i for i in range(19)}))  # 20 with Host
        assert answer(sock)[0] == 200
        sock.sendall(head("/v2/health/live", "GET", **{f"x_{i}": i for i in range(20)}))
        status, _, body = answer(sock)
    assert status == 431 and "more than 20 header fields" in json.loads(body)["error"]


def test_a_head_that_stops_coming_is_answered_408_and_closed(serve: Serve) -> None:
    served = serve(header_timeout_s=0.2)
    with served.connect() as sock:
        sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: te")
        started = time.monotonic()
        status, _, body = answer(sock)
        assert status == 408 and time.monotonic() - started < 1.5
        assert json.loads(body) == {"error": "the request head did not arrive within 0.2 s"}
        assert closed_by_server(sock, 1.0)
    # Sent a byte at a time, a head still has to be whole within its timeout: the 408 comes while the bytes do
    # (they would take 2 s), so none of them started its clock again. Sending stops once it has come.
    trickle = b"GET /v2/health/live HTTP/1.1\r\nHost: test\r\nX-Slow: " + b"a" * 60
    with served.connect() as sock:
        started = time.monotonic()
        sent = 0
        while sent < len(trickle) and not select.select([sock], [], [], 0.02)[0]:  # 0.02 s apart, until answered
            try:
                sock.send(trickle[sent : sent + 1])
            except (BrokenPipeError, ConnectionResetError):
                break
            sent += 1
        assert answer(sock)[0] == 408 and time.monotonic() - started < 1.5
        assert sent < len(trickle)
    deadline = time.monotonic() + 2  # the server counts a refusal just after it has written the answer
    while len(served.refusals) < 2 and time.monotonic() < deadline:
        time.sleep(0.005)
    assert served.refusals == ["header_timeout", "header_timeout"]


def test_an_idle_connection_is_closed_before_and_after_a_request(serve: Serve) -> None:
    served = serve(idle_timeout_s=0.2)
    with served.connect() as sock:  # a connection that never sends: closed, nothing written
        sock.settimeout(2)
        assert sock.recv(100) == b""
    with served.connect() as sock:
        sock.sendall(head("/v2/health/live", "GET"))
        assert answer(sock)[0] == 200
        assert closed_by_server(sock, 2.0)


def test_connections_past_the_limit_are_answered_503_and_the_rest_served(serve: Serve) -> None:
    served = serve(max_connections=3)
    held = [served.connect() for _ in range(3)]
    try:
        for sock in held:  # each answered once: accepted and counted by the server
            sock.sendall(head("/v2/health/live", "GET"))
            assert answer(sock)[0] == 200
        with served.connect() as extra:
            status, headers, body = answer(extra)
            assert status == 503 and headers["retry-after"] == "1"
            assert "3 connections open" in json.loads(body)["error"]
        held.pop().close()
        time.sleep(0.1)
        with served.connect() as sock:  # a place is free again
            sock.sendall(head("/v2/health/live", "GET"))
            assert answer(sock)[0] == 200
    finally:
        for sock in held:
            sock.close()
    assert served.refusals == ["connections"]


def test_a_parse_error_is_400_and_not_logged_above_debug(serve: Serve, caplog: pytest.LogCaptureFixture) -> None:
    served = serve()
    with served.connect() as sock:
        sock.sendall(b"NOT HTTP AT ALL\r\n\r\n")
        assert answer(sock)[0] == 400
    assert not [r for r in caplog.records if r.levelname in ("WARNING", "ERROR")]


# -- the body --------------------------------------------------------------------------------------------------
def test_a_body_announced_and_not_sent_holds_what_came_then_408(serve: Serve) -> None:
    served = serve(body_idle_timeout_s=0.5)
    socks = [served.connect() for _ in range(20)]
    try:
        for sock in socks:  # each says a megabyte is coming, and sends 10 bytes of it
            sock.sendall(head(content_length=1_000_000, content_type="application/json") + b'{"inputs":')
        time.sleep(0.2)
        assert served.app.bodies.reading == 20
        assert served.app.bodies.held <= 20 * 10  # 3 GB for 3 000 such connections, before
        status, headers, body = answer(socks[0])
        assert status == 408 and headers["connection"] == "close"
        assert json.loads(body) == {"error": "no part of the request body came for 0.5 s"}
    finally:
        for sock in socks:
            sock.close()
    time.sleep(0.1)
    assert served.app.bodies.held == 0 and served.app.bodies.reading == 0


def test_a_body_trickled_past_its_whole_timeout_is_408(serve: Serve) -> None:
    served = serve(body_idle_timeout_s=0.3, body_timeout_s=0.5)
    with served.connect() as sock:
        sock.sendall(head(content_length=1000, content_type="application/json"))
        started = time.monotonic()
        sock.settimeout(0.1)
        while time.monotonic() - started < 3:  # a byte every 0.1 s: never idle long, never done
            sock.send(b" ")
            try:
                data = sock.recv(65536)
                break
            except TimeoutError:
                continue
        elapsed = time.monotonic() - started
        sock.settimeout(5)
        while chunk := sock.recv(65536):  # the answer's head and body may come apart; the server closes after it
            data += chunk
        assert data.startswith(b"HTTP/1.1 408 ") and b"longer than 0.5 s" in data
        assert elapsed < 1.5


def test_bodies_past_their_shared_limit_are_429_unless_alone(serve: Serve) -> None:
    served = serve(bodies_in_flight_mb=1)
    big = 3 << 20  # one body over the whole limit: served when alone (to the daemon, here absent: 503)
    body = infer_body().ljust(big)  # valid JSON, then spaces
    with served.connect() as sock:
        sock.sendall(head(content_length=big, content_type="application/json") + body)
        assert answer(sock)[0] == 503
    with served.connect() as first, served.connect() as second:
        first.sendall(head(content_length=big, content_type="application/json") + body[: 900 << 10])
        time.sleep(0.2)
        second.sendall(head(content_length=big, content_type="application/json"))
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # refused midway: the rest unread
            second.sendall(body[: 600 << 10])
        status, headers, text = answer(second)
        assert status == 429 and headers["retry-after"] == "1"
        assert "bodies_in_flight_mb 1" in json.loads(text)["error"]
        first.sendall(body[900 << 10 :])
        assert answer(first)[0] == 503  # read whole, then no daemon


def test_an_answer_before_the_body_drops_the_rest_then_closes(serve: Serve, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(http_server, "LINGER_S", 0.2)
    served = serve()
    with served.connect() as sock:  # an unknown model: 404 before its body is read
        sock.sendall(head("/v2/models/other/infer", content_length=100_000) + b" " * 1000)
        assert answer(sock)[0] == 404
        assert closed_by_server(sock, 2.0)  # the rest never came: closed after LINGER_S
    with served.connect() as sock:  # the rest comes at once: the connection goes on
        sock.sendall(head("/v2/models/other/infer", content_length=100_000) + b" " * 1000)
        assert answer(sock)[0] == 404
        sock.sendall(b" " * 99_000)
        time.sleep(0.4)  # past LINGER_S
        sock.sendall(head("/v2/health/live", "GET"))
        assert answer(sock)[0] == 200


def test_a_gzip_body_that_is_not_gzip_is_400_in_one_line(serve: Serve, caplog: pytest.LogCaptureFixture) -> None:
    served = serve()
    with served.connect() as sock:
        for body in (b"this is not gzip at all", gzip.compress(infer_body())[:-12]):  # garbage; cut short
            sock.sendall(head(content_length=len(body), content_encoding="gzip") + body)
            status, _, text = answer(sock)
            message = json.loads(text)["error"]
            assert status == 400 and "not valid gzip" in message and "\n" not in message, message
    assert not [r for r in caplog.records if r.exc_info or r.levelname == "ERROR"]


def test_a_large_body_in_many_parts_reaches_the_daemon_whole(tmp_path: Path) -> None:
    from tests.packrat_daemon.protocol.test_gateway_metrics import StandIn

    daemon = StandIn(f"ipc://{tmp_path}/daemon.ipc")
    served = Served(daemon.endpoint, GatewayLimits(), spec=None)
    try:
        deadline = time.monotonic() + 10
        while not asyncio.run_coroutine_threadsafe(served.plane.ready(), served.loop).result(5):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        body = json.dumps({"inputs": [{"name": "input", "datatype": "FP32", "shape": [4, 4],
                                       "data": [1.5] * 16 + [0.0] * 0}], "id": "x" * 200_000}).encode()  # fmt: skip
        with served.connect() as sock:
            sock.sendall(head(content_length=len(body), content_type="application/json"))
            for start in range(0, len(body), 7000):  # parts smaller than a read: the buffer grows with them
                sock.sendall(body[start : start + 7000])
            status, _, text = answer(sock)
        assert status == 200, text
        reply = json.loads(text)
        assert reply["id"] == "x" * 200_000 and reply["outputs"][0]["data"] == [1.5] * 16
    finally:
        served.stop()
        daemon.stop()


def test_a_body_is_kept_as_it_came_and_joined_once() -> None:
    from packrat_daemon.protocol.rest_body import PART_BYTES, Bodies, read_body

    def receive(parts: list[bytes]):  # type: ignore[no-untyped-def]
        messages = [{"type": "http.request", "body": p, "more_body": i < len(parts) - 1} for i, p in enumerate(parts)]

        async def next_message() -> dict:
            return messages.pop(0)

        return next_message

    bodies = Bodies(1 << 30)
    data = bytes(range(256)) * 80  # 20 KiB, a byte at a time: gathered, not kept as 20 480 objects
    body = asyncio.run(read_body(receive([data[i : i + 1] for i in range(len(data))]), {}, 1 << 20, bodies=bodies))
    assert body == data and bodies.held == 0 and bodies.reading == 0
    whole = b"x" * (2 * PART_BYTES)  # one part: handed on as it came, not copied
    headers = {b"content-length": str(len(whole)).encode()}
    assert asyncio.run(read_body(receive([whole]), headers, 1 << 20, bodies=bodies)) is whole
    parts = [b"a" * PART_BYTES, b"b" * 10, b"c" * PART_BYTES]
    assert asyncio.run(read_body(receive(parts), {}, 1 << 20, bodies=bodies)) == b"".join(parts)


# -- settings and the parameter's name -------------------------------------------------------------------------
def test_limits_are_settings_checked_by_name(capsys: pytest.CaptureFixture[str]) -> None:
    limits = GatewayLimits().with_settings(["max_connections=10", "header-timeout-s=2.5"])
    assert limits.max_connections == 10 and limits.header_timeout_s == 2.5
    with pytest.raises(ConfigError, match="NAME one of max_connections"):
        GatewayLimits().with_settings(["connections=10"])
    with pytest.raises(ConfigError, match="max_connections takes an integer"):
        GatewayLimits().with_settings(["max_connections=many"])
    with pytest.raises(ConfigError, match="must be positive"):
        GatewayLimits().with_settings(["body_timeout_s=0"])
    from packrat_daemon.cli import main  # `packrat oip --limit`: refused before anything is bound, exit 2

    assert main(["oip", "--connect", "ipc:///nowhere", "--http-port", "8000", "--limit", "max_conections=5"]) == 2
    assert "NAME one of max_connections" in capsys.readouterr().err


def test_a_timeout_out_of_range_names_the_clients_parameter() -> None:
    tensor = {"name": "input", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}
    assert parse_infer_request({"inputs": [tensor], "parameters": {"timeout": MAX_TIMEOUT_US}}, memoryview(b""))
    with pytest.raises(OipError) as caught:
        parse_infer_request({"inputs": [tensor], "parameters": {"timeout": MAX_TIMEOUT_US + 1}}, memoryview(b""))
    assert "parameter 'timeout'" in caught.value.message and "timeout_ms" not in caught.value.message
