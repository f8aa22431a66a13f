"""Real daemons under worker faults and shutdown, with serve's default slice hedges and deadlines: a hung
worker stalls a batch only until its slice is hedged, a merely slow one is hedged and not killed,
timeout_ms bounds a request that is being computed, and a drain answers every request."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import zmq
from zmq.utils.monitor import recv_monitor_message

from packrat_daemon.config import ServeConfig
from packrat_daemon.wire.client import Client
from packrat_daemon.wire.client_side import encode_infer_request
from policies.planning.profile import Profile
from tests.helpers.daemons import running_daemon
from tests.model_factories import SlowMLP
from workers.worker import HEARTBEAT_SECONDS

pytestmark = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs for two pinned workers")

SLOW = "tests.model_factories:slow_mlp"
# SlowMLP sleeps this long per batch whatever its size: the latency its profile predicts.
SLICE_MS = SlowMLP().delay_s * 1000.0
DEFAULTS = ServeConfig()
# When serve's defaults hedge a slice of SlowMLP, and when they replace its worker.
HEDGE_S = max(DEFAULTS.slice_hedge_floor_ms, DEFAULTS.slice_hedge_margin * SLICE_MS) / 1000.0
REPLACE_S = max(DEFAULTS.slice_deadline_floor_ms, DEFAULTS.slice_deadline_margin * SLICE_MS) / 1000.0


@pytest.fixture
def slow_daemon(tmp_path: Path) -> Iterator[tuple[str, subprocess.Popen]]:
    profile = tmp_path / "slow.csv"
    Profile.from_latencies({(1, b): SLICE_MS for b in (1, 2, 4)}).write_csv(profile)
    args = ["--model", SLOW, "--policy", "fixed", "--plan", "2*1x2", "--max-batch", "4", "--profile", str(profile)]
    with running_daemon(tmp_path, *args, "--no-adapt") as served:
        yield served


def stopped_in_a_batch(endpoint: str, x: np.ndarray, pid: int) -> tuple[zmq.Socket, float]:
    """Send `x` as one batch on a new socket and SIGSTOP worker `pid` inside its slice; (socket, send time)."""
    socket = zmq.Context.instance().socket(zmq.DEALER)
    socket.setsockopt(zmq.LINGER, 0)
    socket.connect(endpoint)
    sent = time.monotonic()
    socket.send_multipart(encode_infer_request(7, x))
    time.sleep(SLICE_MS / 3000.0)  # both workers are inside their slice now
    os.kill(pid, signal.SIGSTOP)
    return socket, sent


def result_of(socket: zmq.Socket) -> np.ndarray:
    assert socket.poll(60_000), "no reply"
    header, *rest = socket.recv_multipart()
    assert json.loads(header)["ok"] is True, header
    return np.frombuffer(rest[0], dtype=np.float32).reshape(4, -1)


@pytest.mark.slow
def test_a_hung_worker_costs_a_batch_its_hedge_not_the_job_timeout(
    slow_daemon: tuple[str, subprocess.Popen], tmp_path: Path
) -> None:
    endpoint, _ = slow_daemon
    with Client(endpoint, timeout=60) as client:
        workers = client.info()["workers"]
        x = np.random.default_rng(3).standard_normal((4, 16), dtype=np.float32)
        expected = client.infer(x)
        stopped = workers[0]["pid"]
        socket, sent = stopped_in_a_batch(endpoint, x, stopped)
        try:
            np.testing.assert_array_equal(result_of(socket), expected)
            elapsed = time.monotonic() - sent
            # The hedge, then the slice again on the other worker: under 3 x the slice, before the replacement.
            assert HEDGE_S + SLICE_MS / 1000.0 < 3 * SLICE_MS / 1000.0 < REPLACE_S
            assert elapsed < 3 * SLICE_MS / 1000.0, f"the batch took {elapsed:.2f} s"
            deadline = time.monotonic() + 30
            while stopped in {w["pid"] for w in client.info()["workers"]} or len(client.info()["workers"]) < 2:
                assert time.monotonic() < deadline, "the hung worker was not replaced"
                time.sleep(0.2)
        finally:
            socket.close()
            with contextlib.suppress(ProcessLookupError):
                os.kill(stopped, signal.SIGCONT)
    log = (tmp_path / "daemon.log").read_text()
    assert "the first answer is used" in log and "presumed hung" in log


@pytest.mark.slow
def test_a_slow_worker_is_hedged_and_kept(slow_daemon: tuple[str, subprocess.Popen], tmp_path: Path) -> None:
    # A worker held up past its hedge (a busy machine) but not to its deadline is not killed.
    endpoint, _ = slow_daemon
    with Client(endpoint, timeout=60) as client:
        workers = client.info()["workers"]
        x = np.random.default_rng(5).standard_normal((4, 16), dtype=np.float32)
        expected = client.infer(x)
        slow = workers[0]["pid"]
        socket, sent = stopped_in_a_batch(endpoint, x, slow)
        try:
            time.sleep(max(0.0, sent + (HEDGE_S + REPLACE_S) / 2 - time.monotonic()))
            os.kill(slow, signal.SIGCONT)
            np.testing.assert_array_equal(result_of(socket), expected)
        finally:
            socket.close()
            os.kill(slow, signal.SIGCONT)
        time.sleep(REPLACE_S)  # past the slow worker's deadline: it answered before, so it stays
        assert {w["pid"] for w in client.info()["workers"]} == {w["pid"] for w in workers}
        np.testing.assert_array_equal(client.infer(x), expected)
    log = (tmp_path / "daemon.log").read_text()
    assert "the first answer is used" in log and "presumed hung" not in log


@pytest.mark.slow
def test_a_worker_stopped_while_idle_is_replaced_within_three_heartbeats(
    slow_daemon: tuple[str, subprocess.Popen], tmp_path: Path
) -> None:
    # Left for long, a second fault would find no healthy worker to hedge on or to take the slice.
    endpoint, _ = slow_daemon
    with Client(endpoint, timeout=60) as client:
        stopped = client.info()["workers"][1]["pid"]
        os.kill(stopped, signal.SIGSTOP)
        try:
            began = time.monotonic()
            while stopped in {w["pid"] for w in client.info()["workers"]} or len(client.info()["workers"]) < 2:
                assert time.monotonic() - began < 3 * HEARTBEAT_SECONDS + 5, "the stopped worker was not replaced"
                time.sleep(0.1)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(stopped, signal.SIGCONT)
    assert "sent no heartbeat" in (tmp_path / "daemon.log").read_text()


@pytest.mark.slow
def test_timeout_ms_is_answered_while_the_batch_computes(slow_daemon: tuple[str, subprocess.Popen]) -> None:
    endpoint, _ = slow_daemon
    socket = zmq.Context.instance().socket(zmq.DEALER)
    socket.setsockopt(zmq.LINGER, 0)
    socket.connect(endpoint)
    timeout_ms = SLICE_MS / 3
    sent = time.monotonic()
    socket.send_multipart(encode_infer_request(1, np.ones((2, 16), np.float32), timeout_ms=timeout_ms))
    assert socket.poll(10_000)
    header = json.loads(socket.recv_multipart()[0])
    elapsed_ms = (time.monotonic() - sent) * 1000.0
    socket.close()
    assert header["error"]["code"] == "TIMEOUT" and "while it was computed" in header["error"]["message"]
    assert elapsed_ms < SLICE_MS, f"answered after {elapsed_ms:.0f} ms, not within the request's {timeout_ms:.0f} ms"


@pytest.mark.slow
def test_every_request_sent_through_the_drain_is_answered(
    slow_daemon: tuple[str, subprocess.Popen], tmp_path: Path
) -> None:
    endpoint, process = slow_daemon
    socket = zmq.Context.instance().socket(zmq.DEALER)
    socket.setsockopt(zmq.LINGER, 0)
    monitor = socket.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)
    socket.connect(endpoint)
    x = np.ones((1, 16), np.float32)
    sent_while_open, unanswered, codes = 0, set(), []
    sent_at: dict[int, float] = {}  # on the machine's monotonic clock, which the daemon's log uses too
    connected = closed = False
    first_refusal = None  # requests sent when the first SHUTTING_DOWN came back
    for k in range(4):  # a batch in flight and more queued when the signal comes
        socket.send_multipart(encode_infer_request(k, x))
        unanswered.add(k)
    sent = 4
    time.sleep(0.05)
    process.send_signal(signal.SIGTERM)
    while process.poll() is None:
        while monitor.poll(0):
            event = recv_monitor_message(monitor)["event"]
            connected = connected or event == zmq.EVENT_CONNECTED
            closed = closed or (connected and event == zmq.EVENT_DISCONNECTED)
        try:
            socket.send_multipart(encode_infer_request(sent, x), zmq.NOBLOCK)
        except zmq.Again:
            time.sleep(0.005)  # closed, and this socket's queue is full: a blocking send would wait for ever
        else:
            sent_at[sent] = time.monotonic()
            unanswered.add(sent)
            sent += 1
            sent_while_open += not closed
        while socket.poll(5):
            header = json.loads(socket.recv_multipart()[0])
            unanswered.discard(header["id"])
            codes.append("ok" if header["ok"] else header["error"]["code"])
            if codes[-1] == "SHUTTING_DOWN" and first_refusal is None:
                first_refusal = sent
    while socket.poll(300):
        unanswered.discard(json.loads(socket.recv_multipart()[0])["id"])
    socket.close()
    monitor.close()
    assert process.returncode == 0
    assert codes.count("ok") >= 4  # the work queued before the signal was finished
    assert first_refusal is not None and "SHUTTING_DOWN" in codes
    # Every request sent before the daemon's last call got its reply. The client's socket monitor reports
    # the close a moment after it: a request sent in that moment may get none.
    [closing] = [line for line in (tmp_path / "daemon.log").read_text().splitlines() if "last call at" in line]
    last_call = float(closing.split("monotonic ")[1].split()[0])
    assert not {k for k in unanswered if k < 4 or sent_at[k] < last_call}
    assert first_refusal < 4 + sent_while_open and sent_at[4 + sent_while_open - 1] > last_call


@pytest.mark.slow
def test_a_batch_that_loses_every_worker_waits_for_their_replacements(
    slow_daemon: tuple[str, subprocess.Popen],
) -> None:
    endpoint, _ = slow_daemon
    with Client(endpoint, timeout=60) as client:
        x = np.random.default_rng(4).standard_normal((4, 16), dtype=np.float32)
        expected = client.infer(x)
        workers = client.info()["workers"]
        socket = zmq.Context.instance().socket(zmq.DEALER)
        socket.setsockopt(zmq.LINGER, 0)
        socket.connect(endpoint)
        try:
            socket.send_multipart(encode_infer_request(9, x))
            time.sleep(SLICE_MS / 3000.0)  # both workers are inside their slice now
            for worker in workers:
                os.kill(worker["pid"], signal.SIGKILL)
            assert socket.poll(60_000), "no reply"
            header, *rest = socket.recv_multipart()
        finally:
            socket.close()
    assert json.loads(header)["ok"] is True, header
    np.testing.assert_array_equal(np.frombuffer(rest[0], dtype=np.float32).reshape(4, -1), expected)
