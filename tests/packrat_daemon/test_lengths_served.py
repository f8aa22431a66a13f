"""Text as it arrives (issue 40): a model's free sequence axis served by a real daemon with real workers, requests of
many lengths batched together, each answered what the model computes on that request alone, unpadded.

- A Hugging Face folder (BERT, three inputs, a per-token output and a pooled one), through the ZeroMQ client and
  the Open Inference Protocol (Triton's own HTTP and gRPC clients), against transformers.
- An ONNX BERT exported with a free sequence axis, on ONNX Runtime, against ONNX Runtime on the unpadded request.
- What is refused: a sequence past the longest, inputs of different lengths.
"""

from __future__ import annotations

import concurrent.futures
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from packrat_daemon.wire.client import BadRequest, Client
from tests.helpers.daemons import running_daemon
from tests.packrat_daemon.test_models_served import free_port

transformers = pytest.importorskip("transformers")

LONGEST = 32
LENGTHS = [3, 17, 32, 5, 9, 30, 1, 12, 24, 7]  # batched together: max_delay holds each batch for company
# Two instances, so that a batch is cut across them by cost, and a delay long enough for the requests to meet.
TWO_INSTANCES = ("--policy", "fixed", "--plan", "2*1x1", "--max-batch", "8", "--max-delay-ms", "200")
TOLERANCE = {"rtol": 1e-4, "atol": 1e-5}  # float32 reordering of the padded batch; padding alone would be ~1e-1


def bert(seed: int = 1) -> Any:
    torch.manual_seed(seed)
    config = transformers.BertConfig(vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=64, max_position_embeddings=LONGEST)  # fmt: skip
    return transformers.BertModel(config).eval()


def sequence(length: int, seed: int) -> dict[str, np.ndarray]:
    """One request: a sequence of `length` token ids, its mask all ones (no padding of its own), two segments."""
    ids = np.random.default_rng(seed).integers(0, 120, (1, length)).astype(np.int64)
    segments = np.zeros_like(ids)
    segments[:, length // 2 :] = 1
    return {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": segments}


def reference(model: Any, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    with torch.inference_mode():
        out = model(**{name: torch.from_numpy(array) for name, array in inputs.items()})
    return {"last_hidden_state": out.last_hidden_state.numpy(), "pooler_output": out.pooler_output.numpy()}


def at_once(endpoint: str, requests: list[dict[str, np.ndarray]]) -> list[Any]:
    """Every request sent at the same moment, each on its own connection: they share batches."""

    def one(inputs: dict[str, np.ndarray]) -> Any:
        with Client(endpoint, timeout=120) as client:
            return client.infer(inputs)

    with concurrent.futures.ThreadPoolExecutor(len(requests)) as pool:
        return list(pool.map(one, requests))


@pytest.mark.slow
def test_a_hugging_face_folder_answers_every_length_as_transformers_does_unpadded(tmp_path: Path) -> None:
    model = bert()
    folder = tmp_path / "bert"
    model.save_pretrained(folder)
    requests = [sequence(length, seed) for seed, length in enumerate(LENGTHS)]
    # Padding without the mask would change the answer far beyond the tolerance: the test can tell.
    padded = {name: np.pad(array, ((0, 0), (0, 8))) for name, array in requests[0].items()}
    padded["attention_mask"][:, -8:] = 1
    assert (
        np.abs(reference(model, padded)["pooler_output"] - reference(model, requests[0])["pooler_output"]).max() > 1e-3
    )
    http_port, grpc_port = free_port(), free_port()
    oip = ("--http-port", str(http_port), "--grpc-port", str(grpc_port))
    with running_daemon(tmp_path, "--model", f"hf:{folder}", *TWO_INSTANCES, *oip) as (endpoint, _):
        with Client(endpoint, timeout=60) as client:
            info = client.info()
        assert [(t["name"], t["shape"], t["max_length"]) for t in info["inputs"]] == [
            (name, [-1], LONGEST) for name in ("input_ids", "attention_mask", "token_type_ids")
        ]
        assert [(t["name"], t["shape"]) for t in info["outputs"]] == [("last_hidden_state", [-1, 32]),
                                                                       ("pooler_output", [32])]  # fmt: skip
        for inputs, answer in zip(requests, at_once(endpoint, requests), strict=True):
            expected = reference(model, inputs)
            length = inputs["input_ids"].shape[1]
            assert answer["last_hidden_state"].shape == (1, length, 32)  # its own length, not the batch's
            for name in expected:
                np.testing.assert_allclose(answer[name], expected[name], **TOLERANCE)
        over_oip(http_port, grpc_port, model, requests[:4])
        with Client(endpoint, timeout=60) as client:
            tokens = client.status()["traffic"]["tokens"]  # lengths and padding, since start
            # Through ZeroMQ, then OIP's HTTP and gRPC, and the gateway's probe at the shortest length (1 token): one,
            # or more where a probe timed out on a busy machine and was asked again.
            probes = tokens["sequences"] - len(LENGTHS) - 8
            real = sum(LENGTHS) + sum(LENGTHS[:4]) * 2 + probes
            assert probes >= 1 and tokens["real_tokens"] == real
            # Each slice padded to its own longest: less than padding every request to the model's longest.
            assert real <= tokens["padded_tokens"] < LONGEST * tokens["sequences"]
            too_long = sequence(LONGEST + 1, 0)
            with pytest.raises(BadRequest, match=r"axis 1 is 33 long; the model takes 1 to 32 there"):
                client.infer(too_long)
            uneven = {**sequence(5, 0), "token_type_ids": np.zeros((1, 6), np.int64)}
            with pytest.raises(BadRequest, match=r"sequences must be of one length; got .*token_type_ids 6"):
                client.infer(uneven)
    log = (tmp_path / "daemon.log").read_text()
    assert "died" not in log and "failed a batch" not in log


def over_oip(http_port: int, grpc_port: int, model: Any, requests: list[dict[str, np.ndarray]]) -> None:
    """Triton's own clients see the free axis as -1 and get each length's own answer."""
    grpcclient = pytest.importorskip("tritonclient.grpc")
    httpclient = pytest.importorskip("tritonclient.http")
    http = httpclient.InferenceServerClient(f"127.0.0.1:{http_port}")
    rpc = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}")
    try:
        deadline = time.monotonic() + 60.0  # the gateway finds the daemon serving on its own probe, after `info`
        while not http.is_server_ready():
            assert time.monotonic() < deadline, "the gateway never said ready"
            time.sleep(0.2)
        metadata = http.get_model_metadata("bert")
        assert [(t["name"], t["shape"]) for t in metadata["inputs"]][0] == ("input_ids", [-1, -1])
        assert [(t["name"], t["shape"]) for t in metadata["outputs"]][0] == ("last_hidden_state", [-1, -1, 32])
        for client, module in ((http, httpclient), (rpc, grpcclient)):
            for inputs in requests:
                tensors = []
                for name, array in inputs.items():
                    tensor = module.InferInput(name, list(array.shape), "INT64")
                    tensor.set_data_from_numpy(array)
                    tensors.append(tensor)
                answer = client.infer("bert", tensors)
                expected = reference(model, inputs)
                np.testing.assert_allclose(answer.as_numpy("last_hidden_state"), expected["last_hidden_state"],
                                           **TOLERANCE)  # fmt: skip
    finally:
        http.close()
        rpc.close()


class _Named(torch.nn.Module):
    def __init__(self, model: Any) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor) -> Any:
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
        return out.last_hidden_state, out.pooler_output


@pytest.mark.slow
def test_an_onnx_bert_with_a_free_sequence_axis_answers_every_length_as_onnx_runtime_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    onnxruntime = pytest.importorskip("onnxruntime")
    monkeypatch.setenv("PACKRAT_CACHE_DIR", str(tmp_path / "cache"))
    path = tmp_path / "bert.onnx"
    sample = sequence(16, 0)
    dims = {0: torch.export.Dim("batch"), 1: torch.export.Dim("sequence", max=LONGEST)}
    example = tuple(torch.from_numpy(a).repeat(2, 1) for a in sample.values())
    torch.onnx.export(_Named(bert(2)).eval(), example, str(path),
                      dynamo=True, input_names=list(sample), output_names=["last_hidden_state", "pooler_output"],
                      dynamic_shapes=(dims, dims, dims))  # fmt: skip
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    requests = [sequence(length, seed) for seed, length in enumerate(LENGTHS)]
    args = ("--model", str(path), "--runtime", "onnxruntime", "--input", f"int64:1..{LONGEST}")
    with running_daemon(tmp_path, *args, *TWO_INSTANCES, timeout=300) as (endpoint, _):
        for inputs, answer in zip(requests, at_once(endpoint, requests), strict=True):
            hidden, pooled = session.run(None, inputs)
            np.testing.assert_allclose(answer["last_hidden_state"], hidden, **TOLERANCE)
            np.testing.assert_allclose(answer["pooler_output"], pooled, **TOLERANCE)
    log = (tmp_path / "daemon.log").read_text()
    assert "died" not in log and "failed a batch" not in log
