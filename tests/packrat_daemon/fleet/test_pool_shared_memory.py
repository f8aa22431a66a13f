"""Tensors through shared memory between the daemon and its workers.

Unit tests drive the pool with a recording backend and in-process arenas standing in for a worker's;
the slow ones run real workers: the same results as frames, and nothing left after SIGKILL.
"""

from __future__ import annotations

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

from packrat_daemon.fleet.backend import Backend
from packrat_daemon.fleet.pool import Pool, PoolEvent, WorkerHandle, WorkerState
from packrat_daemon.wire.client import Client
from tests.helpers.daemons import daemon_env, running_daemon
from workers import messages
from workers.arena import SHARED_MIN_BYTES, Arena, Location, PeerArena


class RecordingBackend:
    """Stands in for the backend socket: records what the pool sends, every peer is reachable."""

    def __init__(self) -> None:
        self.sent: list[tuple[bytes, bytes, dict[str, Any], list[Any]]] = []
        self.template = None

    def send(self, identity: bytes, kind: bytes, header: dict[str, Any], payload: Any = (), nbytes: int = -1) -> bool:
        self.sent.append((identity, kind, header, list(payload)))
        return True


@pytest.fixture
def worker_arena() -> Iterator[Arena]:
    arena = Arena("test-worker-out")  # this process plays the worker: the pool maps it through /proc/self
    yield arena
    arena.close()


@pytest.fixture
def make_pool() -> Iterator[Callable[..., Pool]]:
    """Pools over a recording backend; their arenas are closed afterwards, as dead workers' exits would."""
    made: list[Pool] = []

    def make(shared_memory: bool = True) -> Pool:
        made.append(Pool(RecordingBackend(), shared_memory=shared_memory))  # type: ignore[arg-type]
        return made[-1]

    yield make
    for pool in made:
        for worker in pool.workers.values():
            if worker.shared is not None:
                worker.shared.close()


def ready_worker(pool: Pool, arena: Arena | None) -> WorkerHandle:
    worker = pool.spawn(1, (0,), generation=1)
    header: dict[str, Any] = {"worker": worker.id, "pid": os.getpid(), "threads": 1, "cores": [0]}
    if arena is not None:
        header["arena"] = list(arena.write((), 0))
    assert pool.handle(worker.identity, messages.READY, header, []) is not None
    return worker


def job(number: int, x: np.ndarray) -> tuple[dict[str, Any], list[memoryview]]:
    return {"job": number, "dtype": "float32", "shape": list(x.shape)}, [memoryview(x).cast("B")]


def big(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((2, SHARED_MIN_BYTES // 4), dtype=np.float32)


def test_a_big_input_goes_shared_to_an_idle_worker_and_as_frames_while_it_is_busy(
    make_pool: Callable[..., Pool], worker_arena: Arena
) -> None:
    pool = make_pool()
    backend = pool.backend
    worker = ready_worker(pool, worker_arena)
    x1, x2 = big(1), big(2)
    assert pool.run(worker, *job(1, x1))
    assert pool.run(worker, *job(2, x2))  # a re-sent slice while job 1 is outstanding: the arena is in use
    (_, kind1, header1, payload1), (_, kind2, _, payload2) = backend.sent[-2:]
    assert (kind1, payload1, kind2) == (messages.RUN_SHARED, [], messages.RUN)
    assert bytes(payload2[0]) == x2.tobytes()
    # What the worker maps is exactly the slice.
    location = Location(*[header1[name] for name in messages.ARENA_FIELDS])
    peer = PeerArena()
    np.testing.assert_array_equal(peer.array(location, np.dtype(np.float32), x1.shape), x1)
    peer.close()
    # Small inputs stay frames, whatever the worker's state.
    tiny = np.ones((1, 4), dtype=np.float32)
    pool.handle(worker.identity, messages.FAILED, {"job": 1, "message": "x"}, [])
    pool.handle(worker.identity, messages.FAILED, {"job": 2, "message": "x"}, [])
    assert worker.outstanding == 0
    assert pool.run(worker, *job(3, tiny)) and backend.sent[-1][1] == messages.RUN


def test_a_shared_result_is_copied_out_before_the_worker_writes_again(
    make_pool: Callable[..., Pool], worker_arena: Arena
) -> None:
    pool = make_pool()
    worker = ready_worker(pool, worker_arena)
    x = big(3)
    pool.run(worker, *job(7, x))
    y = x * 2
    location = worker_arena.write([memoryview(y).cast("B")], y.nbytes)
    header = {"job": 7, "dtype": "float32", "shape": list(y.shape), "compute_ms": 1.0, "threads": 1, "batch": 2}
    header.update(zip(messages.ARENA_FIELDS, location, strict=True))
    event = pool.handle(worker.identity, messages.RESULT_SHARED, header, [])
    assert isinstance(event, PoolEvent) and event.kind == "result" and worker.outstanding == 0
    output = event.payload[0]
    worker_arena.write([b"\0" * y.nbytes], y.nbytes)  # the worker's next job overwrites its arena
    np.testing.assert_array_equal(output, y)


def test_without_shared_memory_every_tensor_is_frames(make_pool: Callable[..., Pool], worker_arena: Arena) -> None:
    pool = make_pool(shared_memory=False)
    backend = pool.backend
    worker = ready_worker(pool, worker_arena)
    assert worker.shared is None
    pool.run(worker, *job(1, big(4)))
    assert backend.sent[-1][1] == messages.RUN


def test_a_dead_workers_arenas_are_freed_at_once(make_pool: Callable[..., Pool], worker_arena: Arena) -> None:
    pool = make_pool()
    worker = ready_worker(pool, worker_arena)
    pool.run(worker, *job(1, big(5)))
    name = f"/memfd:packrat-w{worker.id}-in"
    assert name in own_memfds()
    exited = {"worker": worker.id, "pid": os.getpid(), "status": -9}
    assert pool.handle(messages.TEMPLATE_IDENTITY, messages.EXITED, exited, []) is not None
    assert worker.state is WorkerState.DEAD and worker.shared is None
    assert name not in own_memfds()


def test_without_descriptors_for_shared_memory_jobs_go_as_frames_and_results_fail_typed(
    make_pool: Callable[..., Pool], worker_arena: Arena, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Before: the OSError of a full descriptor table came out of pool.run and pool.handle, into the loop.
    pool = make_pool()
    worker = ready_worker(pool, worker_arena)
    x = big(6)
    y = np.ones((2, 1 << 18), dtype=np.float32)  # a result that outgrows the worker's arena: a new one to map
    location = worker_arena.write([memoryview(y).cast("B")], y.nbytes)

    def no_descriptors(*args: Any, **kwargs: Any) -> int:
        raise OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr(os, "memfd_create", no_descriptors)
    monkeypatch.setattr(os, "open", no_descriptors)
    assert pool.run(worker, *job(1, x))
    assert pool.backend.sent[-1][1] == messages.RUN and bytes(pool.backend.sent[-1][3][0]) == x.tobytes()
    header = {"job": 1, "dtype": "float32", "shape": list(y.shape), "compute_ms": 1.0, "threads": 1, "batch": 2}
    header.update(zip(messages.ARENA_FIELDS, location, strict=True))
    event = pool.handle(worker.identity, messages.RESULT_SHARED, header, [])
    assert event is not None and event.kind == "failed" and worker.outstanding == 0
    assert "raise its open-file limit" in event.header["message"]


def own_memfds(pid: int | str = "self") -> list[str]:
    """The packrat memfds a process holds open or mapped."""
    found = []
    for entry in Path(f"/proc/{pid}/fd").iterdir():
        try:
            found.append(os.readlink(entry).removesuffix(" (deleted)"))
        except OSError:
            continue
    for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
        found.append(line.split(maxsplit=5)[-1].removesuffix(" (deleted)"))
    return [name for name in found if name.startswith("/memfd:packrat-")]


# -- real workers ------------------------------------------------------------------------------------


@pytest.mark.slow
def test_results_through_shared_memory_are_identical_to_frames(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in daemon_env().items():
        monkeypatch.setenv(name, value)
    context = zmq.Context()
    backend = Backend(context, str(tmp_path / "run"))
    try:
        backend.start_template("tests.model_factories:doubler")
        backend.wait_template(120)
        pools = {"shared": Pool(backend), "frames": Pool(backend, shared_memory=False)}
        workers = {name: pool.spawn(1, (0,), generation=1) for name, pool in pools.items()}
        owners = {workers[name].identity: pool for name, pool in pools.items()}
        deadline = time.monotonic() + 120
        while any(worker.state is WorkerState.STARTING for worker in workers.values()):
            assert time.monotonic() < deadline, "the workers did not start"
            received = backend.recv(200)
            # Both pools share one socket: each worker's READY goes to the pool that spawned it (a pool that
            # pumped it would drop another pool's message, and that pool would wait for ever).
            if received is not None and received[0] in owners:
                owners[received[0]].handle(*received)
        assert workers["shared"].shared is not None and workers["frames"].shared is None
        rng = np.random.default_rng(11)
        for number, rows in enumerate([1, 3, 2, 40, 1]):  # 40 rows outgrow the first arena
            x = rng.standard_normal((rows, 32768), dtype=np.float32)
            outputs = {name: answer(pool, workers[name], number, x) for name, pool in pools.items()}
            assert outputs["shared"].tobytes() == outputs["frames"].tobytes() == (x * 2).tobytes()
    finally:
        backend.close()
        context.term()


def answer(pool: Pool, worker: WorkerHandle, number: int, x: np.ndarray) -> np.ndarray:
    assert pool.run(worker, *job(number, x))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        received = pool.backend.recv(200)
        # Both pools share one socket: hand each message to the pool that knows its sender.
        if received is not None and received[0] == worker.identity:
            event = pool.handle(*received)
            if event is not None and event.kind == "result" and event.header["job"] == number:
                return event.payload[0]
    raise AssertionError("no result")


@pytest.mark.slow
def test_a_worker_killed_mid_batch_leaves_no_shared_memory_and_its_slice_is_resent(tmp_path: Path) -> None:
    args = ["--model", "tests.model_factories:slow_doubler", "--policy", "fixed", "--plan", "2*1x2", "--max-batch", "4"]
    with running_daemon(tmp_path, *args) as (endpoint, daemon), Client(endpoint, timeout=60) as client:
        workers = client.info()["workers"]
        x = np.random.default_rng(5).standard_normal((4, 32768), dtype=np.float32)
        assert client.infer(x).tobytes() == (x * 2).tobytes()  # both workers have an arena now
        result: dict[str, np.ndarray] = {}
        thread = threading.Thread(target=lambda: result.setdefault("y", client.infer(x)))
        thread.start()
        time.sleep(0.15)  # both workers are inside their 0.3 s forward pass now
        killed = workers[0]
        os.kill(killed["pid"], signal.SIGKILL)
        thread.join(60)
        assert result["y"].tobytes() == (x * 2).tobytes()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            live = client.info()["workers"]
            if len(live) == 2 and killed["pid"] not in {w["pid"] for w in live}:
                break
            time.sleep(0.2)
        else:
            raise AssertionError(f"the dead worker was not replaced: {client.info()['workers']}")
        # The replacement serves through shared memory too (each worker reads its rows in place from the
        # daemon's inbox, where the request's payload was copied on arrival), and the daemon holds no
        # arena of the dead one.
        assert client.infer(x).tobytes() == (x * 2).tobytes()
        held = own_memfds(daemon.pid)
        assert not [name for name in held if f"-w{killed['id']}-" in name]
        inbox = {name for name in held if name.startswith("/memfd:packrat-inbox-")}
        assert inbox and all(inbox & set(own_memfds(w["pid"])) for w in live)
        worker_pids = [w["pid"] for w in live]
        before = set(os.listdir("/dev/shm"))
        daemon.send_signal(signal.SIGKILL)
        daemon.wait(10)
        deadline = time.monotonic() + 30
        while any(Path(f"/proc/{pid}").exists() for pid in worker_pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        # The workers go with the daemon, and the kernel frees their memfds with them: nothing is named.
        assert not [pid for pid in worker_pids if Path(f"/proc/{pid}").exists()]
        assert not [name for name in set(os.listdir("/dev/shm")) - before if "packrat" in name]
