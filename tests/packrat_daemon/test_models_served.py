"""The models a user has, served by a real daemon: an ONNX file on ONNX Runtime and on OpenVINO (both outputs,
named), a Hugging Face save_pretrained folder served its three inputs by name and checked against transformers'
own output, a model that returns a dict of two outputs (both answered, named), and a raw version-1 message, as
a client written from the old docs/protocol.md sends it, answered as it always was."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import zmq

from packrat_daemon.wire.client import BadRequest, Client
from tests.helpers import onnx_models
from tests.helpers.daemons import daemon_env, running_daemon

# One 2-thread instance, planned without a profile: the start-up measures nothing.
QUICK = ("--policy", "single", "--max-batch", "4")


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setenv("PACKRAT_CACHE_DIR", str(tmp_path / "cache"))  # the daemon (daemon_env) inherits it
    yield tmp_path / "cache"


@pytest.mark.slow
@pytest.mark.parametrize("runtime", ["onnxruntime", "openvino"])
def test_an_onnx_file_is_served_by_each_runtime(tmp_path: Path, cache: Path, runtime: str) -> None:
    pytest.importorskip(runtime)
    path = onnx_models.two_outputs(tmp_path / "two.onnx")
    serving = running_daemon(tmp_path, "--model", str(path), "--runtime", runtime, *QUICK, timeout=300)
    with serving as (endpoint, _), Client(endpoint, timeout=60) as client:
        info = client.info()
        assert (info["runtime"], info["input"]["dtype"], info["input"]["shape"]) == (runtime, "float32", [16])
        assert [t["name"] for t in info["inputs"]] == ["x"]
        assert [t["name"] for t in info["outputs"]] == ["scores", "probabilities"]
        x = np.random.default_rng(8).standard_normal((3, onnx_models.FEATURES), dtype=np.float32)
        np.testing.assert_allclose(client.infer(x), onnx_models.scores(x), rtol=1e-4, atol=1e-5)  # version 1: first
        both = client.infer({"x": x})
        assert isinstance(both, dict)
        np.testing.assert_allclose(both["scores"], onnx_models.scores(x), rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(both["probabilities"].sum(axis=1), 1.0, rtol=1e-5)
    assert "died" not in (tmp_path / "daemon.log").read_text()


@pytest.mark.slow
def test_torch_is_refused_an_onnx_file_before_anything_loads(tmp_path: Path) -> None:
    path = onnx_models.two_outputs(tmp_path / "two.onnx")
    command = [sys.executable, "-m", "packrat_daemon", "serve", "--model", str(path), "--runtime", "torch",
               "--endpoint", f"ipc://{tmp_path}/f.ipc", *QUICK]  # fmt: skip
    done = subprocess.run(command, env=daemon_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert f"runtime torch cannot load {path}: it is served by onnxruntime or openvino" in done.stderr
    assert "loading" not in done.stderr


def tiny_bert_folder(folder: Path) -> Path:
    """A save_pretrained folder of a 2-layer BERT classifier with random weights, its config built by hand."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(1)
    config = transformers.BertConfig(vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=64, max_position_embeddings=32, num_labels=3)  # fmt: skip
    transformers.BertForSequenceClassification(config).save_pretrained(folder)
    return folder


def padded_pairs(samples: int) -> dict[str, np.ndarray]:
    """What a tokenizer gives for pairs of sentences, padded to 32: each row its own length, two segments."""
    rng = np.random.default_rng(9)
    mask = np.ones((samples, 32), dtype=np.int64)
    for k in range(samples):
        mask[k, 20 + 4 * k :] = 0
    segments = np.zeros((samples, 32), dtype=np.int64)
    segments[:, 10:] = 1
    ids = rng.integers(0, 120, (samples, 32)).astype(np.int64) * mask
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": segments}


def transformers_logits(folder: Path, inputs: dict[str, np.ndarray]) -> np.ndarray:
    transformers = pytest.importorskip("transformers")
    model = transformers.BertForSequenceClassification.from_pretrained(folder, local_files_only=True).eval()
    with torch.inference_mode():
        return model(**{name: torch.from_numpy(array) for name, array in inputs.items()}).logits.numpy()


def raw_request(endpoint: str, frames: list[bytes]) -> tuple[dict, list[bytes]]:
    """One message on a bare DEALER, as a client written from docs/protocol.md sends it; the reply's frames."""
    socket = zmq.Context.instance().socket(zmq.DEALER)
    socket.setsockopt(zmq.LINGER, 0)
    socket.setsockopt(zmq.RCVTIMEO, 60_000)
    try:
        socket.connect(endpoint)
        socket.send_multipart(frames)
        reply = socket.recv_multipart()
    finally:
        socket.close()
    return json.loads(reply[0]), reply[1:]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def check_over_oip(http_port: int, grpc_port: int, inputs: dict[str, np.ndarray], expected: np.ndarray) -> None:
    """The Open Inference Protocol gateway in front of the daemon: the model's metadata lists its three inputs by
    name, and Triton's own clients (HTTP and gRPC) get transformers' logits for them."""
    grpcclient = pytest.importorskip("tritonclient.grpc")
    httpclient = pytest.importorskip("tritonclient.http")
    http = httpclient.InferenceServerClient(f"127.0.0.1:{http_port}")
    rpc = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}")
    try:
        deadline = time.monotonic() + 60
        while not _ready(http):
            assert time.monotonic() < deadline, "the gateway did not become ready"
            time.sleep(0.2)
        metadata = http.get_model_metadata("tiny-bert")
        assert [(t["name"], t["datatype"], t["shape"]) for t in metadata["inputs"]] == [
            (name, "INT64", [-1, -1])
            for name in ("input_ids", "attention_mask", "token_type_ids")  # free: up to 32
        ]
        assert [(t["name"], t["shape"]) for t in metadata["outputs"]] == [("logits", [-1, 3])]
        for client, module in ((http, httpclient), (rpc, grpcclient)):
            tensors = []
            for name, array in inputs.items():
                tensor = module.InferInput(name, list(array.shape), "INT64")
                tensor.set_data_from_numpy(array)
                tensors.append(tensor)
            answer = client.infer("tiny-bert", tensors)
            np.testing.assert_allclose(answer.as_numpy("logits"), expected, rtol=1e-5, atol=1e-6)
        missing = []
        for name, array in list(inputs.items())[:2]:
            tensor = httpclient.InferInput(name, list(array.shape), "INT64")
            tensor.set_data_from_numpy(array)
            missing.append(tensor)
        with pytest.raises(Exception, match="input 'token_type_ids' is missing"):
            http.infer("tiny-bert", missing)
    finally:
        http.close()
        rpc.close()


def _ready(http: Any) -> bool:
    try:
        return bool(http.is_model_ready("tiny-bert"))
    except Exception:  # not listening yet
        return False


@pytest.mark.slow
def test_a_hugging_face_folder_is_served_its_three_inputs_as_transformers_computes_them(tmp_path: Path) -> None:
    folder = tiny_bert_folder(tmp_path / "tiny-bert")
    inputs = padded_pairs(3)
    expected = transformers_logits(folder, inputs)
    unmasked = transformers_logits(folder, {"input_ids": inputs["input_ids"]})
    assert np.abs(expected - unmasked).max() > 1e-5  # far beyond the tolerance below: the mask and segments count
    http_port, grpc_port = free_port(), free_port()
    oip = ("--http-port", str(http_port), "--grpc-port", str(grpc_port))
    serving = running_daemon(tmp_path, "--model", f"hf:{folder}", *QUICK, *oip)
    with serving as (endpoint, _), Client(endpoint, timeout=60) as client:
        check_over_oip(http_port, grpc_port, inputs, expected)
        info = client.info()
        assert [(t["name"], t["dtype"], t["shape"], t["high"], t["max_length"]) for t in info["inputs"]] == [
            ("input_ids", "int64", [-1], 120, 32),
            ("attention_mask", "int64", [-1], 2, 32),
            ("token_type_ids", "int64", [-1], 2, 32),
        ]
        assert info["outputs"] == [{"name": "logits", "dtype": "float32", "shape": [3]}]
        np.testing.assert_allclose(client.infer(inputs), expected, rtol=1e-5, atol=1e-6)
        # Refused, each with what to fix: a wrong name, a missing input, a version-1 request of one tensor.
        with pytest.raises(BadRequest, match="unknown input 'token_types'; the model takes input_ids, attention_m"):
            client.infer({**inputs, "token_types": inputs.pop("token_type_ids")})
        with pytest.raises(BadRequest, match="input 'token_type_ids' is missing; the model takes input_ids, atten"):
            client.infer(inputs)
        with pytest.raises(BadRequest, match=r"takes 3 inputs .*: pass a dict of arrays, one per input"):
            client.infer(inputs["input_ids"])
        # Mismatched batch sizes across inputs (the client refuses to send them, so sent raw).
        entries = [{"name": name, "dtype": "int64", "shape": [3 - (name == "attention_mask"), 32]}
                   for name in ("input_ids", "attention_mask", "token_type_ids")]  # fmt: skip
        header = json.dumps({"v": 2, "id": "m", "op": "infer", "inputs": entries}).encode()
        payloads = [np.zeros(entry["shape"], np.int64).tobytes() for entry in entries]
        reply, frames = raw_request(endpoint, [header, *payloads])
        assert (reply["id"], reply["ok"], reply["error"]["code"], frames) == ("m", False, "BAD_REQUEST", [])
        assert (
            "different numbers of samples (input_ids 3, attention_mask 2, token_type_ids 3)"
            in (reply["error"]["message"])
        )
    assert "died" not in (tmp_path / "daemon.log").read_text()


@pytest.mark.slow
def test_a_model_returning_a_dict_of_two_outputs_answers_both_named(tmp_path: Path) -> None:
    from tests.model_factories import TwoOutputs

    spec = "tests.model_factories:two_outputs"
    x = np.random.default_rng(10).standard_normal((4, 16), dtype=np.float32)
    with torch.inference_mode():
        expected = {name: out.numpy() for name, out in TwoOutputs()(torch.from_numpy(x)).items()}
    with running_daemon(tmp_path, "--model", spec, *QUICK) as (endpoint, _), Client(endpoint, timeout=60) as client:
        assert [t["name"] for t in client.info()["outputs"]] == ["scores", "probabilities"]
        answer = client.infer({"input": x})
        assert isinstance(answer, dict) and list(answer) == ["scores", "probabilities"]
        for name, array in expected.items():
            np.testing.assert_allclose(answer[name], array, rtol=1e-5, atol=1e-6)
        # A version-1 message of one unnamed tensor, byte for byte as the old docs/protocol.md has a client send
        # it: answered as it always was, one tensor, the model's first output.
        header = b'{"v": 1, "id": 42, "op": "infer", "dtype": "float32", "shape": [4, 16]}'
        reply, frames = raw_request(endpoint, [header, x.tobytes()])
        assert {key: reply[key] for key in ("v", "id", "ok", "dtype", "shape")} == {
            "v": 1, "id": 42, "ok": True, "dtype": "float32", "shape": [4, 4]
        }  # fmt: skip
        assert set(reply["timing"]) == {"queue_ms", "compute_ms", "total_ms", "instances"}
        (payload,) = frames
        np.testing.assert_allclose(
            np.frombuffer(payload, "<f4").reshape(4, 4), expected["scores"], rtol=1e-5, atol=1e-6
        )
        np.testing.assert_allclose(client.infer(x), expected["scores"], rtol=1e-5, atol=1e-6)  # the client, version 1
    assert "died" not in (tmp_path / "daemon.log").read_text()
