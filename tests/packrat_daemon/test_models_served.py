"""The models a user has, served by a real daemon: an ONNX file on ONNX Runtime and on OpenVINO, a Hugging Face
save_pretrained folder checked against transformers' own output, and a model that returns a dict of two
outputs (its first is served, and the log says so). Several named inputs and outputs are not served yet
(docs/serving.md, 'Inputs and outputs'): the BERT folder is served its input_ids."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from packrat_daemon.wire.client import Client
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
        x = np.random.default_rng(8).standard_normal((3, onnx_models.FEATURES), dtype=np.float32)
        np.testing.assert_allclose(client.infer(x), onnx_models.scores(x), rtol=1e-4, atol=1e-5)
    log = (tmp_path / "daemon.log").read_text()
    assert "has 2 outputs (scores, probabilities); serving the first, 'scores', only" in log


@pytest.mark.slow
def test_torch_is_refused_an_onnx_file_before_anything_loads(tmp_path: Path) -> None:
    path = onnx_models.two_outputs(tmp_path / "two.onnx")
    command = [sys.executable, "-m", "packrat_daemon", "serve", "--model", str(path), "--runtime", "torch",
               "--endpoint", f"ipc://{tmp_path}/f.ipc", *QUICK]  # fmt: skip
    done = subprocess.run(command, env=daemon_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert f"runtime torch cannot load {path}: it is served by onnxruntime or openvino" in done.stderr
    assert "loading" not in done.stderr


@pytest.mark.slow
def test_a_hugging_face_folder_is_served_as_transformers_computes_it(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(1)
    config = transformers.BertConfig(vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=64, max_position_embeddings=32, num_labels=3)  # fmt: skip
    folder = tmp_path / "tiny-bert"
    transformers.BertForSequenceClassification(config).save_pretrained(folder)
    ids = np.random.default_rng(9).integers(0, 120, (3, 32)).astype(np.int64)
    model = transformers.BertForSequenceClassification.from_pretrained(folder, local_files_only=True).eval()
    with torch.inference_mode():
        expected = model(input_ids=torch.from_numpy(ids)).logits.numpy()  # attention_mask: all ones, the default
    serving = running_daemon(tmp_path, "--model", f"hf:{folder}", *QUICK)
    with serving as (endpoint, _), Client(endpoint, timeout=60) as client:
        assert client.info()["input"] == {"dtype": "int64", "shape": [32], "high": 120}
        np.testing.assert_allclose(client.infer(ids), expected, rtol=1e-5, atol=1e-6)
    log = (tmp_path / "daemon.log").read_text()
    assert "is served its input_ids only; attention_mask (all ones: every token attended)" in log


@pytest.mark.slow
def test_a_model_returning_a_dict_of_two_outputs_is_served_its_first(tmp_path: Path) -> None:
    from tests.model_factories import TwoOutputs

    spec = "tests.model_factories:two_outputs"
    x = np.random.default_rng(10).standard_normal((4, 16), dtype=np.float32)
    with torch.inference_mode():
        expected = TwoOutputs()(torch.from_numpy(x))["scores"].numpy()
    with running_daemon(tmp_path, "--model", spec, *QUICK) as (endpoint, _), Client(endpoint, timeout=60) as client:
        np.testing.assert_allclose(client.infer(x), expected, rtol=1e-5, atol=1e-6)
    log = (tmp_path / "daemon.log").read_text()
    assert f"{spec} returns 2 outputs ('scores', 'probabilities'); serving 'scores' only" in log
    assert "died" not in log
