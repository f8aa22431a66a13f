"""`packrat serve --repository` with real daemons on real sockets and Triton's own clients: a repository of three
models (an ONNX file in Triton's layout with a config.pbtxt, a Hugging Face folder, a .pt2 listed in
repository.toml) served by one command; tritonclient HTTP and gRPC see all three on one port each, the index lists
them, a killed model daemon leaves the other two serving with no failed request and comes back, and models
unloaded and loaded at run time give their cores to the others and take them back (`packrat status`)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest

from tests.helpers import onnx_models, repository_models
from tests.helpers.daemons import PINNED_ARGS, daemon_env, stop_process

pytestmark = pytest.mark.slow
httpclient = pytest.importorskip("tritonclient.http")
grpcclient = pytest.importorskip("tritonclient.grpc")


def free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def wait_for(what: str, check: Callable[[], bool], timeout: float, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if check():
                return
        except Exception:  # not listening yet, or the model is between two states
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:.0f} s\n{log.read_text()[-6000:]}")
        time.sleep(0.2)


class Served:
    """The repository's process, its ports and clients."""

    def __init__(self, process: subprocess.Popen[bytes], run_dir: Path, log: Path, http: int, grpc: int) -> None:
        self.process, self.run_dir, self.log = process, run_dir, log
        self.http = httpclient.InferenceServerClient(f"127.0.0.1:{http}")
        self.grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc}")
        self.http_port = http

    def index(self) -> dict[str, str]:
        return {entry["name"]: entry["state"] for entry in self.http.get_model_repository_index()}

    def daemon_pid(self, name: str) -> int:
        config = str(self.run_dir / "models" / name / "serve.toml")
        for child in psutil.Process(self.process.pid).children():
            if config in child.cmdline():
                return int(child.pid)
        raise AssertionError(f"no daemon of {name} among {psutil.Process(self.process.pid).children()}")

    def endpoint(self, name: str) -> str:
        return f"ipc://{self.run_dir / 'models' / name / 'front.ipc'}"


def start_repository(tmp: Path) -> Served:
    """`packrat serve --repository` of the three models under `tmp`, started (not yet ready)."""
    root = repository_models.build(tmp / "models")
    run_dir = tmp / "run"
    run_dir.mkdir(mode=0o700)
    http, grpc = free_port(), free_port()
    log = tmp / "repository.log"
    command = [sys.executable, "-m", "packrat_daemon", "serve", "--repository", str(root), "--http-port", str(http),
               "--grpc-port", str(grpc), "--run-dir", str(run_dir), *PINNED_ARGS]  # fmt: skip
    env = daemon_env()
    env["PACKRAT_CACHE_DIR"] = str(tmp / "cache")
    with open(log, "wb") as out:
        process = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)
    return Served(process, run_dir, log, http, grpc)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """One repository served for the module's tests (its start loads three daemons: seconds each)."""
    serving = start_repository(tmp_path_factory.mktemp("repository"))
    process, log, run_dir = serving.process, serving.log, serving.run_dir
    try:
        wait_for("the repository ready", lambda: serving.http.is_server_ready(), 120, log)
        yield serving
    finally:
        stop_process(process, 60)
        serving.http.close()
        serving.grpc.close()
    assert process.returncode == 0, log.read_text()[-6000:]
    # Every daemon drained and stopped with the repository: none is left behind.
    assert not [p for p in psutil.process_iter(["cmdline"]) if str(run_dir) in " ".join(p.info["cmdline"] or [])]


def infer(client: Any, module: Any, name: str, samples: int = 2) -> dict[str, np.ndarray]:
    tensors = []
    for tensor_name, array in repository_models.inputs(name, samples).items():
        tensor = module.InferInput(tensor_name, list(array.shape), "INT64" if array.dtype == np.int64 else "FP32")
        tensor.set_data_from_numpy(array)
        tensors.append(tensor)
    result = client.infer(name, tensors)
    outputs = {"linear": ("scores",), "doubler": ("output",), "bert": ("logits",)}[name]
    return {output: result.as_numpy(output) for output in outputs}


def check_answers(client: Any, module: Any) -> None:
    linear = repository_models.inputs("linear")["x"]
    np.testing.assert_allclose(infer(client, module, "linear")["scores"], onnx_models.scores(linear), rtol=1e-4,
                               atol=1e-5)  # fmt: skip
    doubled = infer(client, module, "doubler")["output"]
    np.testing.assert_allclose(doubled, repository_models.inputs("doubler")["input"] * 2 + 1, rtol=1e-6)
    assert infer(client, module, "bert")["logits"].shape == (2, 3)


def test_triton_clients_see_the_three_models_on_one_port_each(served: Served) -> None:
    assert served.index() == dict.fromkeys(repository_models.NAMES, "READY")
    grpc_index = served.grpc.get_model_repository_index(as_json=True)["models"]
    assert [(m["name"], m["state"]) for m in grpc_index] == [(name, "READY") for name in repository_models.NAMES]
    assert "model_repository" in served.http.get_server_metadata()["extensions"]
    for client, module in ((served.http, httpclient), (served.grpc, grpcclient)):
        for name in repository_models.NAMES:
            assert client.is_model_ready(name)
        check_answers(client, module)
    # Each model under its own name and runtime; config.pbtxt's max_batch_size read.
    assert served.http.get_model_metadata("linear")["platform"] == "packrat_onnxruntime"
    assert served.http.get_model_config("linear")["max_batch_size"] == 4
    assert [t["name"] for t in served.http.get_model_metadata("bert")["inputs"]] == [
        "input_ids", "attention_mask", "token_type_ids"]  # fmt: skip
    stats = served.http.get_inference_statistics()["model_stats"]
    assert {s["name"] for s in stats} == set(repository_models.NAMES) and all(s["inference_count"] >= 4 for s in stats)
    with pytest.raises(Exception, match="unknown model 'resnet'; this server serves bert, doubler, linear"):
        served.http.get_model_metadata("resnet")
    metrics = served.http._get("metrics", None, None).read().decode()  # the one metrics endpoint
    assert 'packrat_repository_model_ready{model="bert"} 1.0' in metrics
    assert 'packrat_repository_inferences_total{model="linear",outcome="success"}' in metrics
    text = served.log.read_text()
    assert "config.pbtxt's instance_group left out: Packrat plans its instances" in text


class Senders:
    """Closed-loop clients on some models through the one gateway, counting answers and failures."""

    def __init__(self, port: int, names: tuple[str, ...]) -> None:
        self.answered = dict.fromkeys(names, 0)
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._send, args=(port, name), daemon=True) for name in names]

    def _send(self, port: int, name: str) -> None:
        client = httpclient.InferenceServerClient(f"127.0.0.1:{port}")
        try:
            while not self._stop.is_set():
                try:
                    infer(client, httpclient, name, 1)
                    self.answered[name] += 1
                except Exception as exc:
                    self.failures.append(f"{name}: {exc}")
        finally:
            client.close()

    def __enter__(self) -> Senders:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(30)


def test_a_killed_model_daemon_leaves_the_others_serving_then_comes_back(served: Served) -> None:
    pid = served.daemon_pid("bert")
    with Senders(served.http_port, ("linear", "doubler")) as senders:
        time.sleep(1.0)
        os.kill(pid, signal.SIGKILL)
        wait_for("bert not ready", lambda: not served.http.is_model_ready("bert"), 20, served.log)
        wait_for("bert restarted", lambda: served.daemon_pid("bert") != pid, 20, served.log)
        wait_for("bert serving again", lambda: served.index()["bert"] == "READY", 90, served.log)
        before = dict(senders.answered)
        time.sleep(1.0)
    assert senders.failures == []
    assert all(count > 0 for count in before.values()) and senders.answered != before
    assert infer(served.grpc, grpcclient, "bert")["logits"].shape == (2, 3)
    assert "model bert: its daemon exited (code -9); the other models serve on" in served.log.read_text()


def share_of(served: Served, name: str) -> str:
    """The `share:` line `packrat status` prints for the model's daemon, through its own ZeroMQ endpoint."""
    done = subprocess.run([sys.executable, "-m", "packrat_daemon", "status", "--endpoint", served.endpoint(name)],
                          capture_output=True, text=True, timeout=60, env=daemon_env())  # fmt: skip
    assert done.returncode == 0, done.stderr
    return next(line.strip() for line in done.stdout.splitlines() if line.strip().startswith("share:"))


def joint_models(served: Served) -> list[str]:
    """The models the joint plan's status file lists (the coordinator's loop over the models loaded)."""
    status = json.loads((served.run_dir / "coordinator.json").read_text())
    return [model["name"] for model in status["models"] if model["up"]]


def test_unload_and_load_at_run_time_move_cores_through_the_joint_plan(served: Served) -> None:
    every = f"CPUs {'0' if os.cpu_count() == 1 else f'0-{len(os.sched_getaffinity(0)) - 1}'}"
    served.grpc.unload_model("doubler")
    assert served.index()["doubler"] == "UNLOADED"
    with pytest.raises(Exception, match="unknown model 'doubler'"):
        infer(served.grpc, grpcclient, "doubler")
    # Two models on two cores: the coordinator's loop runs over those two (one core each, or both on all the
    # cores, as its strategy starts while the traffic asks for no split).
    wait_for("the joint plan over bert and linear", lambda: joint_models(served) == ["bert", "linear"], 30, served.log)
    two = share_of(served, "linear")
    assert two.startswith(("share: CPUs 0 ", "share: CPUs 1 ", f"share: {every} ")), two
    served.http.unload_model("bert")
    assert served.index() == {"bert": "UNLOADED", "linear": "READY", "doubler": "UNLOADED"}
    # The one model left holds every core: the joint plan's status says so, and so does `packrat status`.
    wait_for("the joint plan over linear alone", lambda: joint_models(served) == ["linear"], 30, served.log)
    wait_for("linear on every core", lambda: share_of(served, "linear").startswith(f"share: {every} "), 30,
             served.log)  # fmt: skip
    assert "assigned by" in share_of(served, "linear")
    assert infer(served.http, httpclient, "linear")["scores"].shape == (2, onnx_models.CLASSES)
    served.http.load_model("bert")
    served.grpc.load_model("doubler")
    assert served.index() == dict.fromkeys(repository_models.NAMES, "READY")
    check_answers(served.grpc, grpcclient)
    wait_for("bert told its CPUs", lambda: "assigned by" in share_of(served, "bert"), 30, served.log)
    with pytest.raises(Exception, match="the repository has no model 'resnet'"):
        served.http.load_model("resnet")


def test_the_model_daemons_end_with_a_killed_repository(tmp_path: Path) -> None:
    """SIGKILL leaves the repository no chance to stop its daemons: each asked the kernel to end it with its parent
    (`repository.daemons.follow_parent`), so none is left serving a model nobody routes to."""
    serving = start_repository(tmp_path)
    process, log = serving.process, serving.log
    try:
        wait_for("the repository ready", lambda: serving.http.is_server_ready(), 120, log)
        daemons = [psutil.Process(serving.daemon_pid(name)) for name in repository_models.NAMES]
        process.kill()
        process.wait(10)
        _, alive = psutil.wait_procs(daemons, timeout=30)
        assert not alive, f"daemons outlived their repository: {alive}\n{log.read_text()[-3000:]}"
    finally:
        if process.poll() is None:
            process.kill()
        serving.http.close()
        serving.grpc.close()
