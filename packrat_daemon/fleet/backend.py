"""The daemon's side of the internal channel: one ROUTER socket and the template process.

Workers and the template connect DEALER sockets to the ROUTER at ``ipc://RUN_DIR/backend.ipc`` and
name themselves (``template``, ``w1``, ``w2``...). The daemon's loop polls this socket beside the
frontend; the measuring bench (packrat_daemon.measure.bench) uses the same class synchronously.

The template is watched on its own, not only when a message comes: `template_fd` is a pidfd of it, which
a poll reports readable the moment it exits (a `kill -9` included), and `check_template` then raises
TemplateLost. Every worker dies with it (workers.pinning.die_with_parent: SIGKILL, even when stopped).
"""

from __future__ import annotations

import ctypes.util
import glob
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import zmq

from packrat_daemon.fleet.exits import exit_description
from packrat_daemon.ops.hardening import claim_ipc, private_dir
from packrat_daemon.wire.errors import ConfigError, PackratError
from packrat_daemon.wire.zmqio import NOBLOCK, ZERO_COPY_MIN_BYTES, readable, recv_frames, send_frames
from workers import messages
from workers.models.spec import InputSpec

# glibc hands big blocks out with mmap and returns freed heap memory to the OS, so every inference
# page-faults its activation buffers in again, a different number of pages in each process. Measured
# here with ResNet-50 at 2 threads (bench/malloc.py): B=4 ran 230-250 ms untuned and 197-210 ms with
# a 32 MiB mmap threshold; but B=16's 51 MB activations are over glibc's largest threshold, so they still
# faulted 25 000-150 000 pages per call, and identical processes ran 749-973 ms. With no mmap at all they
# fault none and run 730-741 ms. The cost is memory held between batches: at random batch sizes 1-16 a
# process plateaued at 1.6 GB resident against 1.1 GB with the threshold (bench/malloc.py --creep).
GLIBC_MALLOC_TUNING = {
    "MALLOC_MMAP_MAX_": "0",  # every block comes from the heap, whatever its size
    "MALLOC_TRIM_THRESHOLD_": str(16 << 30),  # and freed heap memory is kept for the next batch
}

ALLOCATORS = {
    "jemalloc": ("libjemalloc.so.2", "libjemalloc2"),
    "tcmalloc": ("libtcmalloc.so.4", "libgoogle-perftools4"),
}


class TemplateError(PackratError):
    """The template process could not load the model or died."""


class TemplateLost(TemplateError):
    """The template died while serving: no worker can be (re)started, and its workers died with it. The daemon
    stops with this error, exit status 1 like a crash, so that its supervisor (systemd's Restart=on-failure)
    starts it afresh: not 2, which says a start cannot succeed (RestartPreventExitStatus=2). Restarting the
    template in place would reload the model, which takes as long as a restart."""

    exit_status = 1


@dataclass(frozen=True)
class ModelInfo:
    model: str
    runtime: str
    dtype: str
    shape: tuple[int, ...]
    high: int | None
    template_pid: int
    precision: str = "fp32"
    guard: dict[str, Any] | None = None  # what the accuracy guard measured (None: fp32, which needs none)
    tensors: InputSpec | None = None  # the template's whole spec: named inputs and outputs (None: dtype, shape, high)

    @property
    def input(self) -> InputSpec:
        """The model's declared input, as the workers know it (for sample inputs)."""
        return self.tensors or InputSpec(self.dtype, self.shape, self.high)


def allocator_library(name: str) -> str | None:
    """Path of the malloc to preload into the template (and so every worker), like Intel's launcher."""
    if name == "system":
        return None
    if name not in ALLOCATORS:
        raise ConfigError(f"unknown allocator {name!r}; choose system, jemalloc or tcmalloc")
    library, package = ALLOCATORS[name]
    patterns = [f"/usr/lib/*/{library}", f"/usr/lib/{library}", f"/usr/local/lib/{library}"]
    for pattern in patterns:
        found = sorted(glob.glob(pattern))
        if found:
            return found[0]
    found_name = ctypes.util.find_library(name)
    if found_name and os.path.isabs(found_name):
        return found_name
    raise ConfigError(f"allocator {name} is not installed; install it with `apt-get install {package}`")


class Backend:
    def __init__(self, context: zmq.Context, run_dir: str | None = None) -> None:
        self.context = context
        self._own_dir = run_dir is None
        # The ipc socket accepts anyone who can reach the file: the run dir must be this user's alone.
        self.run_dir = private_dir(run_dir or tempfile.mkdtemp(prefix="packrat-"))
        claim_ipc(self.run_dir / "backend.ipc")
        self.endpoint = f"ipc://{self.run_dir / 'backend.ipc'}"
        self.socket = context.socket(zmq.ROUTER)
        # Sending to a worker that has gone must fail loudly, not drop the slice silently.
        self.socket.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.bind(self.endpoint)
        self.template: subprocess.Popen[bytes] | None = None
        self._template_fd: int | None = None

    # -- the template -------------------------------------------------------------------------
    def start_template(
        self,
        model: str,
        *,
        input_override: str | None = None,
        runtime: str = "torch",
        allocator: str = "system",
        precision: str = "fp32",
        nice: int = 0,
    ) -> None:
        """`nice`: a lower priority for the template and every worker it forks (they inherit it): a candidate
        measured in the background while another serves (startup.Measuring). A process cannot raise its priority
        again, so such a template never serves: the one chosen is started afresh at the daemon's own."""
        env = dict(os.environ)
        library = allocator_library(allocator)
        if library:
            env["LD_PRELOAD"] = ":".join(filter(None, [library, env.get("LD_PRELOAD", "")]))
        else:
            # See GLIBC_MALLOC_TUNING. The user's own settings win.
            for variable, value in GLIBC_MALLOC_TUNING.items():
                env.setdefault(variable, value)
        # The workers pin themselves; an inherited OMP binding would fight Packrat's pinning.
        for variable in ("OMP_PROC_BIND", "OMP_PLACES", "KMP_AFFINITY", "GOMP_CPU_AFFINITY"):
            env.pop(variable, None)
        env.setdefault("HF_HUB_OFFLINE", "1")
        env.setdefault("TRANSFORMERS_OFFLINE", "1")
        command = [
            sys.executable, "-m", "workers.template",
            "--model", model, "--runtime", runtime, "--precision", precision,
            "--backend", self.endpoint, "--daemon-pid", str(os.getpid()),
        ]  # fmt: skip
        if input_override:
            command += ["--input", input_override]
        niced = shutil.which("nice") if nice else None
        if niced is not None:  # exec'd in place: the pid (and the pidfd below) stays the template's
            command = [niced, "-n", str(nice), *command]
        self.template = subprocess.Popen(command, env=env)
        self._template_fd = _pidfd(self.template.pid)

    @property
    def template_fd(self) -> int | None:
        """A file descriptor a poll reports readable (POLLIN) once the template has exited: the daemon's loop
        polls it beside its sockets and then calls `check_template`. None before the template starts, or
        where the kernel has no pidfd (Linux < 5.3): `check_template` on every wake is then the watch."""
        return self._template_fd

    def check_template(self) -> None:
        """Raise TemplateLost, saying how it ended, when the template has exited; cheap (one waitpid)."""
        template = self.template
        if template is not None and template.poll() is not None:
            raise TemplateLost(
                f"the template process (pid {template.pid}) {exit_description(template.returncode)}; its workers "
                "died with it and no worker can be started without it, so the daemon stops (a supervisor such "
                "as systemd restarts it; see the log above for why the template ended)"
            )

    def wait_template(self, timeout: float = 300.0) -> ModelInfo:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.template is not None and self.template.poll() is not None:
                raise TemplateError(f"the template process {exit_description(self.template.returncode)}")
            received = self.recv(200)
            if received is None:
                continue
            identity, kind, header, _ = received
            if identity != messages.TEMPLATE_IDENTITY:
                continue
            if kind == messages.FAILED:
                raise TemplateError(f"the model could not be loaded: {header['message']}")
            if kind == messages.READY:
                spec = header["input"]
                return ModelInfo(
                    header["model"], header["runtime"], spec["dtype"], tuple(spec["shape"]), spec.get("high"),
                    header["pid"], header.get("precision", "fp32"), tensors=InputSpec.from_json(spec),
                )  # fmt: skip
        raise TemplateError(f"the template did not load the model within {timeout:.0f} s")

    # -- messages -----------------------------------------------------------------------------
    def send(
        self, identity: bytes, kind: bytes, header: dict[str, Any], payload: Sequence[Any] = (), nbytes: int = -1
    ) -> bool:
        """Send to a worker or the template; False when the peer is not connected (gone).

        `nbytes`: the payload's size when the caller knows it already."""
        try:
            frames = [identity, *messages.encode(kind, header, payload)]
            if nbytes < 0:
                nbytes = sum([memoryview(frame).nbytes for frame in payload])
            # Zero-copy only pays for big payloads: pyzmq builds a tracked Frame per part otherwise.
            send_frames(self.socket, frames, copy=nbytes < ZERO_COPY_MIN_BYTES)
        except zmq.ZMQError as exc:
            if exc.errno == zmq.EHOSTUNREACH:
                return False
            raise
        return True

    def recv(self, timeout_ms: int | None = 0) -> tuple[bytes, bytes, dict[str, Any], list[Any]] | None:
        """One message, waiting up to `timeout_ms` (0: only what is already queued; None: forever)."""
        if timeout_ms and not self.socket.poll(timeout_ms):
            return None
        # With no wait, checking EVENTS is much cheaper than letting recv raise zmq.Again.
        if timeout_ms == 0 and not readable(self.socket):
            return None
        return self._split(recv_frames(self.socket))

    def recv_waiting(self) -> tuple[bytes, bytes, dict[str, Any], list[Any]] | None:
        """The message a poll just reported waiting (None if it is gone after all), with no check first."""
        try:
            return self._split(recv_frames(self.socket, NOBLOCK))
        except zmq.Again:
            return None

    @staticmethod
    def _split(frames: list[zmq.Frame]) -> tuple[bytes, bytes, dict[str, Any], list[Any]]:
        kind, header, payload = messages.decode([frames[1].bytes, *frames[2:]])
        return frames[0].bytes, kind, header, payload

    def close(self, keep_dir: bool = False) -> None:
        """Stop the template (it stops its workers) and close the socket; `keep_dir`: leave a folder of our own in
        place (the daemon's control socket lives in its first template's folder). Closing again is harmless."""
        if self.template is not None and self.template.poll() is None:
            self.send(messages.TEMPLATE_IDENTITY, messages.STOP, {})
            try:
                self.template.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.template.kill()
                self.template.wait()
        if self._template_fd is not None:
            os.close(self._template_fd)
            self._template_fd = None
        self.socket.close(linger=0)
        if self._own_dir and not keep_dir and self.run_dir.exists():
            for leftover in self.run_dir.iterdir():
                leftover.unlink(missing_ok=True)
            self.run_dir.rmdir()


def _pidfd(pid: int) -> int | None:
    """A pidfd of our child `pid` (it stays ours, unreaped, until Popen.poll reaps it: no pid reuse race)."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):  # no pidfd here (old kernel, or a seccomp filter): polled instead
        return None
