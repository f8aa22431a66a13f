"""The threaded gRPC server's connections to the daemon (`upstream.ThreadUpstreams`), against a stand-in daemon:
a ZeroMQ ROUTER in a thread that answers (or holds) each infer request. Each handler thread has a socket of its
own; a late reply to an earlier request is dropped, a drop of the connection fails the request in flight at once,
and a socket with no connection refuses at once while the loop's connection says the daemon is gone."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import zmq

from packrat_daemon.protocol.upstream import ThreadUpstreams, UpstreamGone, UpstreamTimeout
from packrat_daemon.wire.server_replies import encode_result
from packrat_daemon.wire.server_side import parse_request


class StandIn:
    """A ROUTER answering every infer request with its own payload, each `delay_s` late; `hold` keeps the next
    requests unanswered; `stale` answers each request first as the one before it (a late reply)."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self.hold = threading.Event()
        self.stale = False
        self.requests = 0
        self.identities: set[bytes] = set()
        self._stop = threading.Event()
        self._bound = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()
        assert self._bound.wait(10)

    def _serve(self) -> None:
        router = zmq.Context.instance().socket(zmq.ROUTER)
        router.setsockopt(zmq.LINGER, 0)
        router.bind(self.endpoint)
        self._bound.set()
        try:
            while not self._stop.is_set():
                if not router.poll(5):  # 5 ms: how long a stop waits
                    continue
                identity, *frames = router.recv_multipart(copy=False)
                _, request = parse_request(frames, max_message_bytes=1 << 20)
                self.requests += 1
                self.identities.add(identity.bytes)
                if self.hold.is_set():
                    continue
                payload = bytes(request.payload)  # type: ignore[union-attr]
                shape, dtype = request.shape, request.dtype  # type: ignore[union-attr]
                if self.stale:
                    stale_id = request.request_id - 1  # type: ignore[operator]
                    router.send_multipart(
                        [identity.bytes, *encode_result(stale_id, dtype, shape, bytes(len(payload)), {})]
                    )
                router.send_multipart([identity.bytes, *encode_result(request.request_id, dtype, shape, payload, {})])
        finally:
            router.close(linger=0)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)


class LoopConnection:
    """What `ThreadUpstreams` reads of the loop's `Upstream`: whether the daemon is there."""

    connected = True


@pytest.fixture
def stand_in(tmp_path: Path) -> Iterator[StandIn]:
    served = StandIn(f"ipc://{tmp_path}/daemon.ipc")
    yield served
    served.stop()


def _upstreams(stand_in: StandIn, loop: LoopConnection | None = None) -> ThreadUpstreams:
    return ThreadUpstreams(stand_in.endpoint, None, loop or LoopConnection())  # type: ignore[arg-type]


def test_each_thread_has_its_own_connection(stand_in: StandIn) -> None:
    upstreams = _upstreams(stand_in)
    answers: dict[int, np.ndarray] = {}

    def ask(index: int) -> None:
        upstream = upstreams.mine()
        assert upstreams.mine() is upstream
        header, result = upstream.infer(np.full((1, 4), index, np.float32), timeout_s=10)
        assert header["ok"] and isinstance(result, np.ndarray)
        answers[index] = result

    try:
        threads = [threading.Thread(target=ask, args=(index,)) for index in range(3)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(20)
    finally:
        upstreams.close()
    assert sorted(answers) == [0, 1, 2] and all((answers[i] == i).all() for i in answers)
    assert len(stand_in.identities) == 3


def test_a_late_reply_to_an_earlier_request_is_dropped(stand_in: StandIn) -> None:
    upstreams = _upstreams(stand_in)
    stand_in.stale = True
    try:
        upstream = upstreams.mine()
        for value in (1.0, 2.0):
            _, result = upstream.infer(np.full((1, 4), value, np.float32), timeout_s=10)
            assert isinstance(result, np.ndarray) and (result == value).all()
    finally:
        upstreams.close()


def test_no_reply_in_time_is_a_timeout(stand_in: StandIn) -> None:
    upstreams = _upstreams(stand_in)
    stand_in.hold.set()
    try:
        started = time.monotonic()
        with pytest.raises(UpstreamTimeout) as caught:
            upstreams.mine().infer(np.zeros((1, 4), np.float32), timeout_s=0.1)
        assert not isinstance(caught.value, UpstreamGone) and 0.09 < time.monotonic() - started < 5
    finally:
        upstreams.close()


def test_a_dropped_connection_fails_the_request_in_flight_at_once(stand_in: StandIn) -> None:
    upstreams = _upstreams(stand_in)
    upstream = upstreams.mine()
    try:
        upstream.infer(np.zeros((1, 4), np.float32), timeout_s=10)  # connected
        stand_in.hold.set()
        threading.Timer(0.1, stand_in.stop).start()  # the daemon goes away with the request
        started = time.monotonic()
        with pytest.raises(UpstreamGone):
            upstream.infer(np.zeros((1, 4), np.float32), timeout_s=30)
        assert time.monotonic() - started < 10
    finally:
        upstreams.close()


def test_no_daemon_is_refused_at_once(tmp_path: Path) -> None:
    loop = LoopConnection()
    loop.connected = False
    upstreams = ThreadUpstreams(f"ipc://{tmp_path}/none.ipc", None, loop)  # type: ignore[arg-type]
    try:
        started = time.monotonic()
        with pytest.raises(UpstreamGone, match="no connection"):
            upstreams.mine().infer(np.zeros((1, 4), np.float32), timeout_s=30)
        assert time.monotonic() - started < 1
    finally:
        upstreams.close()
    with pytest.raises(UpstreamGone):  # closed: no new connection
        upstreams.mine()
