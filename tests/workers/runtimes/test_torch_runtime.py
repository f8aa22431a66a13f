"""The torch runtime on tiny models: load, re-thread, run, timed run."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import torch

from workers.models.spec import InputSpec, sample_input
from workers.runtimes.torch_runtime import TorchRuntime


@pytest.fixture(autouse=True)
def keep_torch_threads() -> Iterator[None]:
    # load() makes the process single-threaded, as a template must be; give the other tests their threads back.
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


@pytest.fixture
def mlp() -> TorchRuntime:
    runtime = TorchRuntime()
    runtime.load("builtin:tiny-mlp")
    return runtime


def direct(runtime: TorchRuntime, batch: np.ndarray) -> np.ndarray:
    assert runtime.model is not None
    with torch.inference_mode():
        return runtime.model.module(torch.from_numpy(batch)).numpy()


def test_load_returns_the_models_input_and_leaves_one_thread() -> None:
    runtime = TorchRuntime()
    assert runtime.load("builtin:tiny-mlp") == InputSpec("float32", (16,))
    assert torch.get_num_threads() == 1


def test_load_applies_the_input_override() -> None:
    assert TorchRuntime().load("builtin:tiny-mlp", "float32:16") == InputSpec("float32", (16,))


def test_set_threads_rethreads_in_place(mlp: TorchRuntime) -> None:
    mlp.set_threads(2)
    assert torch.get_num_threads() == 2
    mlp.set_threads(1)
    assert torch.get_num_threads() == 1


def test_run_matches_the_modules_own_output(mlp: TorchRuntime) -> None:
    batch = sample_input(mlp.model.input, 5)
    out = mlp.run(batch)
    assert isinstance(out, np.ndarray)
    assert out.shape == (5, 4) and out.dtype == np.float32
    np.testing.assert_array_equal(out, direct(mlp, batch))


# torch_runtime.py silences this warning when imported, but pytest drops filters set while it collects.
@pytest.mark.filterwarnings("ignore:The given NumPy array is not writable")
def test_run_accepts_read_only_input(mlp: TorchRuntime) -> None:
    # Payloads arrive as read-only views of ZeroMQ frames.
    batch = sample_input(mlp.model.input, 3)
    frame = np.frombuffer(batch.tobytes(), dtype=np.float32).reshape(batch.shape)
    assert not frame.flags.writeable
    np.testing.assert_array_equal(mlp.run(frame), direct(mlp, batch))


def test_run_channels_last_model_matches_the_module() -> None:
    runtime = TorchRuntime()
    runtime.load("builtin:tiny-cnn")
    batch = sample_input(runtime.model.input, 2)
    out = runtime.run(batch)
    assert out.shape == (2, 10)
    np.testing.assert_allclose(out, direct(runtime, batch), rtol=1e-5, atol=1e-6)


def test_timed_run_reports_positive_milliseconds_and_the_same_output(mlp: TorchRuntime) -> None:
    batch = sample_input(mlp.model.input, 4)
    out, elapsed_ms = mlp.timed_run(batch)
    assert elapsed_ms > 0
    np.testing.assert_array_equal(out, mlp.run(batch))


def test_run_before_load_is_refused() -> None:
    with pytest.raises(AssertionError, match="load"):
        TorchRuntime().run(np.zeros((1, 16), dtype=np.float32))


def test_torch_rethreads_in_place_and_its_commit_sets_the_threads() -> None:
    runtime = TorchRuntime()
    assert runtime.rethreads_in_place
    before = torch.get_num_threads()
    commit = runtime.prepare_threads(2)
    assert torch.get_num_threads() == before  # nothing changes until the commit
    commit()
    assert torch.get_num_threads() == 2  # the autouse fixture gives the threads back
