"""`packrat serve --http-port P --grpc-port Q`: the gateway (`packrat oip`) started beside the daemon as a child
process, and stopped after it: a process of its own keeps HTTP parsing and its GIL off the serving loop
(docs/oip.md, "Process or thread", for the measurement).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from packrat_daemon.wire.errors import ConfigError

if TYPE_CHECKING:  # the gateway's module loads uvicorn and grpc: only a daemon that starts one pays for them
    from packrat_daemon.protocol.gateway import GatewayOptions

log = logging.getLogger("packrat.oip")

STOP_GRACE_S = 15.0
_PR_SET_PDEATHSIG = 1
# A bind address that means every interface, and the loopback address that reaches it from this machine.
_ANY_TO_LOOPBACK = {"*": "127.0.0.1", "0.0.0.0": "127.0.0.1", "[::]": "[::1]", "[*]": "[::1]"}


def connect_endpoint(bind: str) -> str:
    """Where a gateway on this machine connects to reach the daemon bound at `bind`."""
    transport, _, address = bind.partition("://")
    if transport != "tcp":
        return bind
    host, _, port = address.rpartition(":")
    return f"tcp://{_ANY_TO_LOOPBACK.get(host, host)}:{port}"


def gateway_options(config: Any) -> GatewayOptions | None:
    """The gateway `config` asks for (None: neither port set), checked: ConfigError before anything starts."""
    if not config.http_port and not config.grpc_port:
        return None
    from packrat_daemon.protocol.gateway import GatewayOptions

    if config.server_key is not None:
        raise ConfigError(
            "with server_key (CURVE) the daemon lets in only listed clients, and the gateway beside it holds no key: "
            "run the gateway as a client of its own (`packrat oip --connect ENDPOINT --key GATEWAY.key_secret "
            "--server-key SERVER.key`, its public key in allowed_clients; docs/oip.md)"
        )
    options = GatewayOptions(
        connect=connect_endpoint(config.endpoint),
        http_port=config.http_port,
        grpc_port=config.grpc_port,
        address=config.oip_address,
        model_name=config.oip_model_name,
        tls_cert=config.oip_tls_cert,
        tls_key=config.oip_tls_key,
        insecure_public=config.insecure_public,
        max_delay_ms=config.max_delay_ms,
    )
    options.check()
    return options


def command(options: GatewayOptions, log_level: str, log_format: str) -> list[str]:
    argv = [sys.executable, "-m", "packrat_daemon", "oip", "--connect", options.connect]
    argv += ["--http-port", str(options.http_port), "--grpc-port", str(options.grpc_port)]
    argv += ["--address", options.address, "--log-level", log_level, "--log-format", log_format]
    for flag, value in (("--model-name", options.model_name), ("--tls-cert", options.tls_cert)):
        if value is not None:
            argv += [flag, value]
    if options.tls_key is not None:
        argv += ["--tls-key", options.tls_key]
    if options.max_delay_ms is not None:
        argv += ["--max-delay-ms", repr(options.max_delay_ms)]
    if options.insecure_public:
        argv.append("--insecure-public")
    return argv


def _die_with_parent() -> None:
    # The gateway must not outlive a daemon that is killed (SIGKILL gives the daemon no chance to stop it).
    arguments = (ctypes.c_ulong(int(signal.SIGTERM)), ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0))
    if ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, *arguments):
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed: the gateway could outlive the daemon")


def _watch(child: subprocess.Popen[bytes], stopping: threading.Event) -> None:
    """Say so when the gateway ends before the daemon (it could not bind, or it failed): REST and gRPC are then
    down while ZeroMQ still serves, and the readiness probes on /v2/health/ready fail."""
    code = child.wait()
    if not stopping.is_set():
        log.error("the Open Inference Protocol gateway exited (code %d): REST and gRPC are down; see its log", code)


@contextlib.contextmanager
def gateway_beside(config: Any) -> Iterator[subprocess.Popen[bytes] | None]:
    """Run the block with the gateway `config` asks for running as a child; SIGTERM it (and wait) after."""
    options = gateway_options(config)
    if options is None:
        yield None
        return
    child = subprocess.Popen(command(options, config.log_level, config.log_format), preexec_fn=_die_with_parent)
    stopping = threading.Event()
    threading.Thread(target=_watch, args=(child, stopping), name="oip-gateway-watch", daemon=True).start()
    try:
        yield child
    finally:
        stopping.set()
        if child.poll() is None:
            child.terminate()
            try:
                child.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                log.warning("the Open Inference Protocol gateway did not stop in %.0f s; killing it", STOP_GRACE_S)
                child.kill()
                child.wait()
