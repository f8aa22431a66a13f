"""The lean send/receive helpers, on real ZeroMQ sockets."""

from __future__ import annotations

import numpy as np
import pytest
import zmq

from packrat_daemon.wire.zmqio import NOBLOCK, readable, recv_frames, send_frames


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
