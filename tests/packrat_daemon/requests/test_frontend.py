"""The frontend on a real ROUTER socket, with the daemon's own batcher, dispatcher and reconciler (no workers)."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import zmq

from packrat_daemon.config import ServeConfig
from packrat_daemon.fleet.backend import Backend, ModelInfo
from packrat_daemon.fleet.pool import Pool
from packrat_daemon.fleet.reconciler import Reconciler
from packrat_daemon.ops.metrics import Metrics
from packrat_daemon.requests import frontend as frontend_module
from packrat_daemon.requests import oversized as oversized_module
from packrat_daemon.requests.batcher import Batcher
from packrat_daemon.requests.dispatcher import Dispatcher
from packrat_daemon.requests.frontend import Frontend
from packrat_daemon.requests.splitter import Splitter
from packrat_daemon.requests.timing import Deadlines
from packrat_daemon.wire.client_side import (
    decode_reply,
    encode_infer_request,
    encode_info_request,
    info_result,
    server_error,
)
from packrat_daemon.wire.codec import ErrorCode
from policies.base import InstancePlan, Plan
from policies.planning.topology import Topology

INFO = ModelInfo("builtin:tiny-mlp", "torch", "float32", (16,), None, 4242)


@dataclass
class Served:
    frontend: Frontend
    batcher: Batcher
    client: zmq.Socket

    def ask(self, frames: list[Any]) -> dict[str, Any]:
        """Send one request, let the frontend read it, return the reply's header (None when unanswered)."""
        self.client.send_multipart(frames)
        assert self.frontend.socket.poll(5000), "the request did not arrive"
        self.frontend.read()
        if not self.client.poll(200):
            return {}
        header, _ = decode_reply(self.client.recv_multipart())
        return header


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    context = zmq.Context()
    backend = Backend(context, str(tmp_path / "run"))
    reconciler = Reconciler(Pool(backend), Topology.synthetic(2))
    reconciler.set_plan(Plan((InstancePlan(2, 4),), "fixed", "a test plan"))
    dispatcher = Dispatcher(
        reconciler.pool.run,
        Splitter(None, "exact", reconciler.layouts),
        Deadlines(job_timeout_s=5.0, margin=1.5, floor_s=0.2),
    )
    batcher = Batcher(max_batch=4, max_delay_s=10.0, max_queued_inputs=6)
    config = ServeConfig(model=INFO.model, endpoint=f"ipc://{tmp_path}/front.ipc")
    frontend = Frontend(
        context, config, INFO, Metrics(INFO.model), batcher, reconciler, lambda: dispatcher.busy, batcher.served
    )
    client = context.socket(zmq.DEALER)
    client.setsockopt(zmq.LINGER, 0)
    try:
        frontend.open()
        client.connect(config.endpoint)
        yield Served(frontend, batcher, client)
    finally:
        client.close()
        frontend.close()
        backend.close()
        context.term()


def rows(n: int) -> np.ndarray:
    return np.zeros((n, 16), dtype=np.float32)


def test_info_names_the_model_plan_and_limits(served: Served) -> None:
    header = served.ask(encode_info_request("i1"))
    assert header["id"] == "i1"
    info = info_result(header)
    assert info["model"] == INFO.model and info["runtime"] == "torch" and info["template_pid"] == 4242
    assert info["input"] == {"dtype": "float32", "shape": [16], "high": None}
    assert info["max_batch"] == 4 and info["plan"]["instances"] == [{"threads": 2, "batch": 4}]
    assert info["workers"] == []


def test_good_requests_are_queued_until_the_queue_is_full(served: Served) -> None:
    assert served.ask(encode_infer_request(1, rows(3))) == {}  # queued: answered once computed
    assert served.batcher.queued_inputs == 3
    assert served.ask(encode_infer_request(2, rows(3))) == {}
    header = served.ask(encode_infer_request(3, rows(1)))
    assert header["error"]["code"] == "OVERLOADED" and "queue is full (6 inputs waiting)" in header["error"]["message"]
    assert served.batcher.queued_inputs == 6


def test_requests_that_do_not_fit_the_model_are_answered_at_once(served: Served) -> None:
    header = served.ask(encode_infer_request(1, np.zeros((1, 8), dtype=np.float32)))
    assert header["id"] == 1 and header["error"]["code"] == "BAD_REQUEST"
    header = served.ask(encode_infer_request(2, rows(5)))
    assert header["error"]["code"] == "TOO_LARGE" and "at most 4" in header["error"]["message"]
    header = served.ask([b"not json", rows(1).tobytes()])
    assert header["error"]["code"] == "BAD_REQUEST"
    assert served.batcher.queued_inputs == 0


def test_token_ids_outside_the_models_vocabulary_are_refused_before_they_are_batched(served: Served) -> None:
    # Issue 27, 7: an id >= input.high raised IndexError in BERT and failed every request batched with it.
    served.frontend.info = ModelInfo("bert", "torch", "int64", (4,), 100, 4242)
    header = served.ask(encode_infer_request("bad", np.array([[1, 2, 3, 100]], dtype=np.int64)))
    assert header["id"] == "bad" and header["error"]["code"] == "BAD_REQUEST"
    assert "[0, 100)" in header["error"]["message"]
    header = served.ask(encode_infer_request("neg", np.array([[-1, 2, 3, 4]], dtype=np.int64)))
    assert header["error"]["code"] == "BAD_REQUEST"
    assert served.ask(encode_infer_request("good", np.array([[0, 1, 2, 99]], dtype=np.int64))) == {}  # queued
    assert served.batcher.queued_inputs == 1


def test_replies_a_client_never_reads_are_bounded_per_client(served: Served) -> None:
    # Issue 27, 5: ZeroMQ's default send queue (1 000 replies per peer) took a daemon to the OOM killer.
    assert served.frontend.socket.getsockopt(zmq.SNDHWM) == frontend_module.SEND_HWM <= 64
    for k in range(3 * frontend_module.SEND_HWM):  # the client reads none of them
        served.frontend.send(b"nobody", None, [b"reply %d" % k])  # ROUTER_MANDATORY off: dropped, never blocks


def test_a_status_flood_builds_the_status_once_per_interval(served: Served, monkeypatch: pytest.MonkeyPatch) -> None:
    # Issue 27, 12: a `status` flood on one connection cut serving 16-fold, each request rebuilding the reply.
    clock = [100.0]
    monkeypatch.setattr(frontend_module, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    built: list[float] = []
    served.frontend.status = lambda: built.append(clock[0]) or {"generation": len(built)}  # type: ignore[func-returns-value]
    for k in range(20):
        assert served.ask(encode_info_request(f"s{k}", op="status"))["id"] == f"s{k}"  # every one answered
    assert built == [100.0]
    clock[0] += 2 * frontend_module.STATUS_CACHE_S
    served.ask(encode_info_request("fresh", op="status"))
    assert built == [100.0, clock[0]]
    served.frontend.reconciler.set_plan(Plan((InstancePlan(1, 4),), "fixed", "a new plan"), "test")
    served.ask(encode_info_request("new plan", op="status"))  # a new generation is shown at once
    assert len(built) == 3


def test_too_many_samples_over_the_byte_limit_are_refused_in_samples(served: Served) -> None:
    # The byte limit is max_batch samples plus the header's allowance: a model of large inputs meets it first.
    many = served.frontend.max_message_bytes() // (16 * 4) + 1
    header = served.ask(encode_infer_request("big", rows(many)))
    assert header["id"] == "big" and header["error"]["code"] == "TOO_LARGE"
    message = header["error"]["message"]
    assert message.startswith(f"the request of {many} samples is ") and "this server takes at most 4 samples" in message


def test_a_draining_frontend_refuses_work_but_still_answers_info(served: Served) -> None:
    served.frontend.accepting = False
    header = served.ask(encode_infer_request(1, rows(1)))
    assert header["error"]["code"] == "SHUTTING_DOWN" and served.batcher.queued_inputs == 0
    assert served.ask(encode_info_request(2))["ok"] is True


def test_a_reload_that_shrinks_max_batch_shrinks_the_limits(served: Served) -> None:
    before = served.frontend.max_message_bytes()
    served.batcher.max_batch = 2
    assert served.frontend.max_message_bytes() == before - 2 * 16 * 4
    header = served.ask(encode_infer_request(1, rows(3)))
    assert header["error"]["code"] == "TOO_LARGE" and "at most 2" in header["error"]["message"]
    assert info_result(served.ask(encode_info_request(2)))["max_batch"] == 2


# -- the crashers of issue 12 and the frontend's own limits ----------------------------------------------


@pytest.mark.parametrize(
    "frames",
    [
        [b'{"v":1,"id":"\\ud800","op":"info"}'],  # a lone surrogate id, on the info path
        [b'{"v":1,"id":"\\ud800","op":"infer","dtype":"float32","shape":[1,16]}', rows(1).tobytes()],
        [b"", b'{"v":1,"id":"\\udfff","op":"info"}'],  # over REQ
        [b'{"v":1,"id":1,"op":"infer","dtype":"float32","shape":[1,16],"timeout_ms":' + b"9" * 400 + b"}",
         rows(1).tobytes()],  # a 400-digit timeout_ms, fast path and full parser
    ],
)  # fmt: skip
def test_the_messages_that_stopped_the_daemon_are_bad_requests(served: Served, frames: list[bytes]) -> None:
    header = served.ask(frames)
    assert header["ok"] is False and header["error"]["code"] == "BAD_REQUEST"
    assert served.ask(encode_info_request("after"))["ok"] is True  # and the frontend still serves


def test_any_failure_on_one_message_is_answered_internal_and_logged(
    served: Served, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(*_args: object) -> None:
        raise RuntimeError("a bug on the request path")

    monkeypatch.setattr("packrat_daemon.requests.frontend.check_against_model", broken)
    header = served.ask(encode_infer_request(1, rows(1)))
    assert header["error"]["code"] == "INTERNAL" and header["id"] is None
    assert "internal error on a message of" in caplog.text and "a bug on the request path" in caplog.text
    monkeypatch.undo()
    assert served.ask(encode_info_request(2))["ok"] is True


def test_a_message_of_many_frames_is_refused_without_keeping_them(served: Served) -> None:
    head = b'{"v":1,"id":"many","op":"infer","dtype":"float32","shape":[1,16]}'
    header = served.ask([head, *[b"x" * 8] * 50])
    assert header["id"] == "many" and header["error"]["code"] == "BAD_REQUEST"
    assert "51 frames" in header["error"]["message"]
    limit = served.frontend.max_message_bytes()
    # Each frame is under the limit, all of them together far over it: the whole message counts.
    header = served.ask([head, *[b"x" * (limit // 4)] * 12])
    assert header["id"] == "many" and header["error"]["code"] == "TOO_LARGE"
    assert f"at most {limit}" in header["error"]["message"]


def _send_frames_bomb(client: zmq.Socket, head: bytes, frames: int, size: int = 0) -> None:
    """One message: `head`, then `frames` frames of `size` bytes."""
    client.send(head, zmq.SNDMORE)
    filler = bytes(size)
    for _ in range(frames - 1):
        client.send(filler, zmq.SNDMORE)
    client.send(filler)


def test_a_message_of_too_many_frames_is_discarded_a_share_per_read_while_the_others_are_answered(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Issue 27, 11: the frontend read 10 million frames in one go, and the loop answered nothing meanwhile: requests it
    # held (their deadlines, their batches' results) waited with the rest. ZeroMQ gives no other client's message
    # before that one's last frame, but the loop can answer the ones it has between shares.
    share = 1000
    monkeypatch.setattr(frontend_module, "DISCARD_FRAMES_PER_WAKE", share)
    assert served.ask(encode_infer_request("held", rows(1))) == {}
    (held,) = served.batcher.queue
    attacker = zmq.Context.instance().socket(zmq.DEALER)
    attacker.setsockopt(zmq.LINGER, 0)
    attacker.connect(served.frontend.endpoint)
    try:
        frames = 5 * share + 17
        _send_frames_bomb(attacker, b'{"v":1,"id":"bomb","op":"infer","dtype":"float32","shape":[1,16]}', frames)
        assert served.frontend.socket.poll(10_000)
        assert served.frontend.read() == 0 and not attacker.poll(100)  # one share read, the message not yet answered
        # Unbounded while it is discarded (libzmq's per-frame wake-ups come with the low-water mark), then bounded.
        assert served.frontend.socket.getsockopt(zmq.RCVHWM) == frontend_module.DISCARDING_RECEIVE_HWM
        served.frontend.reply_error(held, ErrorCode.TIMEOUT, "its deadline passed")  # what the loop does meanwhile
        assert served.client.poll(1000), "a request the frontend held was not answered while the message was discarded"
        assert decode_reply(served.client.recv_multipart())[0]["error"]["code"] == "TIMEOUT"
        reads = 1
        while served.frontend.socket.poll(0):  # readable while the message's frames last: nothing else is queued
            served.frontend.read()
            reads += 1
        assert attacker.poll(5000), "the message was not answered"
        header, _ = decode_reply(attacker.recv_multipart())
        assert header["id"] == "bomb" and header["error"]["code"] == "BAD_REQUEST"
        assert f"{frames + 1} frames" in header["error"]["message"]
        assert reads == -(-(frames + 1 - frontend_module.MAX_KEPT_FRAMES + 1) // share)  # a share each, and no more
        assert served.frontend.socket.getsockopt(zmq.RCVHWM) == frontend_module.RECEIVE_HWM
        # The next message is read whole: nothing of it went with the discarded frames.
        assert served.ask(encode_info_request("after"))["id"] == "after"
    finally:
        attacker.close()


def test_the_receive_bound_comes_back_mid_discard_once_memory_has_grown_by_the_allowance(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Unbounded queues let the other clients queue all they send while a message is discarded: only up to
    # DISCARD_UNBOUNDED_MAX_BYTES more than the peak at its start, then the 64-message bound is back.
    share = 1000
    monkeypatch.setattr(frontend_module, "DISCARD_FRAMES_PER_WAKE", share)
    peaks = iter([100 << 20, 120 << 20, (100 << 20) + frontend_module.DISCARD_UNBOUNDED_MAX_BYTES])
    monkeypatch.setattr(frontend_module, "peak_memory", lambda: next(peaks))
    _send_frames_bomb(served.client, b'{"v":1,"id":"bomb","op":"infer","dtype":"float32","shape":[1,16]}', 5 * share)
    assert served.frontend.socket.poll(5000)
    rcvhwm = []
    for _ in range(3):
        served.frontend.read()
        rcvhwm.append(served.frontend.socket.getsockopt(zmq.RCVHWM))
    # Grown 20 MiB after the first share: still unbounded; by the allowance after the second: bounded again.
    assert rcvhwm == [frontend_module.DISCARDING_RECEIVE_HWM, frontend_module.RECEIVE_HWM, frontend_module.RECEIVE_HWM]
    while served.frontend.socket.poll(0):  # the rest, bounded: no more looks at the memory (the iterator is spent)
        served.frontend.read()
    assert served.client.poll(5000)
    assert decode_reply(served.client.recv_multipart())[0]["error"]["code"] == "BAD_REQUEST"


def test_a_message_of_too_many_frames_over_the_byte_limit_is_too_large(served: Served) -> None:
    # The frames discarded count towards the message's size, as the ones kept do.
    limit = served.frontend.max_message_bytes()
    frames = 2 * frontend_module.MAX_KEPT_FRAMES
    _send_frames_bomb(served.client, b'{"v":1,"id":"big","op":"infer","dtype":"float32","shape":[9,16]}', frames,
                      limit // frontend_module.MAX_KEPT_FRAMES)  # fmt: skip
    assert served.frontend.socket.poll(5000)
    served.frontend.read()
    assert served.client.poll(5000)
    header, _ = decode_reply(served.client.recv_multipart())
    assert header["id"] == "big" and header["error"]["code"] == "TOO_LARGE"
    assert "the request of 9 samples is" in header["error"]["message"]


def test_info_states_the_size_limits(served: Served) -> None:
    limits = info_result(served.ask(encode_info_request(1)))["limits"]
    limit = served.frontend.max_message_bytes()
    assert limits["max_samples"] == 4 and limits["max_message_bytes"] == limit
    assert limits["max_frame_bytes"] >= limit and limits["max_header_bytes"] == 65536
    assert limits["max_id_chars"] == 128 and limits["max_timeout_ms"] == 2**31 - 1


def test_after_the_drain_waiting_requests_get_shutting_down(served: Served) -> None:
    for k in range(5):
        served.client.send_multipart(encode_infer_request(k, rows(1)))
    served.client.send_multipart(encode_info_request("i"))
    assert served.frontend.socket.poll(5000)
    served.frontend.refuse_waiting()
    replies = []
    while served.client.poll(500):
        replies.append(decode_reply(served.client.recv_multipart())[0])
    assert sorted(r["error"]["code"] for r in replies if not r["ok"]) == ["SHUTTING_DOWN"] * 5
    assert [r["id"] for r in replies if r["ok"]] == ["i"] and served.batcher.queued_inputs == 0


def test_after_the_drain_a_client_that_pauses_between_requests_is_still_answered(served: Served) -> None:
    # Closing at the first moment the queue is empty lost the request a client sent right after a reply.
    gap_s = frontend_module.REFUSE_QUIET_S / 3
    endpoint = served.frontend.endpoint

    def send_with_pauses() -> None:
        client = zmq.Context.instance().socket(zmq.DEALER)
        client.setsockopt(zmq.LINGER, 0)
        client.connect(endpoint)
        for k in range(6):
            client.send_multipart(encode_infer_request(k, rows(1)))
            assert client.poll(5000), f"request {k} got no reply"
            replies.append(decode_reply(client.recv_multipart())[0])
            time.sleep(gap_s)
        client.close()

    replies: list[dict[str, Any]] = []
    sender = threading.Thread(target=send_with_pauses)
    sender.start()
    assert served.frontend.socket.poll(5000)
    served.frontend.refuse_waiting()
    sender.join()
    assert [r["error"]["code"] for r in replies] == ["SHUTTING_DOWN"] * 6


def test_after_the_drain_a_client_that_never_stops_cannot_keep_the_daemon_up(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(frontend_module, "REFUSE_WAITING_S", 0.3)
    stop = threading.Event()
    endpoint = served.frontend.endpoint

    def flood() -> None:
        client = zmq.Context.instance().socket(zmq.DEALER)
        client.setsockopt(zmq.LINGER, 0)
        client.connect(endpoint)
        while not stop.is_set():
            client.send_multipart(encode_infer_request(1, rows(1)))
            time.sleep(0.005)
        client.close()

    sender = threading.Thread(target=flood)
    sender.start()
    try:
        assert served.frontend.socket.poll(5000)
        started = time.monotonic()
        served.frontend.refuse_waiting()
        assert time.monotonic() - started < 0.3 + frontend_module.REFUSE_QUIET_S
    finally:
        stop.set()
        sender.join()


@pytest.mark.parametrize(
    "frames",
    [
        encode_infer_request(1, np.zeros((1, 8), dtype=np.float32)),
        encode_infer_request(2, np.zeros((1, 16), dtype=np.float64)),
        encode_infer_request(3, rows(5)),
        [b"not json", rows(1).tobytes()],
        [b'{"v": 1, "id": 4, "op": "infer", "dtype": "float32", "shape": [1, 16]}'],
    ],
)
def test_an_error_names_its_code_once(served: Served, frames: list[Any]) -> None:
    # The model checks used to send str(exc), which already began with the code: the client then showed
    # "BAD_REQUEST: BAD_REQUEST: ...".
    header = served.ask(frames)
    code, message = header["error"]["code"], header["error"]["message"]
    assert not any(message.startswith(f"{known}:") for known in ErrorCode)
    assert str(server_error(header)) == f"{code}: {message}"


def _resident_mib() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


@pytest.mark.slow
def test_the_memory_a_message_of_very_many_frames_took_is_given_back(
    served: Served, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # Issue 27, 11: libzmq buffers a whole message before the daemon sees it, about 64 bytes a frame; glibc kept what
    # it freed, so one message of 10 million empty frames left the daemon 610 MiB larger for good.
    monkeypatch.setattr(oversized_module, "_trimmed_at", -float("inf"))
    frames = 3 * frontend_module.TRIM_AFTER_FRAMES
    before = _resident_mib()
    for _ in range(frames):
        served.client.send(b"", zmq.SNDMORE)
    served.client.send(b"")
    deadline = time.monotonic() + 60
    while not served.frontend.socket.poll(100) and time.monotonic() < deadline:
        pass
    held = _resident_mib() - before
    while served.frontend.socket.poll(0):
        served.frontend.read()
    assert served.client.poll(5000), "the message was not answered"
    header, _ = decode_reply(served.client.recv_multipart())
    assert header["error"]["code"] == "BAD_REQUEST" and f"{frames} frames" in header["error"]["message"]
    assert f"refused a message of {frames + 1} frames (0 bytes)" in caplog.text  # all waited for it: logged
    assert held > 10  # what the message took while it waited to be read, on both sockets of this process
    assert _resident_mib() - before < held / 3, (before, held, _resident_mib())
