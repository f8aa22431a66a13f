"""ONNX Runtime and OpenVINO behind the runtime interface: agreement with PyTorch, loads served from the
conversion cache, re-threading by a session prepared beside the serving one, and inputs they refuse.

Tolerance: elementwise rtol 1e-4, atol 1e-5 against PyTorch's output (float32 everywhere; OpenVINO is
told to infer in f32, since it would pick bfloat16 on CPUs with AVX512_BF16). The converter itself
refuses a conversion whose error exceeds 1e-5 + 1e-4 * max|output|. Each package's tests are skipped
when it is not installed; conversions are made once per test session, in the session's shared cache folder
(`shared_conversion_cache`: a built-in converted by an earlier module is a hit here).
"""

from __future__ import annotations

import functools
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from packrat_daemon.wire.errors import ConfigError
from workers.models import cache as conversion
from workers.models.loading import LoadedModel, load_model
from workers.models.spec import InputSpec, sample_input
from workers.runtimes import make_runtime
from workers.runtimes.base import SessionRuntime

RTOL, ATOL = 1e-4, 1e-5
OPTIONAL = ["onnxruntime", "openvino"]
BATCHES = (1, 2, 5, 16)  # the export's example batch is 2: the others prove the batch axis is dynamic


@pytest.fixture(scope="module")
def cache(shared_conversion_cache: Path) -> Iterator[Path]:
    folder = shared_conversion_cache
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PACKRAT_CACHE_DIR", str(folder))  # the converter subprocesses inherit it
        yield folder


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A 1-layer BERT saved with torch.export (a .pt2 file spec with a dynamic batch), for the attention ops
    (embeddings, one encoder layer, the pooler: as small as still takes BERT's path, so it converts quickly)."""
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(
        vocab_size=120, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32
    )
    torch.manual_seed(0)
    model = transformers.BertModel(config).eval()

    class Pooled(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bert = model

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return self.bert(ids).pooler_output

    example = torch.randint(0, 100, (2, 8))
    batch = torch.export.Dim("batch", min=1)
    program = torch.export.export(Pooled().eval(), (example,), dynamic_shapes=({0: batch},))
    path = tmp_path_factory.mktemp("models") / "tiny-bert.pt2"
    torch.export.save(program, str(path))
    return str(path)


_loaded: dict[tuple[str, str], SessionRuntime] = {}


def loaded(name: str, spec: str) -> SessionRuntime:
    """A runtime that has loaded `spec` (converting it once per session), without threads yet."""
    pytest.importorskip(name)
    if (name, spec) not in _loaded:
        runtime = make_runtime(name)
        assert isinstance(runtime, SessionRuntime)
        runtime.load(spec)
        _loaded[name, spec] = runtime
    return _loaded[name, spec]


@functools.cache
def reference(spec: str) -> LoadedModel:
    """PyTorch's model of `spec`, loaded once per session (a .pt2 file takes a while to load)."""
    return load_model(spec)


def torch_output(spec: str, batch: np.ndarray) -> np.ndarray:
    model = reference(spec)
    with torch.inference_mode():
        return model.module(torch.from_numpy(batch)).numpy()


def read_only(batch: np.ndarray) -> np.ndarray:
    # What a worker gets: a read-only view of a ZeroMQ frame.
    return np.frombuffer(batch.tobytes(), dtype=batch.dtype).reshape(batch.shape)


@pytest.mark.slow
@pytest.mark.parametrize("name", OPTIONAL)
@pytest.mark.parametrize("model", ["builtin:tiny-mlp", "builtin:tiny-cnn", "tiny-bert"])
def test_outputs_match_torch_at_several_batch_sizes(cache: Path, tiny_bert: str, name: str, model: str) -> None:
    spec = tiny_bert if model == "tiny-bert" else model
    runtime = loaded(name, spec)
    runtime.set_threads(1)
    for size in BATCHES:
        batch = sample_input(runtime.input, size, seed=size)
        out = runtime.run(read_only(batch))
        assert isinstance(out, np.ndarray) and out.shape[0] == size
        np.testing.assert_allclose(out, torch_output(spec, batch), rtol=RTOL, atol=ATOL)


@pytest.mark.slow
@pytest.mark.parametrize("name", OPTIONAL)
def test_load_reads_the_declared_input_from_the_cache(cache: Path, name: str) -> None:
    assert loaded(name, "builtin:tiny-cnn").input == InputSpec("float32", (3, 16, 16))


@pytest.mark.slow
@pytest.mark.parametrize("name", OPTIONAL)
def test_second_load_hits_the_cache_without_converting(cache: Path, name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    first = loaded(name, "builtin:tiny-mlp")
    assert first.path is not None
    mtime = first.path.stat().st_mtime_ns
    calls: list[str] = []
    monkeypatch.setattr(conversion, "run_converter", lambda *args: calls.append(args[0]))
    again = make_runtime(name)
    start = time.perf_counter()
    assert again.load("builtin:tiny-mlp") == first.input
    assert time.perf_counter() - start < 1.0  # a converter subprocess alone takes seconds
    assert calls == []
    assert again.path == first.path and again.path.stat().st_mtime_ns == mtime


@pytest.mark.slow
@pytest.mark.parametrize("name", OPTIONAL)
def test_prepare_threads_builds_beside_the_serving_session_and_commit_swaps(cache: Path, name: str) -> None:
    runtime = make_runtime(name)
    assert isinstance(runtime, SessionRuntime) and not runtime.rethreads_in_place
    runtime.load("builtin:tiny-mlp")
    runtime.set_threads(1)
    serving = runtime._serving
    batch = sample_input(runtime.input, 4)
    expected = runtime.run(batch)
    built, served = threading.Event(), threading.Event()
    real_build = runtime._build

    def build_then_wait(threads: int) -> Any:
        session = real_build(threads)
        built.set()
        assert served.wait(10), "the main thread did not serve while the new session waited"
        return session

    runtime._build = build_then_wait  # type: ignore[method-assign]
    box: list = []
    preparing = threading.Thread(target=lambda: box.append(runtime.prepare_threads(2)))
    preparing.start()
    assert built.wait(30)
    # The new session exists, uncommitted: the old one still answers, still with one thread.
    np.testing.assert_array_equal(runtime.run(batch), expected)
    assert runtime._serving is serving and runtime.threads == 1
    served.set()
    preparing.join(10)
    box[0]()  # commit, as the worker's main thread does between jobs
    assert runtime._serving is not serving and runtime.threads == 2
    assert _session_threads(runtime) == min(2, len(os.sched_getaffinity(0)))
    np.testing.assert_allclose(runtime.run(batch), expected, rtol=RTOL, atol=ATOL)


def _session_threads(runtime: SessionRuntime) -> int:
    if runtime.name == "onnxruntime":
        return runtime._serving[0].get_session_options().intra_op_num_threads
    return int(runtime._serving[0].get_property("INFERENCE_NUM_THREADS"))


# -- unsupported inputs ---------------------------------------------------------------------------
@pytest.mark.parametrize("name", OPTIONAL)
def test_bfloat16_inputs_are_refused_with_a_clear_error(name: str, tmp_path: Path) -> None:
    pytest.importorskip(name)
    runtime = make_runtime(name)
    assert isinstance(runtime, SessionRuntime)
    with pytest.raises(ConfigError, match="cannot take bfloat16 inputs.*--runtime torch"):
        runtime.use_file(tmp_path / "model.onnx", InputSpec("bfloat16", (4,)))
