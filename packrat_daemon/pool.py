"""The daemon's view of its worker processes (circus's "watcher"/"process" nouns).

The pool only records state and sends the verbs; deciding *what* the pool should be is the
reconciler's job, and only the reconciler calls `spawn` and `retire`.
"""

from __future__ import annotations

import contextlib
import enum
import functools
import itertools
import os
import signal
import time
from dataclasses import dataclass, field
from typing import Any

from packrat_daemon.backend import Backend, TemplateError
from workers import messages

# Worker ids are unique for the life of the daemon process, whichever pool (serving or profiling)
# asked for the worker: identities on the shared backend socket must never be reused.
_worker_ids = itertools.count(1)


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
    started_at: float = field(default_factory=time.monotonic)
    last_seen: float = field(default_factory=time.monotonic)
    # (threads, cores, generation) it was told to switch to in place; it serves as before until done.
    pending: tuple[int, tuple[int, ...], int] | None = None

    @property
    def target(self) -> tuple[int, tuple[int, ...]]:
        """The (threads, cores) this worker has or is switching to."""
        return (self.pending[0], self.pending[1]) if self.pending else (self.threads, self.cores)

    @functools.cached_property
    def identity(self) -> bytes:  # the id never changes; this is read once per job sent
        return messages.worker_identity(self.id)


@dataclass(slots=True)  # not frozen: one is built per result, and frozen fields cost a setattr each
class PoolEvent:
    kind: str  # "ready", "lost", "result", "failed", "template-lost"
    worker: WorkerHandle | None
    header: dict[str, Any]
    payload: list[Any]


class Pool:
    def __init__(self, backend: Backend, warmup: tuple[int, ...] = (1,)) -> None:
        self.backend = backend
        self.warmup = warmup
        self.workers: dict[int, WorkerHandle] = {}
        self._by_identity_bytes: dict[bytes, WorkerHandle] = {}  # every message from a worker is looked up

    def spawn(self, threads: int, cores: tuple[int, ...], generation: int) -> WorkerHandle:
        worker = WorkerHandle(next(_worker_ids), threads, cores, generation)
        self.workers[worker.id] = worker
        self._by_identity_bytes[worker.identity] = worker
        header = {"worker": worker.id, "threads": threads, "cores": list(cores), "warmup": list(self.warmup)}
        if not self.backend.send(messages.TEMPLATE_IDENTITY, messages.SPAWN, header):
            worker.state = WorkerState.DEAD
        return worker

    def reconfigure(self, worker: WorkerHandle, threads: int, cores: tuple[int, ...], generation: int) -> None:
        """Re-thread and re-pin a live worker in place: no fork, no model reload, no downtime."""
        worker.pending = (threads, cores, generation)
        if not self.backend.send(worker.identity, messages.CONFIGURE, {"threads": threads, "cores": list(cores)}):
            self.kill(worker)

    def retire(self, worker: WorkerHandle) -> None:
        if worker.state in (WorkerState.STOPPING, WorkerState.DEAD):
            return
        worker.state = WorkerState.STOPPING
        if not self.backend.send(worker.identity, messages.STOP, {}):
            self.kill(worker)

    def kill(self, worker: WorkerHandle) -> None:
        """For a hung worker: SIGKILL; the template reports the exit and the reconciler replaces it."""
        if worker.pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(worker.pid, signal.SIGKILL)
        worker.state = WorkerState.STOPPING

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
        worker = self._by_identity(identity)
        if worker is None:
            return None
        worker.last_seen = time.monotonic()
        if kind == messages.READY:
            worker.pid = header.get("pid", worker.pid)
            if worker.state is WorkerState.STARTING:
                worker.state = WorkerState.READY
                return PoolEvent("ready", worker, header, payload)
            if worker.state is WorkerState.STOPPING:
                self.backend.send(worker.identity, messages.STOP, {})
            return None
        if kind == messages.CONFIGURED and worker.pending is not None:
            worker.threads, worker.cores, worker.generation = worker.pending
            worker.pending = None
            return PoolEvent("reconfigured", worker, header, payload)
        if kind == messages.RESULT:
            return PoolEvent("result", worker, header, payload)
        if kind == messages.FAILED:
            return PoolEvent("failed", worker, header, payload)
        return None  # heartbeats only refresh last_seen

    def _from_template(self, kind: bytes, header: dict[str, Any]) -> PoolEvent | None:
        worker = self.workers.get(header.get("worker") or -1)
        if kind == messages.SPAWNED and worker is not None:
            worker.pid = header["pid"]
        elif kind == messages.EXITED and worker is not None:
            was = worker.state
            worker.state = WorkerState.DEAD
            del self.workers[worker.id]
            self._by_identity_bytes.pop(worker.identity, None)
            if was is not WorkerState.STOPPING:
                return PoolEvent("lost", worker, header, [])
        return None

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

    def _by_identity(self, identity: bytes) -> WorkerHandle | None:
        return self._by_identity_bytes.get(identity)
