"""The daemon and its Open Inference Protocol gateway as one service (docs/oip.md, "One service"), with real
daemons, a real gateway child and real sockets: a port already taken stops the start with exit 2 naming it (and
no second listener shares it), SIGTERM under REST and gRPC load loses no request, a gateway killed under load
makes the daemon unready until it is back, and a start that fails exits 2 without a traceback."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.helpers.daemons import PINNED_ARGS, daemon_env, stop_process
from tests.helpers.oip_clients import LOST, NOT_CONNECTED, OK, REFUSED, closed_loops, gateway_pid, http_status
from tests.packrat_daemon.protocol.test_tritonclient import free_port

pytestmark = pytest.mark.slow

MODEL = "tiny-mlp"
SAMPLE = np.ones((1, 16), np.float32)


def _serve_command(tmp: Path, *extra: str, model: str = "builtin:tiny-mlp") -> list[str]:
    profile = tmp / "profile.csv"
    profile.write_text("threads,batch,latency_ms\n1,1,0.2\n1,2,0.3\n1,4,0.4\n")
    args = ["--model", model, "--policy", "fixed", "--plan", "1*1x4", "--max-batch", "4", "--profile", str(profile)]
    args += ["--state-dir", str(tmp / "state"), *PINNED_ARGS, *extra]
    return [sys.executable, "-m", "packrat_daemon", "serve", *args]


def _wait_ready(process: subprocess.Popen[bytes], ports: dict[str, int], log: Path, timeout_s: float = 120) -> None:
    """Until the daemon and the gateway are ready (the gateway learns the model's description just after)."""
    deadline = time.monotonic() + timeout_s
    while http_status(ports["metrics"]) != 200 or http_status(ports["http"], "/v2/health/ready") != 200:
        assert process.poll() is None, f"the daemon exited:\n{log.read_text()}"
        assert time.monotonic() < deadline, f"not ready in time:\n{log.read_text()}"
        time.sleep(0.1)


@contextlib.contextmanager
def _daemon(tmp: Path) -> Iterator[tuple[subprocess.Popen[bytes], dict[str, int], Path]]:
    ports = {"http": free_port(), "grpc": free_port(), "metrics": free_port()}
    extra = ["--endpoint", f"ipc://{tmp}/front.ipc", "--http-port", str(ports["http"])]
    extra += ["--grpc-port", str(ports["grpc"]), "--metrics-port", str(ports["metrics"])]
    log = tmp / "daemon.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(_serve_command(tmp, *extra), env=daemon_env(), stdout=out, stderr=out)
    try:
        _wait_ready(process, ports, log)
        yield process, ports, log
    finally:
        stop_process(process, 30)


# -- a port already taken ----------------------------------------------------------------------------


def _grpc_holder(port: int) -> object:
    """A gRPC server on `port` bound as grpcio binds by default (SO_REUSEPORT on): a second one would share it."""
    from concurrent import futures

    import grpc

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    assert server.add_insecure_port(f"127.0.0.1:{port}") == port
    server.start()
    return server


@pytest.mark.parametrize("which", ["zeromq", "rest", "grpc", "metrics"])
def test_a_port_already_taken_stops_the_start_with_exit_2_naming_it(tmp_path: Path, which: str) -> None:
    port = free_port()
    holder: object = None
    plain = socket.socket()
    try:
        if which == "grpc":
            holder = _grpc_holder(port)
        else:
            plain.bind(("127.0.0.1", port))
            plain.listen()
        ports = {"rest": ["--http-port"], "grpc": ["--grpc-port"], "metrics": ["--metrics-port"]}
        endpoint = f"tcp://127.0.0.1:{port}" if which == "zeromq" else f"ipc://{tmp_path}/front.ipc"
        extra = ["--endpoint", endpoint]
        if which != "zeromq":
            extra += [ports[which][0], str(port)]
        if which != "rest":  # the gateway runs in every case but the ZeroMQ one's... and then beside it
            extra += ["--http-port", str(free_port())]
        done = subprocess.run(
            _serve_command(tmp_path, *extra), env=daemon_env(), capture_output=True, text=True, timeout=120
        )
    finally:
        plain.close()
        if holder is not None:
            holder.stop(None)  # type: ignore[attr-defined]
    assert done.returncode == 2, done.stderr
    assert str(port) in done.stderr.splitlines()[-1], done.stderr
    assert "Traceback" not in done.stderr, done.stderr


# -- SIGTERM under load ------------------------------------------------------------------------------


def test_sigterm_under_rest_and_grpc_load_answers_or_refuses_every_request(tmp_path: Path) -> None:
    with _daemon(tmp_path) as (process, ports, log):
        rest, rpc, stop, threads = closed_loops("127.0.0.1", ports["http"], ports["grpc"], MODEL, SAMPLE, 6, 6)
        time.sleep(1.5)
        process.send_signal(signal.SIGTERM)
        assert process.wait(60) == 0, log.read_text()
        stop.set()
        for thread in threads:
            thread.join(30)
    for outcomes in (rest, rpc):
        assert outcomes.counts[LOST] == 0, outcomes.lost
        assert outcomes.counts[OK] > 0
        # Every client stopped on a refusal, or found nothing listening (no request was taken then).
        assert outcomes.counts[REFUSED] + outcomes.counts[NOT_CONNECTED] == 6, outcomes.to_json()


# -- a gateway that dies -----------------------------------------------------------------------------


def _zeromq_loop(endpoint: str, errors: list[str], answered: list[int], stop: threading.Event) -> None:
    from packrat_daemon.wire.client import Client

    with Client(endpoint, timeout=30) as client:
        while not stop.is_set():
            try:
                client.infer(SAMPLE)
                answered[0] += 1
            except Exception as exc:  # noqa: BLE001 - every failure is what the test counts
                errors.append(f"{type(exc).__name__}: {exc}")


def test_a_killed_gateway_makes_the_daemon_unready_until_it_is_back(tmp_path: Path) -> None:
    with _daemon(tmp_path) as (process, ports, log):
        errors: list[str] = []
        answered, stop = [0], threading.Event()
        zeromq = threading.Thread(target=_zeromq_loop, args=(f"ipc://{tmp_path}/front.ipc", errors, answered, stop))
        zeromq.start()
        rest, rpc, stop_oip, threads = closed_loops("127.0.0.1", ports["http"], ports["grpc"], MODEL, SAMPLE, 2, 2)
        try:
            time.sleep(0.5)
            killed_at = time.monotonic()
            os.kill(gateway_pid(process.pid), signal.SIGKILL)
            seen: list[tuple[float, int | None]] = []
            while time.monotonic() - killed_at < 30:
                seen.append((time.monotonic() - killed_at, http_status(ports["metrics"])))
                if seen[-1][1] == 200 and any(status == 503 for _, status in seen):
                    break
                time.sleep(0.05)
            unready = [when for when, status in seen if status == 503]
            assert unready and unready[0] < 1.0, seen  # within one probe period
            assert seen[-1][1] == 200, seen  # and ready again once the gateway is back
            body = json.dumps({"inputs": [{"name": "input", "shape": [1, 16], "datatype": "FP32",
                                           "data": [1.0] * 16}]}).encode()  # fmt: skip
            request = urllib.request.Request(f"http://127.0.0.1:{ports['http']}/v2/models/{MODEL}/infer", body)
            with urllib.request.urlopen(request, timeout=10) as reply:
                assert reply.status == 200
            status = subprocess.run(
                [sys.executable, "-m", "packrat_daemon", "status", "--endpoint", f"ipc://{tmp_path}/front.ipc",
                 "--json"], env=daemon_env(), capture_output=True, text=True, timeout=60,
            )  # fmt: skip
            assert json.loads(status.stdout)["gateway"]["restarts"] == 1, status.stdout + status.stderr
        finally:
            stop.set()
            stop_oip.set()
            zeromq.join(30)
            for thread in threads:
                thread.join(30)
        assert errors == [] and answered[0] > 0  # the daemon answered its own clients all along
        assert "starting it again" in log.read_text()


# -- a start that fails ------------------------------------------------------------------------------


def test_a_model_failing_on_every_input_exits_2_without_a_traceback(tmp_path: Path) -> None:
    extra = ["--endpoint", f"ipc://{tmp_path}/front.ipc", "--http-port", str(free_port())]
    command = _serve_command(tmp_path, *extra, model="tests.model_factories:fails_on_every_input")
    env = {**daemon_env(), "PYTHONPATH": str(Path(__file__).resolve().parents[3])}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "workers in a row failed" in done.stderr.splitlines()[-1]
    assert "Traceback" not in done.stderr, done.stderr
