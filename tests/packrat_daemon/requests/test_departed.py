"""A client that disconnects with requests queued (issue 27, 13): a real daemon drops them, so another client's
requests do not wait behind work computed for nobody."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
import zmq

from packrat_daemon.wire.client import Client
from packrat_daemon.wire.client_side import encode_infer_request
from packrat_daemon.wire.codec import MAX_TIMEOUT_MS
from tests.helpers.daemons import running_daemon


@pytest.mark.slow
def test_the_queued_requests_of_a_client_that_disconnects_are_dropped(tmp_path: Path) -> None:
    # Before: the 64 requests stayed queued and were computed one batch after another (0.3 s each), the other
    # client's request behind them all.
    args = ["--model", "tests.model_factories:slow_mlp", "--policy", "fixed", "--plan", "1x16", "--max-batch",
            "16", "--no-adapt"]  # fmt: skip
    with running_daemon(tmp_path, *args) as (endpoint, _):
        context = zmq.Context()
        leaver = context.socket(zmq.DEALER)
        leaver.connect(endpoint)
        x = np.ones((16, 16), np.float32)
        for k in range(64):
            leaver.send_multipart(encode_infer_request(k, x, timeout_ms=MAX_TIMEOUT_MS))
        with Client(endpoint, timeout=30) as innocent:
            deadline = time.monotonic() + 20
            while innocent.status()["queue"]["requests"] < 32 and time.monotonic() < deadline:
                time.sleep(0.05)  # until the daemon has read most of them
            leaver.close(linger=0)
            context.term()
            y = innocent.infer(np.full((1, 16), 2.0, np.float32))
            assert y.shape == (1, 4)
            status = innocent.status()
    log = (tmp_path / "daemon.log").read_text()
    dropped = [line for line in log.splitlines() if "client(s) that disconnected" in line]
    assert dropped, log
    assert sum(int(line.split("dropped ")[1].split()[0]) for line in dropped) >= 32
    assert status["queue"]["requests"] == 0
