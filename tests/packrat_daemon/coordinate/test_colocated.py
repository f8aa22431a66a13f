"""Two models on one machine under `packrat coordinate`, with real daemons on real sockets: disjoint CPU sets
(the workers' real affinity masks), each model answering its own (ZeroMQ and the Open Inference Protocol), a
killed model restarted while the other serves with no failed request and given its share back, typed
refusals of a bad `assign`, and cores moved between two emulated models under traffic with no failed
request and no CPU ever held by both."""

from __future__ import annotations

import functools
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest

from packrat_daemon.control.server import ControlError, request
from packrat_daemon.wire.client import Client
from packrat_daemon.wire.errors import BadRequest, PolicyError, TopologyError
from tests.helpers.daemons import REPO, daemon_env, running_daemon, stop_process

pytestmark = pytest.mark.slow

needs_two_cpus = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs, one per model")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def private(path: Path) -> Path:
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path


def wait_for(what: str, check: Callable[[], bool], timeout: float = 60.0, log: Path | None = None) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:.0f} s" + (f"\n{log.read_text()}" if log else ""))
        time.sleep(0.1)


@contextmanager
def coordinator(tmp_path: Path, *args: str) -> Iterator[Path]:
    """`packrat coordinate` as a process; yields its status file."""
    status = tmp_path / "coordinator.json"
    log = tmp_path / "coordinator.log"
    command = [sys.executable, "-m", "packrat_daemon", "coordinate", "--status-file", str(status), *args]
    with open(log, "wb") as out:
        process = subprocess.Popen(command, env=daemon_env(), stdout=out, stderr=subprocess.STDOUT, cwd=REPO)
    try:
        yield status
    finally:
        stop_process(process, 10)
        assert process.returncode == 0, log.read_text()  # SIGTERM: a clean stop, whatever the daemons did


@contextmanager
def daemons(*starts: tuple[Path, tuple[str, ...]]) -> Iterator[list[tuple[str, subprocess.Popen[bytes]]]]:
    """Several real daemons started side by side (each start measures nothing, but loads torch for seconds)."""
    managers = [running_daemon(folder, *args) for folder, args in starts]
    with ExitStack() as stack:
        with ThreadPoolExecutor(len(managers)) as pool:
            futures = [pool.submit(manager.__enter__) for manager in managers]
        failures: list[BaseException] = []
        for manager, future in zip(managers, futures, strict=True):
            error = future.exception()
            if error is None:
                stack.push(manager.__exit__)  # stopped on the way out, whatever happens to the others
            else:
                failures.append(error)
        if failures:
            raise failures[0]
        yield [future.result() for future in futures]


def read_status(path: Path) -> dict[str, Any]:
    try:
        return dict(json.loads(path.read_text()))
    except (FileNotFoundError, ValueError):
        return {}


def status_of(endpoint: str) -> dict[str, Any]:
    with Client(endpoint, timeout=10) as client:
        return client.status()


def assigned_by_coordinator(endpoint: str) -> bool:
    return str(status_of(endpoint)["share"]["assigned_by"]).startswith("coordinator")


def real_cpus(worker_pid: int) -> set[int]:
    """Every CPU any thread of the process may run on: the kernel's own masks, thread by thread."""
    cpus: set[int] = set()
    for thread in psutil.Process(worker_pid).threads():
        cpus |= os.sched_getaffinity(thread.id)
    return cpus


class Sender:
    """A client sending to one daemon the whole time, counting answers and failures."""

    def __init__(self, endpoint: str, sample: np.ndarray, clients: int = 1) -> None:
        self.endpoint, self.sample = endpoint, sample
        self.ok, self.failed = 0, []  # type: tuple[int, list[str]]
        self.stopping = threading.Event()
        self.threads = [threading.Thread(target=self._send, daemon=True) for _ in range(clients)]
        self.lock = threading.Lock()

    def __enter__(self) -> Sender:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        for thread in self.threads:
            thread.join(60)

    def _send(self) -> None:
        with Client(self.endpoint, timeout=60) as client:
            while not self.stopping.is_set():
                try:
                    client.infer(self.sample)
                    with self.lock:
                        self.ok += 1
                except Exception as exc:  # every failure is counted, whatever it is
                    with self.lock:
                        self.failed.append(repr(exc))


@functools.cache
def loaded(spec: str) -> Any:
    from workers.models.loading import load_model

    return load_model(spec)


def reference(spec: str, x: np.ndarray) -> np.ndarray:
    """What the model computes, loaded here as a worker loads it (fixed seed)."""
    import torch

    with torch.no_grad():
        return np.asarray(loaded(spec).module(torch.from_numpy(x)))


def oip_infer(port: int, model: str, x: np.ndarray) -> np.ndarray:
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(f"127.0.0.1:{port}")
    try:
        # The gateway learns that its daemon serves by polling it: ready over ZeroMQ can come a moment earlier.
        deadline = time.monotonic() + 30
        while not client.is_server_ready() and time.monotonic() < deadline:
            time.sleep(0.1)
        tensor = httpclient.InferInput("input", list(x.shape), "FP32")
        tensor.set_data_from_numpy(x)
        return np.asarray(client.infer(model, [tensor]).as_numpy("output"))
    finally:
        client.close()


# One pinned 1-thread worker per model: no profile to measure, start-up in seconds.
PINNED_ONE = ("--policy", "fixed", "--plan", "1x1", "--max-batch", "4")


@needs_two_cpus
def test_two_models_keep_their_own_answers_and_a_killed_one_gets_its_share_back(tmp_path: Path) -> None:
    pytest.importorskip("tritonclient.http", reason="tritonclient is not installed (pip install -e '.[test]')")
    a_dir, b_dir = private(tmp_path / "a"), private(tmp_path / "b")
    a_run, b_run = private(a_dir / "run"), private(b_dir / "run")
    a_http, b_http = free_port(), free_port()
    a_args = ("--model", "builtin:tiny-mlp", "--cpus", "0", "--run-dir", str(a_run), "--oip-model-name", "mlp",
              *PINNED_ONE)  # fmt: skip
    b_args = ("--model", "builtin:tiny-cnn", "--cpus", "1", "--run-dir", str(b_run), "--oip-model-name", "cnn",
              "--http-port", str(b_http), *PINNED_ONE)  # fmt: skip
    x_mlp = np.random.default_rng(1).standard_normal((3, 16), dtype=np.float32)
    x_cnn = np.random.default_rng(2).standard_normal((2, 3, 16, 16), dtype=np.float32)
    with (
        daemons((a_dir, (*a_args, "--http-port", str(a_http))), (b_dir, b_args)) as [(a, a_process), (b, _)],
        coordinator(tmp_path, "--daemon", f"a={a_run}", "--daemon", f"b={b_run}", "--interval", "0.3") as status,
    ):
        wait_for("both shares assigned", lambda: assigned_by_coordinator(a) and assigned_by_coordinator(b))
        usable = len(os.sched_getaffinity(0))
        shares = {name: set(status_of(endpoint)["share"]["cpu_ids"]) for name, endpoint in (("a", a), ("b", b))}
        # The coordinator's start, the safe default: every model on all the cores (no profile: it stays so).
        assert shares == {"a": {0, 1}, "b": {0, 1}}

        def check_cores(shares: dict[str, set[int]]) -> None:
            threads = 0
            held: dict[str, set[int]] = {}
            for name, endpoint in (("a", a), ("b", b)):
                workers = [w for w in status_of(endpoint)["workers"] if w["state"] != "parked"]
                assert workers, f"{name} has no worker"
                held[name] = set().union(*(real_cpus(w["pid"]) for w in workers))
                assert held[name] <= shares[name], (name, held[name], shares[name])
                threads += sum(w["threads"] for w in workers)
            assert threads <= usable, (held, threads)
            if not shares["a"] & shares["b"]:  # disjoint shares: no CPU held by both
                assert not held["a"] & held["b"], held

        check_cores(shares)
        # Each model answers its own, over ZeroMQ and over the Open Inference Protocol.
        with Client(a) as client_a, Client(b) as client_b:
            np.testing.assert_allclose(client_a.infer(x_mlp), reference("builtin:tiny-mlp", x_mlp), rtol=1e-5)
            np.testing.assert_allclose(client_b.infer(x_cnn), reference("builtin:tiny-cnn", x_cnn), rtol=1e-5)
            with pytest.raises(BadRequest):
                client_b.infer(x_mlp)  # the other model's input: refused, never answered by the wrong model
        np.testing.assert_allclose(oip_infer(a_http, "mlp", x_mlp), reference("builtin:tiny-mlp", x_mlp), rtol=1e-5)
        np.testing.assert_allclose(oip_infer(b_http, "cnn", x_cnn), reference("builtin:tiny-cnn", x_cnn), rtol=1e-5)

        # A bad assign is refused, typed, and names what to do; nothing changes.
        a_control = f"ipc://{a_run}/control.ipc"
        with pytest.raises(TopologyError, match=r"CPU\(s\) 4096 are not usable here.*Give a subset"):
            request(a_control, {"op": "assign", "cpus": [0, 4096]}, 10)
        with pytest.raises(ControlError, match="'cpus' is empty: give this model at least one usable CPU"):
            request(a_control, {"op": "assign", "cpus": []}, 10)
        too_big = {"policy": "fixed", "instances": [{"threads": 2, "batch": 1}], "reason": "too big"}
        with pytest.raises(PolicyError, match="does not fit the 1 core.*assign more CPUs or a plan of fewer threads"):
            request(a_control, {"op": "assign", "cpus": [0], "plan": too_big}, 10)
        check_cores(shares)

        # a is killed; b serves the whole time and gives a's first share up for its restart; a comes back (as
        # systemd's Restart= would start it) and the coordinator gives it that share.
        with Sender(b, x_cnn) as sender:
            time.sleep(0.5)
            a_process.send_signal(signal.SIGKILL)
            a_process.wait(10)
            down = lambda: any(m["name"] == "a" and not m["up"] for m in read_status(status).get("models", []))  # noqa: E731
            wait_for("the coordinator sees a down", down)
            with running_daemon(private(tmp_path / "a2"), *a_args) as (a_again, _):
                wait_for("a's share given back", lambda: assigned_by_coordinator(a_again))
                time.sleep(0.5)
                with Client(a_again) as client_a:
                    np.testing.assert_allclose(client_a.infer(x_mlp), reference("builtin:tiny-mlp", x_mlp), rtol=1e-5)
                a = a_again
                check_cores({"a": {0}, "b": {1}})
                models = {m["name"]: m for m in read_status(status)["models"]}
                assert models["a"]["up"] and models["a"]["cpus"] == "0" and models["b"]["cpus"] == "1"
        assert sender.failed == [] and sender.ok > 0, sender.failed[:3]


EMULATED = ("--model", "builtin:tiny-mlp", "--runtime", "emulated", "--emulate-cores", "4",
            "--emulate-interference", "none", "--max-batch", "4", "--split-check-rounds", "0")  # fmt: skip
PROFILES = {"a": "bench/profiles/inception3-cloudlab16.csv", "b": "bench/profiles/bert-cloudlab16.csv"}


def test_with_one_model_busy_every_model_is_served_on_all_cores_with_no_failed_request(tmp_path: Path) -> None:
    runs = {name: private(tmp_path / name / "run") for name in "ab"}
    metrics_port = free_port()
    a_args = (*EMULATED, "--profile", str(REPO / PROFILES["a"]), "--run-dir", str(runs["a"]), "--cpus", "0-1",
              "--metrics-port", str(metrics_port))  # fmt: skip
    b_args = (*EMULATED, "--profile", str(REPO / PROFILES["b"]), "--run-dir", str(runs["b"]), "--cpus", "2-3")
    with (
        daemons((tmp_path / "a", a_args), (tmp_path / "b", b_args)) as [(a, _), (b, _)],
        coordinator(tmp_path, "--emulate-cores", "4", "--daemon", f"a={runs['a']}", "--daemon", f"b={runs['b']}",
                    "--interval", "0.5", "--min-gain", "0.05") as status,
    ):  # fmt: skip
        wait_for("both shares assigned", lambda: assigned_by_coordinator(a) and assigned_by_coordinator(b))
        # Only a has traffic: no collision to fear, so every model is served on all the cores (the safe default).
        with Sender(a, np.zeros((1, 16), np.float32), clients=6) as sender:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                if len(status_of(b)["share"]["cpu_ids"]) == 4 and len(status_of(a)["share"]["cpu_ids"]) == 4:
                    break
                time.sleep(0.2)
            time.sleep(1.0)  # and a little while after the move
        assert sender.failed == [] and sender.ok > 0, sender.failed[:3]
        final_a, final_b = status_of(a), status_of(b)
        assert final_a["share"]["cpus"] == "0-3" and final_b["share"]["cpus"] == "0-3", (final_a["share"], final_b)
        move = final_a["share"]["last_move"]
        # Its share from the start (every core), not a move of the joint plan's: collisions stay rare, so it holds.
        assert move["from"] == "0-1" and move["to"] == "0-3" and move["reason"] == "coordinator: its share"
        coordinated = read_status(status)
        assert coordinated["moves"] == [] and coordinated["split"] == {"a": 4, "b": 4}
        assert coordinated["serving"]["mode"] == "every" and "every model on all cores" in coordinated["serving"]["why"]
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).read().decode()
        assert "packrat_assigned_cores 4.0" in metrics
        assert "packrat_share_moves_total 1.0" in metrics  # 0-1 (its --cpus, the coordinator's first share) to 0-3
