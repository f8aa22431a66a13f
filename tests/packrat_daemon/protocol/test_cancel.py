"""Cancelled work is not computed (issue 38): gRPC calls cancelled by their client and HTTP connections closed while
their requests wait leave the daemon's queue at once, through a real daemon serving a slow model (0.3 s a batch),
its real gateway and Triton's own gRPC client. Without the cancel, the 40 + 40 requests below would keep the
queue busy for about 3 s after their clients left."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from tests.helpers.daemons import PINNED_ARGS, daemon_env, stop_process
from tests.packrat_daemon.protocol.test_tritonclient import free_port

pytest.importorskip("tritonclient.grpc", reason="tritonclient is not installed (pip install -e '.[test]')")
import tritonclient.grpc as grpcclient  # noqa: E402

pytestmark = pytest.mark.slow

CALLS = 40


def _queued(endpoint: str) -> int:
    done = subprocess.run(
        [sys.executable, "-m", "packrat_daemon", "status", "--endpoint", endpoint, "--json"],
        env=daemon_env(), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    return int(json.loads(done.stdout)["queue"]["requests"])


def _cancelled_counts(http_port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/metrics", timeout=10) as reply:
        lines = reply.read().decode().splitlines()
    return {
        protocol: float(line.split()[-1])
        for line in lines
        for protocol in ("rest", "grpc")
        if line.startswith("packrat_gateway_refusals_total") and f'protocol="{protocol}",reason="cancelled"' in line
    }


def test_cancelled_calls_and_closed_connections_leave_the_daemons_queue(tmp_path: Path) -> None:
    http_port, grpc_port = free_port(), free_port()
    endpoint = f"ipc://{tmp_path}/front.ipc"
    profile = tmp_path / "profile.csv"
    profile.write_text("threads,batch,latency_ms\n1,1,300\n1,2,300\n")
    args = ["--endpoint", endpoint, "--model", "tests.model_factories:slow_mlp", "--policy", "fixed"]
    args += ["--plan", "1*1x2", "--max-batch", "2", "--profile", str(profile), "--state-dir", str(tmp_path / "s")]
    args += ["--http-port", str(http_port), "--grpc-port", str(grpc_port), *PINNED_ARGS]
    env = {**daemon_env(), "PYTHONPATH": str(Path(__file__).resolve().parents[3])}
    log = tmp_path / "daemon.log"
    with open(log, "wb") as out:
        process = subprocess.Popen([sys.executable, "-m", "packrat_daemon", "serve", *args], env=env, stdout=out,
                                   stderr=out)  # fmt: skip
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}")
    try:
        deadline = time.monotonic() + 120
        while True:
            assert process.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            try:
                if client.is_model_ready("slow_mlp"):
                    break
            except Exception:  # noqa: BLE001 - not listening yet
                pass
            time.sleep(0.2)
        tensor = grpcclient.InferInput("input", [1, 16], "FP32")
        tensor.set_data_from_numpy(np.ones((1, 16), np.float32))
        errors: list[object] = []
        calls = [client.async_infer("slow_mlp", [tensor], lambda _r, e: errors.append(e)) for _ in range(CALLS)]
        body = json.dumps({"inputs": [{"name": "input", "shape": [1, 16], "datatype": "FP32", "data": [1.0] * 16}]})
        head = f"POST /v2/models/slow_mlp/infer HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n"
        connections = [socket.create_connection(("127.0.0.1", http_port)) for _ in range(CALLS)]
        for connection in connections:
            connection.sendall((head + body).encode())
        time.sleep(0.5)
        assert _queued(endpoint) > CALLS  # they wait: a batch of 2 every 0.3 s
        for call in calls:
            call.cancel()
        for connection in connections:
            connection.close()
        # At most the batch that had started and the one after it are still there (the cancel reaches the daemon
        # within a handler thread's look, CANCEL_POLL_S); without the cancel, about 70 requests would be.
        left = _queued(endpoint)
        assert left <= 4, left
        counts = _cancelled_counts(http_port)
        assert counts["rest"] >= CALLS - 4 and counts["grpc"] >= 1, counts
    finally:
        client.close()
        stop_process(process, 30)
    assert "Traceback" not in log.read_text()
