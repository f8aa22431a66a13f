"""`packrat oip` and `packrat serve --http-port/--grpc-port` as commands: the refusal of a public bind without TLS
(before anything starts), and a gateway serving over TLS, live but not ready while no daemon answers."""

from __future__ import annotations

import shutil
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from packrat_daemon.cli import main
from tests.helpers.daemons import daemon_env, stop_process
from tests.packrat_daemon.protocol.test_tritonclient import free_port


def test_oip_refuses_a_public_bind_without_tls(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["oip", "--connect", "ipc:///nowhere", "--http-port", "8000", "--address", "0.0.0.0"]) == 2
    assert "--tls-cert" in capsys.readouterr().err


def test_serve_refuses_it_before_loading_anything(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["serve", "--model", "builtin:tiny-mlp", "--grpc-port", "8001", "--oip-address", "0.0.0.0"]
    assert main(args) == 2
    assert "beyond this machine" in capsys.readouterr().err


def _self_signed(folder: Path) -> tuple[Path, Path]:
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    cert, key = folder / "tls.crt", folder / "tls.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
         "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    return cert, key


@pytest.mark.slow
def test_a_tls_gateway_is_live_and_not_ready_without_a_daemon(tmp_path: Path) -> None:
    import tritonclient.grpc as grpcclient

    cert, key = _self_signed(tmp_path)
    http_port, grpc_port = free_port(), free_port()
    command = [sys.executable, "-m", "packrat_daemon", "oip", "--connect", f"ipc://{tmp_path}/none.ipc"]
    command += ["--http-port", str(http_port), "--grpc-port", str(grpc_port), "--tls-cert", str(cert)]
    command += ["--tls-key", str(key)]
    process = subprocess.Popen(command, env=daemon_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    context = ssl.create_default_context(cafile=str(cert))
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"https://127.0.0.1:{http_port}/v2/health/live", context=context) as r:
                    assert r.status == 200
                break
            except (urllib.error.URLError, ConnectionError):
                assert process.poll() is None and time.monotonic() < deadline
                time.sleep(0.2)
        with pytest.raises(urllib.error.HTTPError) as caught:
            urllib.request.urlopen(f"https://127.0.0.1:{http_port}/v2/health/ready", context=context)
        assert caught.value.code == 400  # the protocol's "false" for a health check: a 4xx
        with pytest.raises((urllib.error.URLError, ConnectionError)):  # no plaintext on a TLS port
            urllib.request.urlopen(f"http://127.0.0.1:{http_port}/v2/health/live")
        rpc = grpcclient.InferenceServerClient(f"localhost:{grpc_port}", ssl=True, root_certificates=str(cert))
        try:
            assert rpc.is_server_live() and not rpc.is_server_ready()
        finally:
            rpc.close()
    finally:
        stop_process(process, 15)
    assert process.returncode == 0, process.stdout.read().decode() if process.stdout else ""


@pytest.mark.slow
def test_the_gateway_never_imports_torch() -> None:
    """The gateway process starts in a second and holds no model: `packrat oip` and its modules are torch-free."""
    code = (
        "import sys\n"
        "from packrat_daemon.cli import build_parser\n"
        "build_parser()\n"
        "import packrat_daemon.commands.oip, packrat_daemon.protocol.gateway, packrat_daemon.protocol.rest\n"
        "import packrat_daemon.protocol.grpc.server, packrat_daemon.protocol.launch\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers')))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], env=daemon_env(), capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


@pytest.mark.slow
@pytest.mark.parametrize("grpc_server", ["threads", "aio"])
def test_a_daemon_that_dies_fails_the_requests_in_flight_at_once(tmp_path: Path, grpc_server: str) -> None:
    """`packrat oip` in front of a daemon that is killed mid-request, over REST and over gRPC (each gRPC server:
    a handler thread's own connection has its own watch): each request is answered 503 / UNAVAILABLE when the
    connection drops (not after its 60 s timeout), the gateway turns not ready and refuses at once after."""
    import threading

    import numpy as np
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException

    from tests.helpers.daemons import running_daemon
    from tests.packrat_daemon.protocol.oip_models import SLOW

    profile = tmp_path / "profile.csv"
    profile.write_text("threads,batch,latency_ms\n1,1,0.2\n1,4,0.4\n")
    args = ["--model", "tests.packrat_daemon.protocol.oip_models:sentinel_mlp", "--policy", "fixed"]
    args += ["--plan", "1*1x4", "--max-batch", "4", "--profile", str(profile)]
    with running_daemon(tmp_path, *args) as (endpoint, daemon):
        port, grpc_port = free_port(), free_port()
        command = [sys.executable, "-m", "packrat_daemon", "oip", "--connect", endpoint, "--http-port", str(port)]
        command += ["--grpc-port", str(grpc_port), "--grpc-server", grpc_server]
        gateway = subprocess.Popen(command, env=daemon_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        try:
            http = httpclient.InferenceServerClient(f"127.0.0.1:{port}")
            rpc = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}")
            deadline = time.monotonic() + 60
            while True:
                try:
                    if http.is_server_ready():
                        break
                except Exception:
                    pass  # not listening yet
                assert gateway.poll() is None and time.monotonic() < deadline
                time.sleep(0.2)
            ones = np.ones((1, 16), np.float32)
            grpc_tensor = grpcclient.InferInput("input", [1, 16], "FP32")
            grpc_tensor.set_data_from_numpy(ones)
            rpc.infer("sentinel_mlp", [grpc_tensor])  # a handler thread has its connection before the kill
            slow = np.full((1, 16), SLOW, np.float32)
            tensor = httpclient.InferInput("input", [1, 16], "FP32")
            tensor.set_data_from_numpy(slow, binary_data=True)
            slow_grpc = grpcclient.InferInput("input", [1, 16], "FP32")
            slow_grpc.set_data_from_numpy(slow)
            outcomes: dict[str, dict[str, object]] = {"http": {}, "grpc": {}}

            def call(path: str) -> None:
                started = time.monotonic()
                try:
                    if path == "http":
                        httpclient.InferenceServerClient(f"127.0.0.1:{port}").infer("sentinel_mlp", [tensor])
                    else:
                        rpc.infer("sentinel_mlp", [slow_grpc])
                except InferenceServerException as exc:
                    outcomes[path]["status"] = exc.status()
                outcomes[path]["seconds"] = time.monotonic() - started

            in_flight = [threading.Thread(target=call, args=(path,)) for path in outcomes]
            for thread in in_flight:
                thread.start()
            time.sleep(0.5)  # both requests are with the daemon, whose worker takes SLOW_S for each
            daemon.kill()
            for thread in in_flight:
                thread.join(30)
            for path, status in (("http", "503"), ("grpc", "StatusCode.UNAVAILABLE")):
                outcome = outcomes[path]
                assert outcome.get("status") == status and float(outcome["seconds"]) < 10, outcomes  # type: ignore[arg-type]
            assert not http.is_server_ready()
            with pytest.raises(InferenceServerException) as caught:
                http.infer("sentinel_mlp", [tensor])
            assert caught.value.status() == "503" and "no connection" in caught.value.message()
            with pytest.raises(InferenceServerException) as caught:
                rpc.infer("sentinel_mlp", [grpc_tensor])
            assert caught.value.status() == "StatusCode.UNAVAILABLE" and "no connection" in caught.value.message()
            rpc.close()
        finally:
            stop_process(gateway, 15)


@pytest.mark.slow
@pytest.mark.parametrize("flag", ["--http-port", "--grpc-port"])
def test_a_port_in_use_is_refused_with_a_message(tmp_path: Path, flag: str) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        command = [sys.executable, "-m", "packrat_daemon", "oip", "--connect", f"ipc://{tmp_path}/none.ipc"]
        done = subprocess.run([*command, flag, str(port)], env=daemon_env(), capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert f"127.0.0.1:{port}" in done.stderr and "is the port in use?" in done.stderr


def test_rest_connections_are_accepted_with_nagle_off() -> None:
    """The REST socket is bound by the gateway, not uvicorn; asyncio turns Nagle off on the connections it
    accepts only when the listening socket says TCP, else each reply waits for the client's delayed ACK."""
    import asyncio
    import socket

    from packrat_daemon.protocol.gateway import bound

    async def accept_one() -> int:
        seen: asyncio.Future[int] = asyncio.get_running_loop().create_future()

        async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            seen.set_result(writer.get_extra_info("socket").getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            writer.close()

        listening = bound("127.0.0.1", 0)
        server = await asyncio.start_server(handler, sock=listening)
        port = listening.getsockname()[1]
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        nodelay = await asyncio.wait_for(seen, 5)
        writer.close()
        server.close()
        await server.wait_closed()
        return nodelay

    assert asyncio.run(accept_one()) != 0
