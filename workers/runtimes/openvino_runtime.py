"""OpenVINO on the model converted to its IR (pip install -e '.[openvino]'): one compiled model per thread
count. Its precision is its INFERENCE_PRECISION_HINT (`openvino_config`); int8 is a model NNCF quantized
(`workers.models.cache.ensure_quantized`).
"""

from __future__ import annotations

import contextlib
import os
import threading
from typing import Any

import numpy as np

from workers.runtimes.base import SessionRuntime

# Packrat's precision names → OpenVINO's inference precision hint. An int8 model runs its quantized
# operations in int8 whatever the hint; the hint is for the rest, kept at f32 so int8 adds no bf16 error.
OPENVINO_PRECISIONS = {"fp32": "f32", "bf16": "bf16", "int8": "f32"}


def openvino_config(threads: int, precision: str = "fp32") -> dict[str, Any]:
    """One stream of `threads` threads, unpinned (Packrat pins), at `precision`.

    The precision is always explicit: OpenVINO would run bfloat16 on CPUs with AVX512_BF16 or AMX unless
    told otherwise, and only the accuracy guard may decide that a reduced precision is served.
    """
    return {
        "INFERENCE_NUM_THREADS": threads,
        "NUM_STREAMS": 1,
        "ENABLE_CPU_PINNING": False,
        "PERFORMANCE_HINT": "LATENCY",
        "INFERENCE_PRECISION_HINT": OPENVINO_PRECISIONS[precision],
    }


class OpenVinoRuntime(SessionRuntime):
    name = "openvino"

    def __init__(self) -> None:
        super().__init__()
        self._core: Any = None
        self._core_lock = threading.Lock()

    def core(self) -> Any:
        # Created lazily, in the worker: importing openvino and creating a Core start threads, and the template forks.
        with self._core_lock:
            if self._core is None:
                self._core = _openvino_core(self.usable_cpus)
            return self._core

    def _build(self, threads: int) -> Any:
        assert self.path is not None, "load() first"
        compiled = self.core().compile_model(str(self.path), "CPU", openvino_config(threads, self.precision))
        return compiled, compiled.create_infer_request()

    def has_units(self) -> bool | None:
        if self.precision in ("bf16", "int8"):
            return self.precision.upper() in self.core().get_property("CPU", "OPTIMIZATION_CAPABILITIES")
        return None

    def _run(self, serving: Any, batch: np.ndarray) -> np.ndarray:
        _, request = serving
        request.infer({0: np.ascontiguousarray(batch)}, share_inputs=True)
        # The output tensor is the request's own buffer, overwritten by the next batch: copy it out.
        return request.get_output_tensor(0).data.copy()

    def _run_named(self, serving: Any, feeds: dict[str | int, np.ndarray], outputs: list[str]) -> list[np.ndarray]:
        _, request = serving
        request.infer({key: np.ascontiguousarray(array) for key, array in feeds.items()}, share_inputs=True)
        if not outputs:
            return [request.get_output_tensor(0).data.copy()]
        return [request.get_tensor(name).data.copy() for name in outputs]  # copies: see _run


def _openvino_core(usable_cpus: set[int]) -> Any:
    """An OpenVINO Core whose CPU plugin knows every usable core, not only the worker's current ones.

    The CPU plugin reads the CPU set once per process, when it loads. Loaded in a worker pinned to one
    core, it caps every later compiled model at one thread and pins the inferring thread back to that
    core (measured with 2026.4), so a re-thread to more cores would silently stay on the old one. So the
    plugin loads while this thread's affinity is widened; threads started meanwhile are pinned back.
    """
    import openvino as ov

    own = os.sched_getaffinity(0)
    before = set(os.listdir("/proc/self/task"))
    os.sched_setaffinity(0, usable_cpus | own)
    try:
        core = ov.Core()
        core.get_property("CPU", "FULL_DEVICE_NAME")  # loads the CPU plugin now, while the set is wide
    finally:
        os.sched_setaffinity(0, own)
        for task in set(os.listdir("/proc/self/task")) - before:
            with contextlib.suppress(ProcessLookupError):
                os.sched_setaffinity(int(task), own)
    return core
