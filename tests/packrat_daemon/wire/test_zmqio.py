"""The lean send/receive helpers, on real ZeroMQ sockets."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from packrat_daemon.wire import zmqio
from packrat_daemon.wire.zmqio import (
    NOBLOCK,
    CompiledDiscard,
    VectorDiscard,
    discard_python,
    discarder,
    readable,
    recv_frames,
    send_frames,
)


@pytest.fixture
def pair():
    context = zmq.Context()
    left, right = context.socket(zmq.PAIR), context.socket(zmq.PAIR)
    left.bind("inproc://zmqio-test")
    right.connect("inproc://zmqio-test")
    yield left, right
    left.close(0)
    right.close(0)
    context.term()


@pytest.mark.parametrize("copy", [True, False])
def test_multipart_message_arrives_whole_and_in_order(pair, copy: bool) -> None:
    left, right = pair
    tensor = np.arange(100_000, dtype=np.float32)
    send_frames(left, [b"identity", b"", memoryview(tensor).cast("B")], copy=copy)
    frames = recv_frames(right)
    assert [f.bytes for f in frames[:2]] == [b"identity", b""]
    assert np.array_equal(np.frombuffer(frames[2].buffer, dtype=np.float32), tensor)


def test_readable_and_noblock(pair) -> None:
    left, right = pair
    assert not readable(right)
    with pytest.raises(zmq.Again):
        recv_frames(right, NOBLOCK)
    send_frames(left, [b"one"])
    send_frames(left, [b"two", b"parts"])
    assert readable(right)
    assert [f.bytes for f in recv_frames(right)] == [b"one"]
    assert [f.bytes for f in recv_frames(right, NOBLOCK)] == [b"two", b"parts"]
    assert not readable(right)


def _discarders() -> list[Any]:
    """Each way of discarding frames (the contract below holds for all of them); one this install lacks skips."""
    found = zmqio.discarders()
    missing = {
        "zmq_recviov": "pyzmq's libzmq not found",
        "compiled": "packrat_daemon/wire/_discard.c was not compiled (no C compiler at install)",
    }
    return [
        pytest.param(found[name], id=name) if name in found
        else pytest.param(None, id=name, marks=pytest.mark.skip(reason=missing[name]))
        for name in ("python", *missing)
    ]  # fmt: skip


@pytest.fixture(scope="module")
def router_pair() -> Iterator[tuple[zmq.Socket, zmq.Socket]]:
    # A ROUTER, as the frontend reads: its identity frame comes first, and it keeps to one peer mid-message.
    context = zmq.Context()
    router, dealer = context.socket(zmq.ROUTER), context.socket(zmq.DEALER)
    router.bind("inproc://zmqio-discard")
    dealer.connect("inproc://zmqio-discard")
    yield router, dealer
    router.close(0)
    dealer.close(0)
    context.term()


@pytest.mark.parametrize("discard", _discarders())
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    sizes=st.lists(st.sampled_from([0, 0, 0, 1, 7, 300, 70_000]), min_size=1, max_size=300),
    budgets=st.lists(st.integers(min_value=0, max_value=400), min_size=1, max_size=8),
)
def test_discarding_counts_the_rest_of_a_message_and_stops_at_its_last_frame(
    router_pair: tuple[zmq.Socket, zmq.Socket], discard: Any, sizes: list[int], budgets: list[int]
) -> None:
    router, dealer = router_pair
    dealer.send_multipart([b"head", *[bytes(size) for size in sizes]])
    dealer.send_multipart([b"next", b"message"])
    assert router.poll(5000)
    head = recv_frames_upto(router, 2)
    assert head[1].bytes == b"head" and head[1].more
    frames = size = 0
    ended = False
    for budget in itertools.chain(budgets, itertools.repeat(max(1, budgets[-1]))):
        got, nbytes, ended = discard(router, budget)
        assert got <= budget and (got == budget or ended)
        frames, size = frames + got, size + nbytes
        if ended:
            break
    assert (frames, size) == (len(sizes), sum(sizes))
    # The next message is whole: nothing of it was taken for the last one's.
    assert [frame.bytes for frame in recv_frames(router, NOBLOCK)][1:] == [b"next", b"message"]
    assert not readable(router)


@pytest.mark.parametrize("discard", _discarders())
def test_discarding_with_nothing_waiting_says_so(router_pair: tuple[zmq.Socket, zmq.Socket], discard: Any) -> None:
    with pytest.raises(zmq.Again):
        discard(router_pair[0], 10)


def recv_frames_upto(socket: zmq.Socket, count: int) -> list[zmq.Frame]:
    """The first `count` frames of the message waiting (or all of it, if shorter)."""
    frames = [socket.recv(NOBLOCK, copy=False)]
    while frames[-1].more and len(frames) < count:
        frames.append(socket.recv(NOBLOCK, copy=False))
    return frames


def test_the_discarder_is_pyzmqs_own_libzmq_or_else_pyzmq_frame_by_frame(monkeypatch: pytest.MonkeyPatch) -> None:
    # zmq_recviov of another libzmq than pyzmq's must never be called on pyzmq's sockets.
    discarder.cache_clear()
    try:
        monkeypatch.setattr(zmqio, "_pyzmq_libzmq", lambda: None)
        assert discarder() is discard_python
        discarder.cache_clear()
        monkeypatch.undo()
        monkeypatch.setattr(zmq, "zmq_version_info", lambda: (0, 0, 1))  # a library of another version
        assert discarder() is discard_python
        discarder.cache_clear()
        monkeypatch.undo()
        found = zmqio._pyzmq_libzmq()
        compiled = zmqio._compiled_loop() is not None
        assert isinstance(discarder(), CompiledDiscard) == (found is not None and compiled)
        assert isinstance(discarder(), VectorDiscard) == (found is not None and not compiled)
        discarder.cache_clear()
        monkeypatch.setattr(zmqio, "_compiled_loop", lambda: None)  # an install without a C compiler
        assert isinstance(discarder(), VectorDiscard) == (found is not None)
    finally:
        discarder.cache_clear()
