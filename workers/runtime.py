"""The runtime interface a worker runs a model through, and the PyTorch implementation.

Only this module and `workers.models` know about torch; ONNX Runtime and OpenVINO runtimes are
planned behind the same four methods.
"""

from __future__ import annotations

import abc
import contextlib
import time
import warnings

import numpy as np

from workers.models import InputSpec, LoadedModel, load_model


class Runtime(abc.ABC):
    name: str = ""

    @abc.abstractmethod
    def load(self, spec: str, input_override: str | None = None) -> InputSpec:
        """Load the model once (in the template process, before any inference)."""

    @abc.abstractmethod
    def set_threads(self, threads: int) -> None:
        """Use `threads` intra-op threads from now on (callable again to re-thread in place)."""

    @abc.abstractmethod
    def run(self, batch: np.ndarray) -> np.ndarray:
        """Run one batch (first axis = samples); numpy in, numpy out."""

    def timed_run(self, batch: np.ndarray) -> tuple[np.ndarray, float]:
        """Run and report compute time in milliseconds (what the profile store learns from)."""
        start = time.perf_counter()
        out = self.run(batch)
        return out, (time.perf_counter() - start) * 1000.0


# Inputs arrive as read-only views of ZeroMQ frames; the model never writes to them, so copying
# them only to silence torch's warning would cost a copy per batch for nothing.
warnings.filterwarnings("ignore", message="The given NumPy array is not writable")


class TorchRuntime(Runtime):
    name = "torch"

    def __init__(self) -> None:
        import torch

        self._torch = torch
        self.model: LoadedModel | None = None

    def prepare_template(self) -> None:
        """Keep the template single-threaded: libgomp is not fork-safe once its pool has run."""
        self._torch.set_num_threads(1)
        # It can be set only once per process; a second load in the same process keeps the first value.
        with contextlib.suppress(RuntimeError):
            self._torch.set_num_interop_threads(1)

    def load(self, spec: str, input_override: str | None = None) -> InputSpec:
        self.prepare_template()
        self.model = load_model(spec, input_override)
        return self.model.input

    def set_threads(self, threads: int) -> None:
        self._torch.set_num_threads(threads)

    def run(self, batch: np.ndarray) -> np.ndarray:
        assert self.model is not None, "load() first"
        torch = self._torch
        with torch.inference_mode():
            x = torch.from_numpy(np.ascontiguousarray(batch))
            if self.model.input.dtype == "bfloat16":
                x = x.view(torch.bfloat16)
            if self.model.channels_last and x.dim() == 4:
                x = x.contiguous(memory_format=torch.channels_last)
            out = self.model.module(x)
        return out.contiguous().numpy()


RUNTIMES: dict[str, type[Runtime]] = {"torch": TorchRuntime}


def make_runtime(name: str) -> Runtime:
    from packrat_daemon.errors import ConfigError

    try:
        return RUNTIMES[name]()
    except KeyError:
        raise ConfigError(f"unknown runtime {name!r}; available: {', '.join(RUNTIMES)}") from None


def sample_input(spec: InputSpec, batch: int, seed: int = 0) -> np.ndarray:
    """A random batch that matches the model's declared input (for warm-up and profiling)."""
    rng = np.random.default_rng(seed)
    shape = (batch, *spec.shape)
    if spec.dtype == "bfloat16":
        # numpy has no bfloat16: the protocol carries its raw bits as uint16 (the top half of a float32).
        return (rng.standard_normal(shape, dtype=np.float32).view(np.uint32) >> 16).astype(np.uint16)
    if spec.dtype.startswith("float"):
        return rng.standard_normal(shape, dtype=np.float32).astype(spec.dtype)
    if spec.dtype == "bool":
        return rng.integers(0, 2, shape).astype(bool)
    high = spec.high or 100
    return rng.integers(0, high, shape).astype(spec.dtype)
