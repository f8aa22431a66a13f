"""`packrat serve --http-port P --grpc-port Q`: the gateway (`packrat oip`) as a child process that lives and dies
with the daemon, one service (docs/oip.md, "One service"):

- started first, before minutes of profiling, and waited for until it has bound every port: a port it cannot
  bind stops the daemon's start with its message and exit 2;
- watched: it says "serving" on a status pipe once bound, and its end is the pipe's end. A gateway that dies
  while the daemon serves is started again with back-off, and the daemon is not ready meanwhile (`serving`);
- stopped first: on SIGTERM the daemon asks the gateway to drain and serves on until it has gone, so every
  request the gateway accepted is answered before the daemon stops accepting.

A process of its own keeps HTTP parsing and its GIL off the serving loop (docs/oip.md, "Process or thread").
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import logging
import os
import select
import signal
import subprocess
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

from packrat_daemon.wire.errors import ConfigError

if TYPE_CHECKING:  # the gateway's module loads uvicorn and grpc: only a daemon that starts one pays for them
    from packrat_daemon.protocol.gateway import GatewayOptions

log = logging.getLogger("packrat.oip")

STOP_GRACE_S = 15.0  # the gateway's own drain is at most DRAIN_GRACE_S (10 s) and a linger: room for both
GATEWAY_MMAP_THRESHOLD = 1 << 20
START_TIMEOUT_S = 60.0  # importing grpc and uvicorn and binding: seconds on a loaded machine, never a minute
RESTART_FIRST_S = 0.2  # a gateway that died starts again this soon the first time (RestartBackoff)
# Lines the gateway writes on its status pipe (`packrat oip --status-fd`).
SERVING, DRAINING, FAILED = "serving", "draining", "failed"
_PR_SET_PDEATHSIG = 1
# A bind address that means every interface, and the loopback address that reaches it from this machine.
_ANY_TO_LOOPBACK = {"*": "127.0.0.1", "0.0.0.0": "127.0.0.1", "[::]": "[::1]", "[*]": "[::1]"}


class RestartBackoff:
    """The pause before starting a process that died again (after circus's watcher): `first_s` the first time,
    since a crash is usually a one-off, then doubling up to `most_s`, and back to `first_s` once a run lasted
    `reset_after_s`. The gateway's supervisor here and the repository's per model (repository.daemons) use it."""

    def __init__(self, first_s: float, most_s: float = 30.0, reset_after_s: float = 60.0) -> None:
        self.first_s, self.most_s, self.reset_after_s = first_s, most_s, reset_after_s
        self._next_s = first_s

    def after_exit(self, ran_s: float) -> float:
        """The pause before the next start, after a run of `ran_s` seconds ended."""
        if ran_s > self.reset_after_s:
            self._next_s = self.first_s
        delay, self._next_s = self._next_s, min(2 * self._next_s, self.most_s)
        return delay


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
    from packrat_daemon.protocol.limits import GatewayLimits

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
        limits=GatewayLimits().with_settings([p for p in (config.oip_limits or "").split(",") if p.strip()]),
        metrics_port=config.oip_metrics_port,
    )
    options.check()
    return options


def command(options: GatewayOptions, log_level: str, log_format: str, status_fd: int | None = None) -> list[str]:
    argv = [sys.executable, "-m", "packrat_daemon", "oip", "--connect", options.connect]
    argv += ["--http-port", str(options.http_port), "--grpc-port", str(options.grpc_port)]
    argv += ["--address", options.address, "--log-level", log_level, "--log-format", log_format]
    for flag, value in (("--model-name", options.model_name), ("--tls-cert", options.tls_cert)):
        if value is not None:
            argv += [flag, value]
    if options.tls_key is not None:
        argv += ["--tls-key", options.tls_key]
    if options.insecure_public:
        argv.append("--insecure-public")
    defaults = type(options.limits)()
    for field in dataclasses.fields(options.limits):
        if getattr(options.limits, field.name) != getattr(defaults, field.name):
            argv += ["--limit", f"{field.name}={getattr(options.limits, field.name)}"]
    if options.metrics_port:
        argv += ["--metrics-port", str(options.metrics_port)]
    if status_fd is not None:
        argv += ["--status-fd", str(status_fd)]
    return argv


def _die_with_parent() -> None:
    # The gateway must not outlive a daemon that is killed (SIGKILL gives the daemon no chance to stop it).
    arguments = (ctypes.c_ulong(int(signal.SIGTERM)), ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0))
    if ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, *arguments):
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed: the gateway could outlive the daemon")


class GatewayProcess:
    """The gateway child of one daemon: its one owner is the thread that watches it (started, restarted, reaped
    there); the daemon's loop only reads `serving` and `gone` and calls `start`, `begin_stop` and `close`."""

    def __init__(self, options: GatewayOptions, log_level: str, log_format: str) -> None:
        self.options, self.log_level, self.log_format = options, log_level, log_format
        self.serving = False  # bound and serving: the daemon's readiness needs it
        self.restarts = 0
        self.last_exit: int | None = None  # how the last gateway ended (a negative number: killed by that signal)
        self.next_start: float | None = None  # monotonic time of the next restart while one is pending
        self._stopping = threading.Event()
        self._gone = threading.Event()  # set once the child has ended after `begin_stop`, or was never running
        self._child: subprocess.Popen[bytes] | None = None
        self._status: int | None = None  # the read end of the child's status pipe
        self._watcher: threading.Thread | None = None
        self._lock = threading.Lock()  # a restart's spawn and `begin_stop`'s SIGTERM never miss each other

    @classmethod
    def from_config(cls, config: Any) -> GatewayProcess | None:
        options = gateway_options(config)
        return None if options is None else cls(options, config.log_level, config.log_format)

    def describe(self) -> str:
        ports = [f"REST :{self.options.http_port}"] if self.options.http_port else []
        ports += [f"gRPC :{self.options.grpc_port}"] if self.options.grpc_port else []
        if self.serving:
            state = "serving"
        elif self._stopping.is_set():
            state = "stopping"
        elif self.next_start is not None:
            state = (
                f"down (exit {self.last_exit}), restart {self.restarts} in "
                f"{max(0.0, self.next_start - time.monotonic()):.1f} s"
            )
        else:
            state = "starting"
        return f"{' and '.join(ports)}: {state}"

    def status(self) -> dict[str, Any]:
        return {"serving": self.serving, "restarts": self.restarts, "last_exit": self.last_exit,
                "describe": self.describe()}  # fmt: skip

    # -- start ------------------------------------------------------------------------------------
    def start(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Start the gateway and wait until it serves; ConfigError (exit 2) with its reason when it cannot."""
        self._spawn()
        deadline = time.monotonic() + timeout_s
        while (line := self._read_status(max(0.0, deadline - time.monotonic()))) not in ("", SERVING):
            if line.startswith(FAILED):
                break
        if line != SERVING:
            self._reap()
            reason = line.partition(" ")[2] if line.startswith(FAILED) else f"it exited with code {self.last_exit}"
            raise ConfigError(f"the Open Inference Protocol gateway could not start: {reason}")
        self.serving = True
        self._watcher = threading.Thread(target=self._watch, name="oip-gateway-watch", daemon=True)
        self._watcher.start()

    def _spawn(self) -> None:
        with self._lock:
            if self._stopping.is_set():
                return  # stopping: no new gateway
            self._spawn_locked()

    def _spawn_locked(self) -> None:
        read, write = os.pipe()
        env = {key: value for key, value in os.environ.items() if key != "NOTIFY_SOCKET"}  # systemd hears the daemon
        # Blocks of 1 MiB and more mmapped and given back when freed: glibc's sliding threshold otherwise rises after
        # the first large message, and the heap kept what a field bomb had grown (bench/README.md). The user's wins.
        env.setdefault("MALLOC_MMAP_THRESHOLD_", str(GATEWAY_MMAP_THRESHOLD))
        argv = command(self.options, self.log_level, self.log_format, status_fd=write)
        try:
            self._child = subprocess.Popen(argv, pass_fds=(write,), env=env, preexec_fn=_die_with_parent)
        finally:
            os.close(write)
        self._status = read

    def _read_status(self, timeout_s: float | None) -> str:
        """The next line the child writes ("" once it has ended, or none came within `timeout_s`)."""
        assert self._status is not None
        line = b""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while not line.endswith(b"\n"):
            wait = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not select.select([self._status], [], [], wait)[0]:
                return ""
            chunk = os.read(self._status, 1)
            if not chunk:
                return ""
            line += chunk
        return line.decode(errors="replace").strip()

    def _reap(self) -> None:
        assert self._child is not None and self._status is not None
        if self._child.poll() is None:
            self._child.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._child.wait(STOP_GRACE_S)
        if self._child.poll() is None:
            self._child.kill()
        self.last_exit = self._child.wait()
        os.close(self._status)
        self._status = None

    # -- watch ------------------------------------------------------------------------------------
    def _watch(self) -> None:
        """Until the daemon stops it: follow the child's status; when it ends, unready, back off, start it again."""
        backoff = RestartBackoff(RESTART_FIRST_S)
        while self._status is not None:  # None: stopping came before a restart's spawn, so none was started
            began = time.monotonic()
            while line := self._read_status(None):  # "" once the child has ended (its end of the pipe closed)
                self.serving = line == SERVING
            self.serving = False
            self._reap()
            if self._stopping.is_set():
                break
            delay = backoff.after_exit(time.monotonic() - began)
            self.restarts += 1
            self.next_start = time.monotonic() + delay
            log.error(
                "the Open Inference Protocol gateway exited (code %s): REST and gRPC are down and the daemon is "
                "not ready; starting it again in %.1f s (restart %d)", self.last_exit, delay, self.restarts,
            )  # fmt: skip
            if self._stopping.wait(delay):
                break
            self.next_start = None
            self._spawn()
            if self._status is None or self._stopping.is_set():
                continue  # begin_stop came during the spawn: that child has its SIGTERM, or none was started
            line = self._read_status(START_TIMEOUT_S)
            if line == SERVING:
                self.serving = True
                log.info("the Open Inference Protocol gateway serves again (%s)", self.describe())
            elif line.startswith(FAILED):
                log.error("the Open Inference Protocol gateway could not start again: %s", line.partition(" ")[2])
        self.next_start = None
        self._gone.set()

    # -- stop -------------------------------------------------------------------------------------
    def begin_stop(self) -> None:
        """Ask the gateway to drain (it refuses new requests, answers those it took, then exits); no restarts."""
        with self._lock:
            self._stopping.set()
            self.serving = False
            child = self._child
            if child is not None and child.poll() is None:
                child.terminate()
        if self._watcher is None:
            self._gone.set()

    def gone(self) -> bool:
        """True once the gateway has ended after `begin_stop`: nothing more can come from it."""
        return self._gone.is_set()

    def close(self) -> None:
        """Stop the gateway if `begin_stop` was not called, and wait for it (killed after STOP_GRACE_S)."""
        self.begin_stop()
        if self._watcher is not None:
            self._watcher.join(STOP_GRACE_S + 5.0)
        elif self._child is not None and self._status is not None:
            self._reap()
