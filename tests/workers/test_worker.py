"""A real worker loop in a forked process, driven over a real socket by a stand-in for the daemon: READY,
jobs answered row for row, a bad job answered FAILED with the worker still up, re-threading in place,
STOP; a boot that fails; re-threading prepared in the background; and, in this process, what a job
answers when the worker's own shared memory cannot be had.

The runtime is a few lines that double their input: the loop is what is tested, not a model."""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zmq

from packrat_daemon.wire.errors import WorkerBootError
from workers import messages
from workers.arena import SHARED_MIN_BYTES, Arena, Location
from workers.models.spec import InputSpec
from workers.runtimes.base import Runtime
from workers.worker import Rethreading, SharedTensors, WorkerConfig, _run_job, run_worker

SPEC = InputSpec("float32", (3,))
WORKER_ID = 7


class Doubler(Runtime):
    """Doubles its input; remembers the thread counts it was given."""

    name = "doubler"
    pins = False  # these tests leave the CPUs they may run on alone

    def __init__(self, fail_threads: bool = False) -> None:
        self.threads: list[int] = []
        self.fail_threads = fail_threads

    def load(self, spec: str, input_override: str | None = None) -> InputSpec:
        return SPEC

    def set_threads(self, threads: int) -> None:
        if self.fail_threads:
            raise ValueError(f"{threads} threads are not possible here")
        self.threads.append(threads)

    def run(self, batch: np.ndarray) -> np.ndarray:
        if batch.shape[1:] != SPEC.shape:
            raise ValueError(f"the model takes {SPEC.shape}, got {batch.shape[1:]}")
        return batch * 2


class WorkerProcess:
    """A forked child running the worker loop; a boot failure's message comes back through a pipe."""

    def __init__(self, runtime: Runtime, backend: str) -> None:
        parent = os.getpid()
        read_end, write_end = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:  # the child: never returns into pytest
            code = 1
            try:
                os.close(read_end)
                config = WorkerConfig(WORKER_ID, 2, (0,), backend, template_pid=parent, warmup=(1, 2))
                code = run_worker(runtime, SPEC, config)
            except WorkerBootError as exc:
                os.write(write_end, str(exc).encode())
                code = messages.WORKER_BOOT_ERROR
            finally:
                os._exit(code)
        os.close(write_end)
        self.boot_error = os.fdopen(read_end, "rb")
        self.status: int | None = None

    def exit_code(self, timeout_s: float = 10.0) -> int:
        """The child's exit status, once it has exited (AssertionError if it does not in time)."""
        deadline = time.monotonic() + timeout_s
        while self.status is None and time.monotonic() < deadline:
            done, status = os.waitpid(self.pid, os.WNOHANG)
            if done:
                self.status = os.waitstatus_to_exitcode(status)
            else:
                time.sleep(0.005)
        assert self.status is not None, "the worker did not exit"
        return self.status

    def close(self) -> None:
        self.boot_error.close()
        if self.status is None:
            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)


@contextlib.contextmanager
def worker(runtime: Runtime, backend: str) -> Iterator[WorkerProcess]:
    process = WorkerProcess(runtime, backend)
    try:
        yield process
    finally:
        process.close()


class Daemon:
    """The daemon's side of a worker's socket."""

    def __init__(self, socket: zmq.Socket) -> None:
        self.socket = socket
        self.identity = messages.worker_identity(WORKER_ID)

    def receive(self) -> tuple[bytes, dict[str, Any], list[Any]]:
        assert self.socket.poll(10_000), "the worker said nothing"
        identity, *frames = self.socket.recv_multipart()
        assert identity == self.identity
        return messages.decode(frames)

    def send(self, kind: bytes, header: dict[str, Any], payload: list[bytes] | None = None) -> None:
        self.socket.send_multipart([self.identity, *messages.encode(kind, header, payload or [])])


@pytest.fixture
def daemon_socket(tmp_path: Path) -> Iterator[tuple[str, zmq.Socket]]:
    context = zmq.Context()
    socket = context.socket(zmq.ROUTER)
    socket.setsockopt(zmq.LINGER, 0)
    endpoint = f"ipc://{tmp_path / 'backend.ipc'}"
    socket.bind(endpoint)
    yield endpoint, socket
    socket.close()
    context.term()


def test_a_worker_says_ready_answers_each_job_rethreads_and_stops(daemon_socket: tuple[str, zmq.Socket]) -> None:
    endpoint, socket = daemon_socket
    daemon = Daemon(socket)
    with worker(Doubler(), endpoint) as process:
        kind, ready, _ = daemon.receive()
        assert kind == messages.READY
        assert (ready["worker"], ready["pid"], ready["threads"], ready["cores"]) == (WORKER_ID, process.pid, 2, [0])
        assert len(ready["arena"]) == len(messages.ARENA_FIELDS)  # where its output arena is

        x = np.arange(6, dtype=np.float32).reshape(2, 3)
        daemon.send(messages.RUN, {"job": 1, "dtype": "float32", "shape": [2, 3]}, [x.tobytes()])
        kind, result, payload = daemon.receive()
        assert kind == messages.RESULT
        assert {k: result[k] for k in ("job", "dtype", "shape", "threads", "batch")} == {
            "job": 1, "dtype": "float32", "shape": [2, 3], "threads": 2, "batch": 2
        }  # fmt: skip
        assert result["compute_ms"] >= 0
        np.testing.assert_array_equal(np.frombuffer(payload[0], np.float32).reshape(2, 3), x * 2)

        # Rows split over several frames are joined in order.
        y = np.arange(9, dtype=np.float32).reshape(3, 3)
        parts = [y[:1].tobytes(), y[1:].tobytes()]
        daemon.send(messages.RUN, {"job": 2, "dtype": "float32", "shape": [3, 3]}, parts)
        kind, result, payload = daemon.receive()
        assert kind == messages.RESULT and result["job"] == 2
        np.testing.assert_array_equal(np.frombuffer(payload[0], np.float32).reshape(3, 3), y * 2)

        # A job the model cannot take is answered FAILED with why; the worker serves on.
        daemon.send(messages.RUN, {"job": 3, "dtype": "float32", "shape": [1, 4]}, [np.zeros(4, np.float32).tobytes()])
        assert daemon.receive()[:2] == (
            messages.FAILED, {"job": 3, "message": "ValueError: the model takes (3,), got (4,)"}
        )  # fmt: skip

        daemon.send(messages.CONFIGURE, {"threads": 1, "cores": [0]})
        kind, configured, _ = daemon.receive()
        assert kind == messages.CONFIGURED and (configured["threads"], configured["cores"]) == (1, [0])
        daemon.send(messages.RUN, {"job": 4, "dtype": "float32", "shape": [2, 3]}, [x.tobytes()])
        kind, result, _ = daemon.receive()
        assert kind == messages.RESULT and result["threads"] == 1  # the new count is what it reports

        daemon.send(messages.STOP, {})
        assert process.exit_code() == 0


def test_a_boot_that_fails_is_reported_before_ready(daemon_socket: tuple[str, zmq.Socket]) -> None:
    endpoint, socket = daemon_socket
    with worker(Doubler(fail_threads=True), endpoint) as process:
        assert process.exit_code() == messages.WORKER_BOOT_ERROR
        assert process.boot_error.read().decode() == "ValueError: 2 threads are not possible here"
    assert not socket.poll(0), "a worker that failed to boot never says READY"


# -- re-threading -----------------------------------------------------------------------------------
class Rebuilder(Doubler):
    """Builds a new session per thread count, off the serving thread, as ONNX Runtime and OpenVINO do."""

    rethreads_in_place = False

    def __init__(self, build: Callable[[int], None]) -> None:
        super().__init__()
        self.build = build
        self.built_on: list[int] = []

    def prepare_threads(self, threads: int) -> Callable[[], None]:
        self.built_on.append(threading.get_ident())
        self.build(threads)
        return lambda: self.set_threads(threads)


def test_a_runtime_that_rethreads_in_place_switches_at_commit() -> None:
    runtime = Doubler()
    switch = Rethreading(runtime, 3, (0,))
    assert switch.ready() and runtime.threads == []
    assert switch.commit() == (3, (0,)) and runtime.threads == [3]


def test_a_new_session_is_prepared_in_the_background_and_swapped_in_at_commit() -> None:
    release = threading.Event()
    runtime = Rebuilder(lambda threads: release.wait(10))
    cores = tuple(sorted(os.sched_getaffinity(0)))
    switch = Rethreading(runtime, 2, cores)
    assert not switch.ready()  # still building: the old session serves meanwhile
    release.set()
    deadline = time.monotonic() + 10
    while not switch.ready() and time.monotonic() < deadline:
        time.sleep(0.001)
    assert runtime.built_on != [threading.get_ident()] and runtime.threads == []
    assert switch.commit() == (2, cores) and runtime.threads == [2]


def test_a_session_that_cannot_be_built_is_reported_at_commit() -> None:
    def fail(threads: int) -> None:
        raise MemoryError(f"no room for {threads} threads")

    switch = Rethreading(Rebuilder(fail), 4, tuple(sorted(os.sched_getaffinity(0))))
    while not switch.ready():
        time.sleep(0.001)
    with pytest.raises(RuntimeError, match=r"could not prepare 4 thread\(s\): no room for 4 threads"):
        switch.commit()


# -- shared memory --------------------------------------------------------------------------------
class WideDoubler(Doubler):
    """Doubles rows of any width (a shared job's rows are large)."""

    def run(self, batch: np.ndarray) -> np.ndarray:
        return batch * 2


def test_a_shared_job_whose_output_arena_cannot_grow_answers_with_a_frame(monkeypatch: pytest.MonkeyPatch) -> None:
    # Before: the OSError of a full descriptor table killed the worker, and the slice was re-sent.
    daemon_inputs, shared = Arena("test-daemon-in"), SharedTensors(99)
    try:
        x = np.ones((2, SHARED_MIN_BYTES // 4), dtype=np.float32)
        location = daemon_inputs.write([memoryview(x).cast("B")], x.nbytes)
        header: dict[str, Any] = {"job": 5, "dtype": "float32", "shape": list(x.shape), "offset": 0}
        header.update(zip(messages.ARENA_FIELDS, location, strict=True))

        def no_descriptors(frames: Any, nbytes: int) -> Location:
            raise OSError(errno.EMFILE, "Too many open files")

        monkeypatch.setattr(shared.output, "write", no_descriptors)
        reply = _run_job(WideDoubler(), messages.RUN_SHARED, header, [], 1, shared)
        kind, answer, payload = messages.decode(reply)
        assert kind == messages.RESULT and answer["job"] == 5
        assert bytes(payload[0]) == (x * 2).tobytes()
    finally:
        shared.close()
        daemon_inputs.close()
