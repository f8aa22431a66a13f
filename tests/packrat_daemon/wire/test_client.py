"""Client and AsyncClient against tiny real ROUTER servers running in threads (real sockets, no mocks)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zmq

from packrat_daemon.wire import client as client_library
from packrat_daemon.wire import errors
from packrat_daemon.wire.client import AsyncClient, Client
from packrat_daemon.wire.client_side import decode_reply
from packrat_daemon.wire.codec import ErrorCode, ProtocolError
from packrat_daemon.wire.model_checks import check_against_model
from packrat_daemon.wire.server_replies import encode_error, encode_info, encode_result
from packrat_daemon.wire.server_side import InferRequest, InfoRequest, parse_request

TIMING = {"queue_ms": 0.1, "compute_ms": 1.0, "total_ms": 1.1}
INFO = {"model": "toy", "input": {"dtype": "float32", "shape": [3]}, "max_batch": 4, "plan": {"instances": 1}}
# The timeout of a request that is never answered in time (a silent or late server): it only has to run out, so
# it is short, to keep the suite fast. A request that must be answered keeps the client's 5 s.
SHORT_TIMEOUT = 0.1

Request = InferRequest | InfoRequest
Reply = list[Any]
Handler = Callable[[Request], list[Reply]]
Serve = Callable[..., "Server"]


def echo(req: Request) -> list[Reply]:
    if isinstance(req, InfoRequest):
        return [encode_info(req.request_id, INFO)]
    return [encode_result(req.request_id, req.dtype, req.shape, bytes(req.payload), TIMING)]


def filled(value: float) -> Handler:
    """A server whose every result is one float32 row per sample, all equal to ``value``."""

    def handler(req: Request) -> list[Reply]:
        assert isinstance(req, InferRequest)
        rows = np.full((req.shape[0], 1), value, np.float32)
        return [encode_result(req.request_id, "float32", rows.shape, rows.tobytes(), TIMING)]

    return handler


class Server:
    """A ROUTER that parses each request with the real protocol code and answers through ``handler``.

    The handler runs in the server thread and returns the replies to send now (possibly none, possibly
    also replies to earlier requests), which is how the tests produce timeouts and stale replies.
    """

    def __init__(self, context: zmq.Context, handler: Handler, endpoint: str = "tcp://127.0.0.1") -> None:
        self.handler = handler
        self.received: list[Request] = []
        self._socket = context.socket(zmq.ROUTER)
        self._socket.setsockopt(zmq.LINGER, 0)
        if endpoint.startswith("tcp://"):
            port = self._socket.bind_to_random_port(endpoint)
            self.endpoint = f"{endpoint}:{port}"
        else:
            self._socket.bind(endpoint)
            self.endpoint = endpoint
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                if self._socket.poll(5, zmq.POLLIN):  # 5 ms: how long a stop waits, at each test's end
                    identity, *frames = self._socket.recv_multipart(copy=False)
                    self._answer(identity.bytes, frames)
        finally:
            self._socket.close(linger=0)

    def _answer(self, identity: bytes, frames: list[zmq.Frame]) -> None:
        # Replies go back to whichever client sent the current request (the tests use one client each).
        try:
            delimiter, req = parse_request(frames, max_message_bytes=1 << 20)
        except ProtocolError as exc:
            envelope = [identity] if exc.delimiter is None else [identity, exc.delimiter]
            self._socket.send_multipart([*envelope, *encode_error(exc.request_id, exc.code, exc.message)])
            return
        self.received.append(req)
        envelope = [identity] if delimiter is None else [identity, delimiter]
        try:
            replies = self.handler(req)
        except ProtocolError as exc:
            replies = [encode_error(exc.request_id, exc.code, exc.message)]
        for reply in replies:
            self._socket.send_multipart([*envelope, *reply])

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


@pytest.fixture
def context() -> Iterator[zmq.Context]:
    ctx = zmq.Context()
    yield ctx
    ctx.destroy(linger=0)


@pytest.fixture
def serve(context: zmq.Context) -> Iterator[Callable[..., Server]]:
    servers: list[Server] = []

    def start(handler: Handler = echo, endpoint: str = "tcp://127.0.0.1") -> Server:
        servers.append(Server(context, handler, endpoint))
        return servers[-1]

    yield start
    for server in servers:
        server.stop()


# --------------------------------------------------------------------------------------- blocking Client


@pytest.mark.parametrize(
    "array",
    [
        np.arange(12, dtype=np.float32).reshape(4, 3),
        np.arange(6, dtype=np.int64).reshape(6, 1),
        np.array([[True, False]]),
        np.arange(8, dtype=np.float16).reshape(2, 2, 2),
        np.arange(10, dtype=">f8")[::2],
    ],
)
def test_infer_returns_the_servers_rows(context: zmq.Context, serve: Serve, array: np.ndarray) -> None:
    server = serve()
    with Client(server.endpoint, context=context, timeout=5) as client:
        result = client.infer(array)
    np.testing.assert_array_equal(result, array)
    assert result.shape == array.shape


def test_infer_sends_its_timeout_to_the_server(context: zmq.Context, serve: Serve) -> None:
    server = serve()
    with Client(server.endpoint, context=context, timeout=5) as client:
        client.infer(np.ones((1, 3), np.float32))
        client.infer(np.ones((1, 3), np.float32), timeout=0.25)
        client.timeout = 2  # a changed default applies to the next call (headers come from a cache)
        client.infer(np.ones((1, 3), np.float32))
        with pytest.raises(ValueError, match="positive"):
            client.timeout = 0
    assert [req.timeout_ms for req in server.received] == [5000.0, 250.0, 2000.0]


def test_info(context: zmq.Context, serve: Serve, tmp_path: Path) -> None:
    server = serve(endpoint=f"ipc://{tmp_path}/s")
    with Client(server.endpoint, context=context, timeout=5) as client:
        assert client.info() == {"versions": [1, 2], **INFO}


ERRORS = [
    (ErrorCode.BAD_REQUEST, errors.BadRequest),
    (ErrorCode.UNSUPPORTED_VERSION, errors.UnsupportedVersion),
    (ErrorCode.TOO_LARGE, errors.TooLarge),
    (ErrorCode.OVERLOADED, errors.Overloaded),
    (ErrorCode.TIMEOUT, errors.ServerTimeout),
    (ErrorCode.SHUTTING_DOWN, errors.ShuttingDown),
    (ErrorCode.INTERNAL, errors.InternalError),
]


def failing(code: str) -> Handler:
    return lambda req: [encode_error(req.request_id, code, f"it failed with {code}")]  # type: ignore[arg-type]


@pytest.mark.parametrize(("code", "cls"), ERRORS)
def test_error_replies_raise_their_class(
    context: zmq.Context, serve: Serve, code: ErrorCode, cls: type[errors.ServerError]
) -> None:
    server = serve(failing(code))
    with Client(server.endpoint, context=context, timeout=5) as client, pytest.raises(cls) as info:
        client.infer(np.ones((2, 3), np.float32))
    assert (info.value.code, info.value.message, info.value.request_id) == (code, f"it failed with {code}", 1)
    if cls is errors.UnsupportedVersion:
        assert info.value.versions == (1, 2)  # type: ignore[attr-defined]


def test_unknown_error_code_raises_the_base_class(context: zmq.Context, serve: Serve) -> None:
    server = serve(failing("FROM_THE_FUTURE"))
    with Client(server.endpoint, context=context, timeout=5) as client, pytest.raises(errors.ServerError) as info:
        client.info()
    assert type(info.value) is errors.ServerError and info.value.code == "FROM_THE_FUTURE"


def test_model_mismatch_is_a_bad_request(context: zmq.Context, serve: Serve) -> None:
    def strict(req: Request) -> list[Reply]:
        assert isinstance(req, InferRequest)
        check_against_model(req, "float32", (3,), max_samples=4)
        return echo(req)

    server = serve(strict)
    with Client(server.endpoint, context=context, timeout=5) as client:
        with pytest.raises(errors.BadRequest, match="dtype is float64, but the model takes float32"):
            client.infer(np.ones((2, 3), np.float64))
        with pytest.raises(errors.TooLarge, match="at most 4"):
            client.infer(np.ones((5, 3), np.float32))
        assert client.infer(np.ones((4, 3), np.float32)).shape == (4, 3)


def test_timeout_then_success_discards_the_late_reply(context: zmq.Context, serve: Serve) -> None:
    held: list[InferRequest] = []

    def late(req: Request) -> list[Reply]:
        assert isinstance(req, InferRequest)
        if not held:
            held.append(req)  # no answer now: the client times out
            return []
        stale = filled(-1.0)(held[0])[0]  # the answer to the first request, too late
        return [stale, *filled(7.0)(req)]

    server = serve(late)
    with Client(server.endpoint, context=context, timeout=5) as client:
        with pytest.raises(errors.ClientTimeout) as info:
            client.infer(np.ones((2, 3), np.float32), timeout=SHORT_TIMEOUT)
        assert isinstance(info.value, TimeoutError)
        np.testing.assert_array_equal(client.infer(np.ones((2, 3), np.float32)), np.full((2, 1), 7.0))
    assert [req.request_id for req in server.received] == [1, 2]


def test_a_timeout_too_short_for_the_model_is_named_in_the_error(context: zmq.Context, serve: Serve) -> None:
    silent = serve(lambda req: [])
    expected = r"within the call's timeout of 0\.001 s; if the model takes longer, give a larger timeout"
    with (
        Client(silent.endpoint, context=context, timeout=5) as client,
        pytest.raises(errors.ClientTimeout, match=expected),
    ):
        client.infer(np.ones((1, 3), np.float32), timeout=0.001)

    async def call() -> None:
        async with AsyncClient(silent.endpoint, context=context, timeout=0.001) as client:
            await client.infer(np.ones((1, 3), np.float32))

    with pytest.raises(errors.ClientTimeout, match=expected):
        asyncio.run(call())


def test_round_robin_over_two_endpoints(context: zmq.Context, serve: Serve) -> None:
    first, second = serve(filled(0.0)), serve(filled(1.0))
    with Client([first.endpoint, second.endpoint], context=context, timeout=5) as client:
        served_by = [client.infer(np.ones((1, 3), np.float32))[0, 0] for _ in range(4)]
    assert served_by == [0.0, 1.0, 0.0, 1.0]


def test_endpoint_that_timed_out_is_skipped_while_others_remain(context: zmq.Context, serve: Serve) -> None:
    alive, silent = serve(filled(0.0)), serve(lambda req: [])
    with Client([alive.endpoint, silent.endpoint], context=context, timeout=5, backoff=60) as client:
        assert client.infer(np.ones((1, 3), np.float32))[0, 0] == 0.0
        with pytest.raises(errors.ClientTimeout, match=silent.endpoint):
            client.infer(np.ones((1, 3), np.float32), timeout=SHORT_TIMEOUT)
        served_by = [client.infer(np.ones((1, 3), np.float32))[0, 0] for _ in range(3)]
    assert served_by == [0.0, 0.0, 0.0]
    assert len(silent.received) == 1


def test_an_endpoint_that_is_shutting_down_is_skipped_while_others_remain(context: zmq.Context, serve: Serve) -> None:
    # A draining daemon answers SHUTTING_DOWN until it closes: the next requests go to the others meanwhile.
    alive, draining = serve(filled(0.0)), serve(failing(ErrorCode.SHUTTING_DOWN))
    with Client([draining.endpoint, alive.endpoint], context=context, timeout=5, backoff=60) as client:
        with pytest.raises(errors.ShuttingDown):
            client.infer(np.ones((1, 3), np.float32))
        served_by = [client.infer(np.ones((1, 3), np.float32))[0, 0] for _ in range(3)]
    assert served_by == [0.0, 0.0, 0.0]
    assert len(draining.received) == 1


def test_the_only_endpoint_is_used_even_in_back_off(context: zmq.Context, serve: Serve) -> None:
    calls: list[Request] = []

    def second_time_lucky(req: Request) -> list[Reply]:
        calls.append(req)
        return [] if len(calls) == 1 else echo(req)

    server = serve(second_time_lucky)
    with Client(server.endpoint, context=context, timeout=5, backoff=60) as client:
        with pytest.raises(errors.ClientTimeout):
            client.info(timeout=SHORT_TIMEOUT)
        assert client.info()["model"] == "toy"


def test_malformed_reply_raises_protocol_error(context: zmq.Context, serve: Serve) -> None:
    server = serve(lambda req: [[b"this is not json"]])
    with Client(server.endpoint, context=context, timeout=5) as client, pytest.raises(ProtocolError):
        client.info()


def test_closed_client_refuses_requests(context: zmq.Context, serve: Serve) -> None:
    client = Client(serve().endpoint, context=context)
    client.close()
    client.close()
    with pytest.raises(errors.ClientClosed):
        client.info()


@pytest.mark.parametrize("kwargs", [{"timeout": 0}, {"timeout": -1.0}, {"timeout": float("nan")}])
def test_invalid_client_arguments(context: zmq.Context, kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        Client("tcp://127.0.0.1:1", context=context, **kwargs)
    with pytest.raises(ValueError):
        Client([], context=context)


def test_req_socket_clients_get_the_delimiter_back(context: zmq.Context, serve: Serve) -> None:
    # Clients in other languages may use REQ, which adds an empty delimiter frame to every message.
    server = serve()
    req = context.socket(zmq.REQ)
    req.setsockopt(zmq.LINGER, 0)
    req.connect(server.endpoint)
    head = {"v": 1, "id": "a", "op": "infer", "dtype": "int8", "shape": [2]}
    req.send_multipart([json.dumps(head).encode(), b"\x01\x02"])
    assert req.poll(5000)
    header, array = decode_reply(req.recv_multipart())
    assert header["id"] == "a" and array is not None and array.tolist() == [1, 2]
    req.send_multipart([b'{"v": 3, "id": "b", "op": "info"}'])
    assert req.poll(5000)
    header, _ = decode_reply(req.recv_multipart())
    assert header["error"]["code"] == "UNSUPPORTED_VERSION" and header["versions"] == [1, 2]
    req.close()


# ------------------------------------------------------------------------------------------ AsyncClient


def test_async_concurrent_requests_are_matched_by_id(context: zmq.Context, serve: Serve) -> None:
    count = 20
    waiting: list[InferRequest] = []

    def reverse_order(req: Request) -> list[Reply]:
        # Hold every request until all have arrived, then answer newest first: order cannot help.
        assert isinstance(req, InferRequest)
        waiting.append(req)
        if len(waiting) < count:
            return []
        return [echo(held)[0] for held in reversed(waiting)]

    server = serve(reverse_order)

    async def main() -> list[np.ndarray]:
        async with AsyncClient(server.endpoint, context=context, timeout=5) as client:
            calls = (client.infer(np.full((i + 1, 2), i, np.int32)) for i in range(count))
            return await asyncio.gather(*calls)

    results = asyncio.run(main())
    for i, result in enumerate(results):
        np.testing.assert_array_equal(result, np.full((i + 1, 2), i, np.int32))


def test_async_timeout_then_success_discards_the_late_reply(context: zmq.Context, serve: Serve) -> None:
    held: list[InferRequest] = []

    def late(req: Request) -> list[Reply]:
        assert isinstance(req, InferRequest)
        if not held:
            held.append(req)
            return []
        return [filled(-1.0)(held[0])[0], *filled(7.0)(req)]

    server = serve(late)

    async def main() -> np.ndarray:
        async with AsyncClient(server.endpoint, context=context, timeout=5) as client:
            with pytest.raises(errors.ClientTimeout):
                await client.infer(np.ones((2, 3), np.float32), timeout=SHORT_TIMEOUT)
            return await client.infer(np.ones((2, 3), np.float32))

    np.testing.assert_array_equal(asyncio.run(main()), np.full((2, 1), 7.0))


def test_async_errors_info_and_round_robin(context: zmq.Context, serve: Serve) -> None:
    first, second, overloaded = serve(filled(0.0)), serve(filled(1.0)), serve(failing(ErrorCode.OVERLOADED))

    async def main() -> None:
        async with AsyncClient([first.endpoint, second.endpoint], context=context, timeout=5) as client:
            served_by = [(await client.infer(np.ones((1, 3), np.float32)))[0, 0] for _ in range(4)]
            assert served_by == [0.0, 1.0, 0.0, 1.0]
        async with AsyncClient(overloaded.endpoint, context=context, timeout=5) as client:
            with pytest.raises(errors.Overloaded):
                await client.info()
        async with AsyncClient(serve().endpoint, timeout=5) as client:  # its own (shared) context
            assert (await client.info())["max_batch"] == 4

    asyncio.run(main())


def test_async_close_fails_waiting_calls(context: zmq.Context, serve: Serve) -> None:
    server = serve(lambda req: [])

    async def main() -> None:
        client = AsyncClient(server.endpoint, context=context, timeout=5)
        call = asyncio.ensure_future(client.info())
        while not server.received:
            await asyncio.sleep(0.01)
        await client.aclose()
        with pytest.raises(errors.ClientClosed):
            await call
        with pytest.raises(errors.ClientClosed):
            await client.info()

    asyncio.run(main())


def test_bfloat16_travels_as_raw_bits(context: zmq.Context, serve: Serve) -> None:
    server = serve()
    bits = np.array([[0x3F80, 0xC000]], np.uint16)  # bfloat16 1.0 and -2.0
    with Client(server.endpoint, context=context, timeout=5) as client:
        result = client.infer(bits, dtype="bfloat16")
    assert server.received[0].dtype == "bfloat16"  # type: ignore[union-attr]
    np.testing.assert_array_equal(result, bits)


def test_the_wire_package_does_not_import_torch() -> None:
    # The client has to start in milliseconds, and the workers import the wire before choosing a runtime.
    code = (
        "import sys, packrat_daemon.client, packrat_daemon.wire.server_side; "
        "assert 'torch' not in sys.modules, 'torch was imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


@pytest.mark.parametrize("endpoint", ["tcp://localhost", "tpc://127.0.0.1:5555", "tcp://127.0.0.1:notaport"])
def test_an_endpoint_typo_is_a_typed_error_naming_the_endpoint(endpoint: str) -> None:
    with pytest.raises(errors.BadEndpoint, match="cannot connect to endpoint") as caught:
        Client(endpoint)
    assert endpoint in str(caught.value)
    assert "\n" not in str(caught.value)


def test_the_client_library_exports_every_error_a_call_can_raise() -> None:
    # Users catch them from the library they call (packrat_daemon.client re-exports its __all__).
    raised = {errors.ServerError, *errors.ServerError.__subclasses__(), errors.ClientTimeout, errors.ClientClosed}
    assert len(raised) == 11 and {cls.__name__ for cls in raised} <= set(client_library.__all__)
    assert all(getattr(client_library, cls.__name__) is cls for cls in raised)
