"""One pinned instance: t intra-op threads on its own cores, serving batch slices from the daemon.

Shape after gunicorn's workers/base.py: init (pin, threads, warm up, say ready), then run (a loop
that answers jobs and sends heartbeats), and exit when the daemon or the template is gone.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import zmq

from packrat_daemon.wire.errors import WorkerBootError
from packrat_daemon.wire.zmqio import ZERO_COPY_MIN_BYTES, recv_frames, send_frames
from workers import messages
from workers.arena import SHARED_MIN_BYTES, Arena, Location, PeerArena, warn_no_shared_memory
from workers.models.spec import InputSpec, sample_input
from workers.pinning import die_with_parent, pin_process
from workers.runtimes.base import Runtime

HEARTBEAT_SECONDS = 1.0
PREPARE_POLL_MS = 20  # how often the main loop checks whether a background re-threading is ready
# How long a booted worker may take to reach the daemon's socket. Connecting to a local ipc socket is
# immediate; one that never answers (a run dir moved or deleted) must fail the boot, not hang unseen.
CONNECT_DEADLINE_S = 10.0
# The daemon's arenas a worker keeps mapped: its own input arena and the inbox's payload slabs, which the
# daemon reuses, so that each is mapped (and page-faulted in) once rather than per job.
INPUT_MAPPINGS = 16


@dataclass(frozen=True)
class WorkerConfig:
    worker_id: int
    threads: int
    cores: tuple[int, ...]
    backend: str
    template_pid: int
    warmup: tuple[int, ...] = (1,)


def run_worker(runtime: Runtime, input_spec: InputSpec, config: WorkerConfig) -> int:
    """Boot, then serve until told to stop; the exit status.

    Raises WorkerBootError for anything that fails before the worker said it was ready, so the
    template can exit it with messages.WORKER_BOOT_ERROR and report why (gunicorn's `booted` flag).
    """
    shared = SharedTensors(config.worker_id)
    try:
        context, socket = _boot(runtime, input_spec, config, shared)
    except Exception as exc:
        shared.close()
        raise WorkerBootError(f"{type(exc).__name__}: {exc}") from exc
    try:
        return _serve(runtime, socket, config, shared)
    finally:
        socket.close(linger=0)
        context.term()
        shared.close()


def _boot(
    runtime: Runtime, input_spec: InputSpec, config: WorkerConfig, shared: SharedTensors
) -> tuple[zmq.Context, zmq.Socket]:
    """Pin, set the threads, warm up, connect and say READY (with where the output arena is)."""
    die_with_parent(config.template_pid)  # SIGKILL when the template dies, even while stopped: no orphan
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C goes to the daemon, which stops us in order
    if runtime.pins:
        pin_process(config.cores)
    runtime.set_threads(config.threads)
    runtime.serve_only()
    warmed = []  # [batch, ms] each: the daemon's first prediction of a slice where the profile has none
    for batch in config.warmup:
        began = time.perf_counter()
        runtime.run(sample_input(input_spec, batch))
        warmed.append([batch, (time.perf_counter() - began) * 1000.0])

    context = zmq.Context()
    socket = context.socket(zmq.DEALER)
    socket.setsockopt(zmq.IDENTITY, messages.worker_identity(config.worker_id))
    socket.setsockopt(zmq.LINGER, 0)
    socket.setsockopt(zmq.IMMEDIATE, 1)  # queue nothing before the connection exists: READY then waits for it
    socket.setsockopt(zmq.SNDTIMEO, int(CONNECT_DEADLINE_S * 1000))
    socket.connect(config.backend)
    ready = _status(config.worker_id, config.threads, config.cores)
    ready["arena"] = list(shared.output.write((), 0))  # created now, so the daemon can check it maps it
    ready["warmup_ms"] = warmed
    try:
        socket.send_multipart(messages.encode(messages.READY, ready))
    except zmq.Again:
        raise TimeoutError(
            f"could not reach the daemon at {config.backend} within {CONNECT_DEADLINE_S:.0f} s; "
            "was its run dir moved or deleted?"
        ) from None
    socket.setsockopt(zmq.SNDTIMEO, -1)
    return context, socket


class SharedTensors:
    """This worker's shared memory: the daemon's input arena as mapped here, and its own output arena."""

    def __init__(self, worker_id: int) -> None:
        self.inputs = PeerArena(keep=INPUT_MAPPINGS)
        self.output = Arena(f"w{worker_id}-out")

    def close(self) -> None:
        self.inputs.close()
        self.output.close()


def _serve(runtime: Runtime, socket: zmq.Socket, config: WorkerConfig, shared: SharedTensors) -> int:
    """Answer jobs and re-threading requests, heartbeat when idle; return when stopped or orphaned."""
    threads, cores = config.threads, config.cores
    last_sent = time.monotonic()
    switch: Rethreading | None = None
    wait_ms = 0
    while True:
        # A blocking receive with a timeout, not poll-then-receive: one wake per job, not two.
        want_ms = PREPARE_POLL_MS if switch else int(HEARTBEAT_SECONDS * 1000)
        if want_ms != wait_ms:
            wait_ms = want_ms
            socket.setsockopt(zmq.RCVTIMEO, wait_ms)
        try:
            frames = recv_frames(socket)
        except zmq.Again:
            frames = None
        if frames is not None:
            kind, header, payload = messages.decode(frames)
            if kind == messages.RUN or kind == messages.RUN_SHARED:
                reply = _run_job(runtime, kind, header, payload, threads, shared)
                send_frames(socket, reply, copy=len(reply) == 1 or reply[1].nbytes < ZERO_COPY_MIN_BYTES)
                last_sent = time.monotonic()  # a reply is a sign of life too
            elif kind == messages.CONFIGURE:
                switch = Rethreading(runtime, int(header["threads"]), tuple(header["cores"]))
            elif kind == messages.STOP:
                return 0
        if switch is not None and switch.ready():
            # Between jobs: swap in what was prepared, then move every thread to the new cores.
            threads, cores = switch.commit()
            switch = None
            socket.send_multipart(messages.encode(messages.CONFIGURED, _status(config.worker_id, threads, cores)))
            last_sent = time.monotonic()
        if frames is not None:
            continue  # busy: the heartbeat and orphan checks wait for a quiet moment
        if time.monotonic() - last_sent >= HEARTBEAT_SECONDS:
            socket.send_multipart(messages.encode(messages.HEARTBEAT, {"worker": config.worker_id}))
            last_sent = time.monotonic()
        if os.getppid() != config.template_pid:
            return 0  # orphaned: the template (and so the daemon) is gone


class Rethreading:
    """A switch to new threads and cores, prepared without stopping service.

    Runtimes that re-thread in place (torch) switch at once. Others (ONNX Runtime, OpenVINO) build a
    new session in a background thread pinned to the new cores (so its pool threads inherit them)
    while the old session keeps answering; the main thread commits the swap between jobs.
    """

    def __init__(self, runtime: Runtime, threads: int, cores: tuple[int, ...]) -> None:
        self.threads, self.cores = threads, cores
        self._pins = runtime.pins
        self._commit: Callable[[], None] | None = None
        self._error: BaseException | None = None
        if getattr(runtime, "rethreads_in_place", True):
            self._commit = lambda: runtime.set_threads(threads)
            self._thread = None
        else:
            self._thread = threading.Thread(target=self._prepare, args=(runtime,), daemon=True)
            self._thread.start()

    def _prepare(self, runtime: Runtime) -> None:
        try:
            os.sched_setaffinity(0, self.cores)  # this thread only: the session's threads inherit it
            self._commit = runtime.prepare_threads(self.threads)
        except BaseException as exc:  # reported by commit() in the main thread
            self._error = exc

    def ready(self) -> bool:
        return self._thread is None or not self._thread.is_alive()

    def commit(self) -> tuple[int, tuple[int, ...]]:
        if self._error is not None:
            raise RuntimeError(f"could not prepare {self.threads} thread(s): {self._error}") from self._error
        assert self._commit is not None
        self._commit()
        if self._pins:
            pin_process(self.cores)
        return self.threads, self.cores


def _run_job(runtime: Runtime, kind: bytes, header: dict, payload: list, threads: int, shared: SharedTensors) -> list:
    job = header["job"]
    try:
        dtype = messages.numpy_dtype(header["dtype"])
        if kind == messages.RUN_SHARED:
            location = Location(*[header[name] for name in messages.ARENA_FIELDS])
            batch = shared.inputs.array(location, dtype, header["shape"], header["offset"])
        else:
            data = payload[0].buffer if len(payload) == 1 else b"".join(bytes(frame.buffer) for frame in payload)
            batch = np.frombuffer(data, dtype=dtype).reshape(header["shape"])
        output, compute_ms = runtime.timed_run(batch)
        del batch  # the input's view of the daemon's arena, which the daemon may replace once we answer
        output = np.ascontiguousarray(output)
    except Exception as exc:  # the daemon re-routes or answers INTERNAL; the worker stays up
        return messages.encode(messages.FAILED, {"job": job, "message": f"{type(exc).__name__}: {exc}"})
    reply = {
        "job": job,
        "dtype": messages.numpy_name(output.dtype),
        "shape": list(output.shape),
        "compute_ms": compute_ms,
        "threads": threads,
        "batch": int(header["shape"][0]),
    }
    data = output.data.cast("B")
    # The daemon copies a shared output out before it sends this worker another shared job, and it
    # sends one only when this worker has nothing outstanding: so only a shared job's output may go there.
    if kind == messages.RUN_SHARED and data.nbytes >= SHARED_MIN_BYTES:
        try:
            location = shared.output.write((data,), data.nbytes)
        except OSError as exc:  # no descriptor or memory for a bigger arena: this result goes as a frame
            warn_no_shared_memory(f"worker {os.getpid()}'s output", exc)
        else:
            reply.update(zip(messages.ARENA_FIELDS, location, strict=True))
            return messages.encode(messages.RESULT_SHARED, reply)
    return messages.encode(messages.RESULT, reply, [data])


def _status(worker_id: int, threads: int, cores: tuple[int, ...]) -> dict:
    return {"worker": worker_id, "pid": os.getpid(), "threads": threads, "cores": list(cores)}
