"""PyTorch eager, the default runtime; it re-threads in place.

Torch's bf16 is the model's weights cast to bfloat16 (float inputs cast on the way in, outputs back to
float32): measured here on ResNet-50 and BERT-base at batch 4, it ran 1.2-1.9x faster than bf16 autocast,
which re-casts the fp32 weights on every call. torch itself is imported when the runtime is made, never when
this module is: the registry imports this module into the daemon and the emulated template, both torch-free.
"""

from __future__ import annotations

import contextlib
import warnings
from typing import TYPE_CHECKING, Any

import numpy as np

from workers.models.spec import InputSpec
from workers.runtimes.base import Runtime, log_notes

if TYPE_CHECKING:  # workers.models.loading imports torch: the emulated runtime's template and workers never do
    from workers.models.loading import LoadedModel

# Inputs arrive as read-only views of ZeroMQ frames; the model never writes to them, so copying
# them only to silence torch's warning would cost a copy per batch for nothing.
warnings.filterwarnings("ignore", message="The given NumPy array is not writable")


class TorchRuntime(Runtime):
    name = "torch"

    def __init__(self) -> None:
        import torch

        self._torch = torch
        self.model: LoadedModel | None = None
        self._serving_guard: Any = None

    def prepare_template(self) -> None:
        """Keep the template single-threaded: libgomp is not fork-safe once its pool has run."""
        self._torch.set_num_threads(1)
        # It can be set only once per process; a second load in the same process keeps the first value.
        with contextlib.suppress(RuntimeError):
            self._torch.set_num_interop_threads(1)

    def load(self, spec: str, input_override: str | None = None) -> InputSpec:
        from workers.models.loading import load_model

        self.prepare_template()
        self.model = load_model(spec, input_override)
        log_notes(self.model.notes)
        if self.precision == "bf16" and isinstance(self.model.module, self._torch.nn.Module):
            self.model.module = self.model.module.to(self._torch.bfloat16)  # in the template: shared copy-on-write
        return self.model.input

    def has_units(self) -> bool | None:
        if self.precision == "bf16":
            return bool(self._torch.ops.mkldnn._is_mkldnn_bf16_supported())
        return None

    def set_threads(self, threads: int) -> None:
        self._torch.set_num_threads(threads)

    def serve_only(self) -> None:
        # Inference mode is per thread; entered for good, each run skips entering and leaving it.
        self._serving_guard = self._torch.inference_mode()
        self._serving_guard.__enter__()

    def run(self, batch: np.ndarray) -> np.ndarray:
        if self._torch.is_inference_mode_enabled():
            return self._forward(batch)
        with self._torch.inference_mode():
            return self._forward(batch)

    def _forward(self, batch: np.ndarray) -> np.ndarray:
        assert self.model is not None, "load() first"
        torch = self._torch
        x = torch.from_numpy(np.ascontiguousarray(batch))
        if self.model.input.dtype == "bfloat16":
            x = x.view(torch.bfloat16)
        if self.precision == "bf16" and x.is_floating_point():
            x = x.to(torch.bfloat16)
        if self.model.channels_last and x.dim() == 4:
            x = x.contiguous(memory_format=torch.channels_last)
        out = self.model.module(x)
        if out.dtype == torch.bfloat16 and self.model.input.dtype != "bfloat16":
            out = out.float()  # numpy has no bfloat16; clients of a float model get float32 back
        return out.contiguous().numpy()
