"""The daemon's view of its worker processes (circus's "watcher"/"process" nouns).

The pool only records state and sends the verbs; deciding *what* the pool should be is the
reconciler's job, and only the reconciler calls `spawn` and `retire`. It tells a worker that failed
before it was ready (a boot failure, counted until a worker is ready again) from one lost after.

Each worker carries the backend (template and socket) it was forked from: a change of runtime or precision
forks the new generation from another template (`switch_backend`) while the old one's workers still serve,
and every message to a worker goes through its own backend. An older template is closed once the last of
its workers has exited (`close_drained`).

It also moves the tensors of every job (`run`, and the results in `handle`): big ones through shared
memory (workers.arena), small ones as ZeroMQ frames. It is the one place that knows which jobs a
worker has outstanding, which is what decides when an arena may be written.
"""

from __future__ import annotations

import contextlib
import enum
import functools
import itertools
import logging
import os
import signal
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from packrat_daemon.fleet.backend import Backend, TemplateError
from packrat_daemon.fleet.exits import ExitCauses
from workers import messages
from workers.arena import SHARED_MIN_BYTES, Arena, Location, PeerArena, locate, warn_no_shared_memory

log = logging.getLogger("packrat.pool")

# Worker ids are unique for the life of the daemon process, whichever pool (serving or profiling)
# asked for the worker: identities on the shared backend socket must never be reused.
_worker_ids = itertools.count(1)
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")  # the unit of /proc/<pid>/stat's CPU times


class WorkerState(enum.Enum):
    STARTING = "starting"  # asked the template to fork it; not yet warmed up
    READY = "ready"  # serving
    STOPPING = "stopping"  # told to stop; no new work
    DEAD = "dead"


@dataclass
class WorkerHandle:
    id: int
    threads: int
    cores: tuple[int, ...]
    generation: int
    state: WorkerState = WorkerState.STARTING
    pid: int | None = None
    last_seen: float = field(default_factory=time.monotonic)
    # (threads, cores, generation) it was told to switch to in place; it serves as before until done.
    pending: tuple[int, tuple[int, ...], int] | None = None
    outstanding: int = 0  # jobs sent and not answered (a late answer to an abandoned job counts too)
    served: int = 0  # slices answered, for `packrat status`
    parked_since: float | None = None  # time.monotonic() the reconciler parked it (no batches until taken back)
    shared: SharedArenas | None = None  # None: this worker's tensors travel as frames
    backend: Backend | None = None  # the template it was forked from, and the socket that reaches it
    # /proc/<pid>/stat, opened once: the CPU time is read for every job sent (its hang budget, Dispatcher), and a
    # descriptor kept open reads its own process only (once that one is gone, ESRCH, never a pid reused).
    _stat_fd: int | None = field(default=None, repr=False, compare=False)

    @property
    def target(self) -> tuple[int, tuple[int, ...]]:
        """The (threads, cores) this worker has or is switching to."""
        return (self.pending[0], self.pending[1]) if self.pending else (self.threads, self.cores)

    @functools.cached_property
    def identity(self) -> bytes:  # the id never changes; this is read once per job sent
        return messages.worker_identity(self.id)

    def cpu_seconds(self) -> float | None:
        """User plus system CPU time of the worker's process, all its threads; None before its pid is known,
        once it is gone, or where /proc cannot be read."""
        fd = self._stat_fd
        if fd is None:
            if self.pid is None:
                return None
            try:
                fd = self._stat_fd = os.open(f"/proc/{self.pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                return None
        try:
            stat = os.pread(fd, 1024, 0)
        except OSError:
            return None
        # After the command name in parentheses (which may hold anything): state, then 10 fields, utime, stime.
        fields = stat[stat.rindex(b")") + 2 :].split()
        return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS

    def close_stat(self) -> None:
        """Close the descriptor cpu_seconds keeps (the worker has exited)."""
        fd, self._stat_fd = self._stat_fd, None
        if fd is not None:
            os.close(fd)


class SharedArenas:
    """A worker's shared memory as the daemon holds it: the arena it writes the worker's inputs into,
    and the worker's output arena as mapped here."""

    def __init__(self, worker_id: int, input_bytes: int = 0) -> None:
        self.inputs = Arena(f"w{worker_id}-in")
        self.outputs = PeerArena()
        if input_bytes >= SHARED_MIN_BYTES:
            try:
                self.inputs.reserve(input_bytes)
            except OSError as exc:  # it grows on demand instead, as each bigger input comes
                warn_no_shared_memory(f"worker {worker_id}'s input", exc)

    def close(self) -> None:
        self.inputs.close()
        self.outputs.close()


@dataclass(slots=True)  # not frozen: one is built per result, and frozen fields cost a setattr each
class PoolEvent:
    kind: str  # "ready", "reconfigured", "result", "failed", "lost" (after ready), "boot-failed" (before)
    worker: WorkerHandle | None
    header: dict[str, Any]
    payload: list[Any]


class Pool:
    def __init__(self, backend: Backend, warmup: tuple[int, ...] = (1,), shared_memory: bool = True) -> None:
        self.backend = backend  # the template new workers fork from
        self.home = backend  # the first: its folder (which may hold the control socket) goes when the pool closes
        self.retiring: list[Backend] = []  # older templates, closed once the last of their workers has exited
        self.warmup = warmup
        self.shared_memory = shared_memory  # False: every tensor as frames (the bench's old path)
        # The largest input a worker is sent, when known: its input arena is made at this size and paged in
        # when it starts (0: it grows as bigger inputs come, and its resident pages with the largest so far).
        self.input_arena_bytes = 0
        self.workers: dict[int, WorkerHandle] = {}
        self._by_identity_bytes: dict[bytes, WorkerHandle] = {}  # every message from a worker is looked up
        self.boot_failures = 0  # workers in a row that exited before they were ready; a ready one resets it
        self.boot_error = ""  # what the last of them reported
        self.boot_failed_at = 0.0  # time.monotonic() of the last
        self.exits = ExitCauses()  # words each exit: a SIGKILL from the OOM killer told apart

    def spawn(self, threads: int, cores: tuple[int, ...], generation: int) -> WorkerHandle:
        worker = WorkerHandle(next(_worker_ids), threads, cores, generation, backend=self.backend)
        self.workers[worker.id] = worker
        self._by_identity_bytes[worker.identity] = worker
        header = {"worker": worker.id, "threads": threads, "cores": list(cores), "warmup": list(self.warmup)}
        if not self.backend.send(messages.TEMPLATE_IDENTITY, messages.SPAWN, header):
            worker.state = WorkerState.DEAD
        return worker

    def reconfigure(self, worker: WorkerHandle, threads: int, cores: tuple[int, ...], generation: int) -> None:
        """Re-thread and re-pin a live worker in place: no fork, no model reload, no downtime."""
        worker.pending = (threads, cores, generation)
        if not self.via(worker).send(worker.identity, messages.CONFIGURE, {"threads": threads, "cores": list(cores)}):
            self.kill(worker)

    def retire(self, worker: WorkerHandle) -> None:
        if worker.state in (WorkerState.STOPPING, WorkerState.DEAD):
            return
        worker.state = WorkerState.STOPPING
        if not self.via(worker).send(worker.identity, messages.STOP, {}):
            self.kill(worker)

    def kill(self, worker: WorkerHandle) -> None:
        """For a hung worker: SIGKILL; the template reports the exit and the reconciler replaces it."""
        if worker.pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(worker.pid, signal.SIGKILL)
        worker.state = WorkerState.STOPPING

    def run(self, worker: WorkerHandle, header: dict[str, Any], frames: list[memoryview]) -> bool:
        """Send a job ({"job", "dtype", "shape"}; the input as C-contiguous byte views); False if the worker is gone.

        A big input that lies in the daemon's inbox (one request's payload, copied there on arrival) is
        read there in place: only a header is sent. Another big input goes through the worker's arena
        when the worker has nothing outstanding (so it is reading no earlier input, and every earlier
        output of its arena has been copied out); otherwise, a re-sent slice to a busy worker included,
        as frames.
        """
        nbytes = frames[0].nbytes if len(frames) == 1 else sum([frame.nbytes for frame in frames])
        shared = worker.shared
        placed = None
        if shared is not None and nbytes >= SHARED_MIN_BYTES:
            placed = locate(frames)
            if placed is None and not worker.outstanding:
                try:
                    placed = shared.inputs.write(frames, nbytes), 0
                except OSError as exc:  # no descriptor or memory for a bigger arena: this job goes as frames
                    warn_no_shared_memory(f"worker {worker.id}'s input", exc)
        if placed is not None:
            location, offset = placed
            header = {**header, "pid": location.pid, "fd": location.fd, "serial": location.serial,
                      "size": location.size, "offset": offset}  # fmt: skip
            sent = self.via(worker).send(worker.identity, messages.RUN_SHARED, header)
        else:
            sent = self.via(worker).send(worker.identity, messages.RUN, header, frames, nbytes)
        if sent:
            worker.outstanding += 1
        return sent

    def via(self, worker: WorkerHandle) -> Backend:
        """The backend that reaches `worker`: the one it was forked from."""
        return worker.backend or self.backend

    @property
    def backends(self) -> tuple[Backend, ...]:
        """Every template this pool holds, the one new workers fork from first (each socket is polled)."""
        return (self.backend, *self.retiring)

    def switch_backend(self, backend: Backend) -> None:
        """Fork new workers from `backend` from now on (another runtime or precision); the current template
        keeps its workers until they are retired, and is closed once the last has exited."""
        if backend is self.backend:
            return
        if backend in self.retiring:  # switched back before the old template drained: it serves again
            self.retiring.remove(backend)
        self.retiring.append(self.backend)
        self.backend = backend

    def close_drained(self) -> list[Backend]:
        """Close each older template none of whose workers is left (every one has exited); returns those closed."""
        held = {id(self.via(worker)) for worker in self.workers.values()}
        closed = [backend for backend in self.retiring if id(backend) not in held]
        for backend in closed:
            self.retiring.remove(backend)
            backend.close(keep_dir=backend is self.home)
        return closed

    def close(self) -> None:
        """Stop every template this pool holds (each stops its workers)."""
        for worker in self.workers.values():
            worker.close_stat()
        for backend in (*self.backends, self.home):  # the first again, if it closed before: its folder now
            backend.close()
        self.retiring = []

    def live(self) -> list[WorkerHandle]:
        return [w for w in self.workers.values() if w.state in (WorkerState.STARTING, WorkerState.READY)]

    def ready(self, generation: int | None = None) -> list[WorkerHandle]:
        return [
            w
            for w in self.workers.values()
            if w.state is WorkerState.READY and (generation is None or w.generation == generation)
        ]

    def handle(self, identity: bytes, kind: bytes, header: dict[str, Any], payload: list[Any]) -> PoolEvent | None:
        """Update state from one backend message; return what the daemon must react to."""
        if identity == messages.TEMPLATE_IDENTITY:
            return self._from_template(kind, header)
        worker = self._by_identity_bytes.get(identity)
        if worker is None:
            return None
        worker.last_seen = time.monotonic()
        if kind == messages.RESULT or kind == messages.RESULT_SHARED:
            worker.outstanding = max(0, worker.outstanding - 1)
            worker.served += 1
            try:
                output = self._output(worker, kind, header, payload)
            except OSError as exc:  # the worker's new output arena cannot be mapped here (no descriptor left)
                message = (
                    f"the daemon could not map worker {worker.id}'s shared memory for the result ({exc.strerror}); "
                    "if it is out of file descriptors, raise its open-file limit (LimitNOFILE= under systemd)"
                )
                return PoolEvent("failed", worker, {**header, "message": message}, [])
            return PoolEvent("result", worker, header, [output])
        if kind == messages.READY:
            worker.pid = header.get("pid", worker.pid)
            if worker.state is WorkerState.STARTING:
                self._share(worker, header.get("arena"))
                worker.state = WorkerState.READY
                self.boot_failures = 0
                return PoolEvent("ready", worker, header, payload)
            if worker.state is WorkerState.STOPPING:
                self.via(worker).send(worker.identity, messages.STOP, {})
            return None
        if kind == messages.CONFIGURED and worker.pending is not None:
            worker.threads, worker.cores, worker.generation = worker.pending
            worker.pending = None
            return PoolEvent("reconfigured", worker, header, payload)
        if kind == messages.FAILED:
            worker.outstanding = max(0, worker.outstanding - 1)
            return PoolEvent("failed", worker, header, payload)
        return None  # heartbeats only refresh last_seen

    def _from_template(self, kind: bytes, header: dict[str, Any]) -> PoolEvent | None:
        worker = self.workers.get(header.get("worker") or -1)
        if kind == messages.SPAWNED and worker is not None:
            worker.pid = header["pid"]
        elif kind == messages.EXITED and worker is not None:
            was = worker.state
            worker.state = WorkerState.DEAD
            worker.close_stat()
            if worker.shared is not None:  # the worker's side went with it; free ours now
                worker.shared.close()
                worker.shared = None
            del self.workers[worker.id]
            self._by_identity_bytes.pop(worker.identity, None)
            if was is WorkerState.STARTING:
                return self._boot_failed(worker, header)
            if was is not WorkerState.STOPPING:
                cause = self.exits.describe(header.get("status"))
                log.warning("worker %d (pid %s, %d thread(s)) %s", worker.id, worker.pid, worker.threads, cause)
                return PoolEvent("lost", worker, {**header, "cause": cause}, [])
        return None

    def _boot_failed(self, worker: WorkerHandle, header: dict[str, Any]) -> PoolEvent:
        # Any exit before ready counts, not only WORKER_BOOT_ERROR: a worker killed while warming up
        # (out of memory) would otherwise be re-forked in a loop too. The code says whether it explained.
        status = header.get("status")
        self.boot_failures += 1
        self.boot_failed_at = time.monotonic()
        if status == messages.WORKER_BOOT_ERROR and header.get("error"):
            self.boot_error = str(header["error"])
        else:
            self.boot_error = f"the worker {self.exits.describe(status)} before it was ready"
        log.warning("worker %d (%d thread(s)) failed to start, %d in a row: %s",
                    worker.id, worker.threads, self.boot_failures, self.boot_error)  # fmt: skip
        return PoolEvent("boot-failed", worker, header, [])

    def _share(self, worker: WorkerHandle, arena: list[int] | None) -> None:
        """Use shared memory with a worker that offered its output arena, if this process can map it."""
        if not self.shared_memory or not arena:
            return
        shared = SharedArenas(worker.id, self.input_arena_bytes)
        try:
            shared.outputs.array(Location(*arena), np.dtype(np.uint8), (0,))
        except OSError as exc:
            shared.close()
            log.warning(
                "worker %d: its tensors travel as ZeroMQ frames, since its shared memory cannot be mapped here "
                "(%s); /proc must let a process open the fds of its own user's processes", worker.id, exc
            )  # fmt: skip
            return
        worker.shared = shared

    @staticmethod
    def _output(worker: WorkerHandle, kind: bytes, header: dict[str, Any], payload: list[Any]) -> np.ndarray:
        dtype = messages.numpy_dtype(header["dtype"])
        if kind == messages.RESULT:
            return np.frombuffer(payload[0].buffer, dtype=dtype).reshape(header["shape"])
        assert worker.shared is not None, "a shared result comes only for a shared job"
        location = Location(*[header[name] for name in messages.ARENA_FIELDS])
        # A copy: the reply to the client must not alias memory that the worker's next job overwrites.
        return worker.shared.outputs.array(location, dtype, header["shape"]).copy()

    def pump(self, timeout_ms: int) -> PoolEvent | None:
        """Wait up to `timeout_ms` for one backend message and apply it (for synchronous users:
        profiling and confirmation; the daemon's loop polls the socket itself)."""
        received = self.backend.recv(timeout_ms)
        if received is None:
            if not self.template_alive():
                raise TemplateError("the template process died")
            return None
        return self.handle(*received)

    def template_alive(self) -> bool:
        template = self.backend.template
        return template is not None and template.poll() is None

    def check_template(self) -> None:
        """TemplateLost once a template this pool holds has exited (none started yet: nothing to check)."""
        for backend in self.backends:
            if backend.template is not None:
                backend.check_template()
