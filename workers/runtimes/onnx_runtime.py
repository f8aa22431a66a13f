"""ONNX Runtime on the model exported to ONNX (pip install -e '.[onnx]'): one session per thread count."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from workers.runtimes.base import SessionRuntime

# ONNX Runtime's intra-op threads spin-wait for work after each parallel section instead of sleeping.
# Measured on 2 cores with `bench/runtimes.py --ort-spinning` (2 threads, pinned; median ms off → on):
#   ResNet-50 B=1 43.97 → 43.32, B=8 336.5 → 311.7;  BERT-base B=1 132.0 → 128.2, B=8 1055 → 1011
# so spinning is 1.5-8 % faster when the instance owns its cores, as Packrat's pinned workers do. An
# earlier run while another job shared the cores had ResNet-50 B=1 at 41 → 66 ms: spinning costs when
# cores are shared. Only instances of 2+ threads have a pool to spin. PACKRAT_ORT_SPINNING=0 turns it off.
ORT_SPINNING_DEFAULT = True


def ort_spinning() -> bool:
    """Whether ONNX Runtime's intra-op threads spin; PACKRAT_ORT_SPINNING=0/1 overrides the measured default."""
    value = os.environ.get("PACKRAT_ORT_SPINNING", "").strip()
    return ORT_SPINNING_DEFAULT if value == "" else value not in ("0", "false", "no", "off")


class OnnxRuntime(SessionRuntime):
    name = "onnxruntime"

    def _build(self, threads: int) -> Any:
        # Imported here, in the worker: importing onnxruntime starts a native thread, and the template forks.
        import onnxruntime as ort

        assert self.path is not None, "load() first"
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads  # the calling thread is one of them
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.add_session_config_entry("session.intra_op.allow_spinning", "1" if ort_spinning() else "0")
        options.add_session_config_entry("session.inter_op.allow_spinning", "0")
        # session.intra_op_thread_affinities stays unset: Packrat pins (an explicit thread count keeps
        # ORT from pinning by itself), and new pool threads inherit the building thread's affinity.
        session = ort.InferenceSession(str(self.path), sess_options=options, providers=["CPUExecutionProvider"])
        return session, session.get_inputs()[0].name, session.get_outputs()[0].name

    def _run(self, serving: Any, batch: np.ndarray) -> np.ndarray:
        session, input_name, output_name = serving
        return session.run([output_name], {input_name: np.ascontiguousarray(batch)})[0]

    def _run_named(self, serving: Any, feeds: dict[str | int, np.ndarray], outputs: list[str]) -> list[np.ndarray]:
        session, input_name, output_name = serving
        named = {input_name if key == 0 else str(key): array for key, array in feeds.items()}
        return list(session.run(outputs or [output_name], named))
