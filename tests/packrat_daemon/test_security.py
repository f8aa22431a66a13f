"""CURVE with a real daemon: a listed client is served, an unknown key and a plaintext client get nothing;
and the start-up refusals (a public bind without keys, a run dir others may enter) come before any model loads."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from packrat_daemon.wire.client import AsyncClient, Client, ClientTimeout
from packrat_daemon.wire.curve import write_key_pair
from tests.helpers.daemons import PINNED_ARGS, daemon_env, running_daemon

SERVE = [sys.executable, "-m", "packrat_daemon", "serve"]
TINY = ["--model", "builtin:tiny-mlp", "--policy", "fixed", "--plan", "1*1x4", "--max-batch", "4", *PINNED_ARGS]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("keys")
    for name in ("server", "alice", "mallory"):
        write_key_pair(folder, name)
    (folder / "allowed").mkdir(mode=0o755)
    shutil.copy(folder / "alice.key", folder / "allowed" / "alice.key")
    return folder


@pytest.fixture(scope="module")
def curve_daemon(keys: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """A daemon bound on every interface, with keys; yields the loopback endpoint and its log."""
    tmp = tmp_path_factory.mktemp("curve-daemon")
    port = free_port()
    args = [
        *TINY, "--run-dir", str(tmp / "run"),
        "--server-key", str(keys / "server.key_secret"), "--allowed-clients", str(keys / "allowed"),
    ]  # fmt: skip
    alice = {"key": keys / "alice.key_secret", "server_key": keys / "server.key"}
    bind, endpoint = f"tcp://*:{port}", f"tcp://127.0.0.1:{port}"
    with running_daemon(tmp, *args, bind=bind, endpoint=endpoint, client_options=alice):
        yield endpoint, tmp / "daemon.log"


@pytest.mark.slow
def test_a_listed_client_is_served_sync_and_async(keys: Path, curve_daemon: tuple[str, Path]) -> None:
    endpoint, log_path = curve_daemon
    x = np.random.default_rng(0).standard_normal((3, 16), dtype=np.float32)
    with Client(endpoint, timeout=30, key=keys / "alice.key_secret", server_key=keys / "server.key") as alice:
        expected = alice.infer(x)
    assert expected.shape[0] == 3

    async def infer() -> np.ndarray:
        async with AsyncClient(
            endpoint, timeout=30, key=keys / "alice.key_secret", server_key=keys / "server.key"
        ) as client:
            return await client.infer(x)

    np.testing.assert_allclose(asyncio.run(infer()), expected, rtol=1e-5)
    assert "CURVE client alice connected" in log_path.read_text()


@pytest.mark.slow
def test_an_unknown_key_and_a_plaintext_client_get_nothing(keys: Path, curve_daemon: tuple[str, Path]) -> None:
    endpoint, log_path = curve_daemon
    x = np.zeros((1, 16), dtype=np.float32)
    with Client(endpoint, timeout=1.5, key=keys / "mallory.key_secret", server_key=keys / "server.key") as mallory:
        with pytest.raises(ClientTimeout, match="this client's key"):
            mallory.infer(x)
        with pytest.raises(ClientTimeout):
            mallory.info()
    with Client(endpoint, timeout=1.5) as plaintext:
        with pytest.raises(ClientTimeout):
            plaintext.info()
        with pytest.raises(ClientTimeout):
            plaintext.infer(x)
    assert "refused a CURVE client with an unknown key" in log_path.read_text()
    with Client(endpoint, timeout=30, key=keys / "alice.key_secret", server_key=keys / "server.key") as alice:
        assert alice.info()["model"] == "builtin:tiny-mlp"  # still serving the listed client


def refused_at_start(tmp_path: Path, *args: str) -> str:
    """Run `serve` expecting a refusal: its exit status is 2 and it comes before the model is loaded."""
    done = subprocess.run(
        [*SERVE, *TINY, *args], env=daemon_env(), capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert done.returncode == 2, done.stderr
    assert "loading builtin:tiny-mlp" not in done.stderr
    return done.stderr


@pytest.mark.slow
def test_a_public_bind_without_keys_is_refused_saying_how_to_fix_it(tmp_path: Path) -> None:
    message = refused_at_start(tmp_path, "--endpoint", f"tcp://0.0.0.0:{free_port()}")
    assert "packrat keygen" in message and "--server-key" in message and "--insecure-public" in message


@pytest.mark.slow
def test_a_run_dir_others_may_enter_is_refused(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir(mode=0o755)
    os.chmod(run_dir, 0o755)
    message = refused_at_start(tmp_path, "--endpoint", f"ipc://{tmp_path}/front.ipc", "--run-dir", str(run_dir))
    assert f"chmod 700 {run_dir}" in message


@pytest.mark.parametrize(("address", "warned"), [("0.0.0.0", True), ("127.0.0.1", False)])
def test_metrics_beyond_loopback_are_warned(address: str, warned: bool, caplog: pytest.LogCaptureFixture) -> None:
    from packrat_daemon.ops.metrics import Metrics

    metrics = Metrics("builtin:tiny-mlp")
    with caplog.at_level(logging.WARNING, "packrat.security"):
        metrics.serve(free_port(), address)
    metrics.close()
    assert ("can be read by anyone who reaches it" in caplog.text) is warned
