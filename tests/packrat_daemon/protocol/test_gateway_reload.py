"""A live setting reaches the gateway a daemon started: the gateway learns `max_delay_ms` from the daemon's `status`
(as it does the runtime and the plan's instances), not once from its launch, so a SIGHUP that changes it changes
what the model configuration reports. A real daemon, a real gateway child and a real reload."""

from __future__ import annotations

import json
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from tests.helpers.daemons import daemon_env, stop_process
from tests.packrat_daemon.protocol.test_lifecycle import _serve_command, _wait_ready
from tests.packrat_daemon.protocol.test_tritonclient import free_port

pytestmark = pytest.mark.slow


def _queue_delay_us(port: int) -> int | None:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/models/tiny-mlp/config", timeout=5) as reply:
        config = json.loads(reply.read())
    delay: int | None = config["dynamic_batching"].get("max_queue_delay_microseconds")
    return delay


def test_a_sighup_changing_max_delay_ms_changes_the_gateway_model_configuration(tmp_path: Path) -> None:
    ports = {"http": free_port(), "metrics": free_port()}
    config = tmp_path / "serve.toml"
    config.write_text("max_delay_ms = 2.5\n")  # in the file only: a flag would win over the reload's file
    extra = ["--config", str(config), "--endpoint", f"ipc://{tmp_path}/front.ipc"]
    extra += ["--http-port", str(ports["http"]), "--metrics-port", str(ports["metrics"])]
    log = tmp_path / "daemon.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(_serve_command(tmp_path, *extra), env=daemon_env(), stdout=out, stderr=out)
    try:
        _wait_ready(process, ports, log)
        assert _queue_delay_us(ports["http"]) == 2500
        config.write_text("max_delay_ms = 7.25\n")
        process.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 60
        while (delay := _queue_delay_us(ports["http"])) != 7250:
            assert process.poll() is None, f"the daemon exited:\n{log.read_text()}"
            assert time.monotonic() < deadline, f"still {delay} µs after the reload:\n{log.read_text()}"
            time.sleep(0.1)
        gateways = [line for line in log.read_text().splitlines() if "gateway exited" in line]
        assert not gateways, "the gateway learnt the new delay without being started again"
    finally:
        stop_process(process, 30)
