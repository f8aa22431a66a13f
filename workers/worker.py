"""One pinned instance: t intra-op threads on its own cores, serving batch slices from the daemon.

Shape after gunicorn's workers/base.py: init (pin, threads, warm up, say ready), then run (a loop
that answers jobs and sends heartbeats), and exit when the daemon or the template is gone.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass

import numpy as np
import zmq

from workers import messages
from workers.models import InputSpec
from workers.pinning import die_with_parent, pin_process
from workers.runtime import Runtime, sample_input

HEARTBEAT_SECONDS = 1.0
# Zero-copy sends cost more than a memcpy for small messages (pyzmq builds a tracked Frame per part).
ZERO_COPY_MIN_BYTES = 64 * 1024


@dataclass(frozen=True)
class WorkerConfig:
    worker_id: int
    threads: int
    cores: tuple[int, ...]
    backend: str
    template_pid: int
    warmup: tuple[int, ...] = (1,)


def run_worker(runtime: Runtime, input_spec: InputSpec, config: WorkerConfig) -> int:
    die_with_parent()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C goes to the daemon, which stops us in order
    pin_process(config.cores)
    runtime.set_threads(config.threads)
    for batch in config.warmup:
        runtime.run(sample_input(input_spec, batch))

    context = zmq.Context()
    socket = context.socket(zmq.DEALER)
    socket.setsockopt(zmq.IDENTITY, messages.worker_identity(config.worker_id))
    socket.setsockopt(zmq.LINGER, 0)
    socket.connect(config.backend)
    threads, cores = config.threads, config.cores
    socket.send_multipart(messages.encode(messages.READY, _status(config.worker_id, threads, cores)))
    last_sent = time.monotonic()
    try:
        while True:
            if socket.poll(int(HEARTBEAT_SECONDS * 1000)):
                kind, header, payload = messages.decode(socket.recv_multipart(copy=False))
                if kind == messages.RUN:
                    reply = _run_job(runtime, header, payload, threads)
                    socket.send_multipart(reply, copy=_nbytes(reply) < ZERO_COPY_MIN_BYTES)
                elif kind == messages.CONFIGURE:
                    threads, cores = int(header["threads"]), tuple(header["cores"])
                    pin_process(cores)
                    runtime.set_threads(threads)
                    reply = messages.encode(messages.CONFIGURED, _status(config.worker_id, threads, cores))
                    socket.send_multipart(reply)
                elif kind == messages.STOP:
                    return 0
                last_sent = time.monotonic()
            elif time.monotonic() - last_sent >= HEARTBEAT_SECONDS:
                socket.send_multipart(messages.encode(messages.HEARTBEAT, {"worker": config.worker_id}))
                last_sent = time.monotonic()
            if os.getppid() != config.template_pid:
                return 0  # orphaned: the template (and so the daemon) is gone
    finally:
        socket.close(linger=0)
        context.term()


def _run_job(runtime: Runtime, header: dict, payload: list, threads: int) -> list:
    job = header["job"]
    try:
        data = payload[0].buffer if len(payload) == 1 else b"".join(bytes(frame.buffer) for frame in payload)
        batch = np.frombuffer(data, dtype=np.dtype(header["dtype"])).reshape(header["shape"])
        output, compute_ms = runtime.timed_run(batch)
        output = np.ascontiguousarray(output)
    except Exception as exc:  # the daemon re-routes or answers INTERNAL; the worker stays up
        return messages.encode(messages.FAILED, {"job": job, "message": f"{type(exc).__name__}: {exc}"})
    reply = {
        "job": job,
        "dtype": output.dtype.name,
        "shape": list(output.shape),
        "compute_ms": compute_ms,
        "threads": threads,
        "batch": int(batch.shape[0]),
    }
    return messages.encode(messages.RESULT, reply, [memoryview(output).cast("B")])


def _nbytes(frames: list) -> int:
    return sum(memoryview(frame).nbytes for frame in frames)


def _status(worker_id: int, threads: int, cores: tuple[int, ...]) -> dict:
    return {"worker": worker_id, "pid": os.getpid(), "threads": threads, "cores": list(cores)}
