"""What both clients share, on real sockets with nothing listening: argument checks, endpoint errors, the
request ids and timeouts each request carries, and what a closed client and a missing reply say."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator

import numpy as np
import pytest
import zmq

from packrat_daemon.wire.client_base import ClientBase, ceil_ms, check_timeout, sample_count
from packrat_daemon.wire.curve import KeyPair
from packrat_daemon.wire.errors import BadEndpoint, ClientClosed
from packrat_daemon.wire.server_side import InferRequest, parse_request

ENDPOINT = "inproc://packrat-test-client-base"  # nothing binds it: connecting does not need a peer


@pytest.fixture
def context() -> Iterator[zmq.Context]:
    context = zmq.Context()
    yield context
    context.destroy(linger=0)


def client(context: zmq.Context, endpoints: str | list[str] = ENDPOINT, timeout: float = 5.0) -> ClientBase:
    return ClientBase(endpoints, timeout, context, backoff=1.0, key=None, server_key=None)


# -- the module's helpers ---------------------------------------------------------------------------
@pytest.mark.parametrize("timeout", [0.001, 2.5, 3600])
def test_a_positive_finite_timeout_is_kept(timeout: float) -> None:
    assert check_timeout(timeout) == timeout


@pytest.mark.parametrize("timeout", [0, -1.0, math.nan, math.inf])
def test_a_timeout_that_is_not_a_positive_finite_number_is_refused(timeout: float) -> None:
    with pytest.raises(ValueError, match=f"timeout must be a positive number of seconds, got {timeout!r}"):
        check_timeout(timeout)


def test_milliseconds_round_up_and_never_go_below_zero() -> None:
    assert [ceil_ms(s) for s in (0.0, 0.0001, 0.001, 0.0011, 2.5, -1.0)] == [0, 1, 1, 2, 2500, 0]


def test_the_sample_count_is_the_first_dimension_of_an_array_or_nested_list() -> None:
    assert sample_count(np.zeros((3, 4), np.float32)) == 3
    assert sample_count([[1.0, 2.0], [3.0, 4.0]]) == 2


# -- building a client ------------------------------------------------------------------------------
def test_one_endpoint_or_several(context: zmq.Context) -> None:
    assert client(context).endpoints == [ENDPOINT]
    assert client(context, [ENDPOINT, ENDPOINT + "-2"]).endpoints == [ENDPOINT, ENDPOINT + "-2"]


def test_no_endpoint_is_refused_with_an_example(context: zmq.Context) -> None:
    with pytest.raises(ValueError, match="at least one endpoint, e.g. 'tcp://127.0.0.1:5555'"):
        client(context, [])


def test_an_endpoint_zeromq_cannot_connect_to_is_named(context: zmq.Context) -> None:
    with pytest.raises(BadEndpoint, match=r"cannot connect to endpoint 'tpc://127\.0\.0\.1:5555'.*tcp://HOST:PORT"):
        client(context, [ENDPOINT, "tpc://127.0.0.1:5555"])


def test_curve_needs_both_keys(context: zmq.Context) -> None:
    public, secret = zmq.curve_keypair()
    for key, server_key in ((KeyPair(public, secret), None), (None, public)):
        with pytest.raises(ValueError, match="CURVE needs both"):
            ClientBase(ENDPOINT, 5.0, context, backoff=1.0, key=key, server_key=server_key)


def test_a_bad_timeout_is_refused_when_built_and_when_set(context: zmq.Context) -> None:
    with pytest.raises(ValueError, match="positive number"):
        client(context, timeout=0.0)
    base = client(context)
    with pytest.raises(ValueError, match="positive number"):
        base.timeout = -2.0
    assert base.timeout == 5.0
    base.timeout = 0.25
    assert base.timeout == 0.25


# -- requests ---------------------------------------------------------------------------------------
def parsed(frames: list) -> InferRequest:
    _, request = parse_request([bytes(frame) for frame in frames], max_message_bytes=1 << 20)
    assert isinstance(request, InferRequest)
    return request


def test_each_request_gets_the_next_id_and_carries_its_timeout(context: zmq.Context) -> None:
    base = client(context, timeout=5.0)
    x = np.ones((2, 3), np.float32)
    frames, first_id, timeout = base._infer_request(x, None, None)
    assert (first_id, timeout) == (1, 5.0)
    request = parsed(frames)
    assert (request.request_id, request.dtype, request.shape, request.timeout_ms) == (1, "float32", (2, 3), 5000.0)
    np.testing.assert_array_equal(np.frombuffer(request.payload, np.float32).reshape(2, 3), x)
    frames, second_id, timeout = base._infer_request(x, 0.5, None)  # this call's own timeout
    assert (second_id, timeout, parsed(frames).timeout_ms) == (2, 0.5, 500.0)
    frames, third_id, timeout = base._info_request(None, "status")  # info and infer share the ids
    assert (third_id, timeout) == (3, 5.0)
    assert json.loads(frames[0]) == {"v": 1, "id": 3, "op": "status"} and len(frames) == 1


def test_a_requests_own_timeout_is_checked(context: zmq.Context) -> None:
    base = client(context)
    with pytest.raises(ValueError, match="positive number"):
        base._infer_request(np.ones((1, 3), np.float32), 0.0, None)
    with pytest.raises(ValueError, match="positive number"):
        base._info_request(-1.0)


def test_a_closed_client_says_to_make_a_new_one(context: zmq.Context) -> None:
    base = client(context)
    base._check_open()
    base._closed = True
    with pytest.raises(ClientClosed, match="create a new one"):
        base._check_open()


def test_no_reply_names_the_endpoint_and_with_curve_the_keys(context: zmq.Context) -> None:
    plain = client(context, [ENDPOINT, ENDPOINT + "-2"])
    message = str(plain._no_reply(1, 0.001))
    assert f"no reply from {ENDPOINT}-2 within the call's timeout of 0.001 s" in message and "key" not in message
    public, secret = zmq.curve_keypair()
    server_public, _ = zmq.curve_keypair()
    curve = ClientBase(ENDPOINT, 5.0, context, backoff=1.0, key=KeyPair(public, secret), server_key=server_public)
    assert "does it know this client's key, and is server_key its key?" in str(curve._no_reply(0, 5.0))
