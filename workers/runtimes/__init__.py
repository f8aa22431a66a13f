"""The runtime interface a worker runs a model through, and its implementations.

    torch        PyTorch eager (the default); re-threads in place.
    onnxruntime  ONNX Runtime on the model exported to ONNX (pip install -e '.[onnx]').
    openvino     OpenVINO on the model converted to its IR (pip install -e '.[openvino]').

Every runtime follows the same life: `load` once in the template process (which must never start a
thread pool or run inference: the template forks workers, and libgomp, ONNX Runtime's and TBB's pools
are not fork-safe), then in each forked, pinned worker `set_threads` and `run` per batch. ONNX Runtime
and OpenVINO fix their thread count when a session is built, so re-threading them builds a new session
beside the serving one (`prepare_threads`, in a background thread) and swaps it in between jobs.
Only this module, `workers.models.loading`, `workers.models.cache` and `workers.models.convert` import these packages;
`workers.models.spec` says which ones each runtime needs and at which precisions each can serve.

Precision (`use_precision`, before `load`): fp32, or bf16 where the runtime has a bf16 path. Torch's bf16
is the model's weights cast to bfloat16 (float inputs cast on the way in, outputs back to float32): measured
here on ResNet-50 and BERT-base at batch 4, it ran 1.2-1.9x faster than bf16 autocast, which re-casts the
fp32 weights on every call. OpenVINO's is its INFERENCE_PRECISION_HINT. Whether a reduced precision may be
served is the accuracy guard's decision (`workers.models.precision`, `packrat_daemon.measure.accuracy`),
never the runtime's.
"""

from __future__ import annotations

import abc
import contextlib
import os
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from workers.models.precision import split_precision
from workers.models.spec import EMULATED, InputSpec, check_precision, check_runtime

if TYPE_CHECKING:  # workers.models.loading imports torch: the emulated runtime's template and workers never do
    from workers.models.loading import LoadedModel


class Runtime(abc.ABC):
    name: str = ""
    # True: set_threads changes the live thread pool (cheap, any time). False: a new session is built per count.
    rethreads_in_place: ClassVar[bool] = True
    # True: the worker pins its threads to its cores. False: it computes nothing (workers.runtimes.emulated).
    pins: ClassVar[bool] = True
    precision: str = "fp32"
    calibration: str | None = None  # int8: the .npy file it is quantized on (None: sample inputs)
    quantization: dict | None = None  # int8: how it was quantized (the cache entry's record), once loaded

    def use_precision(self, precision: str) -> None:
        """Serve at `precision` (`int8:FILE` names int8's calibration inputs) from `load` on; ConfigError,
        saying what to do, if this runtime cannot."""
        precision, calibration = split_precision(precision)
        check_precision(self.name, precision)
        self.precision, self.calibration = precision, calibration

    def has_units(self) -> bool | None:
        """The runtime's own report on whether this CPU runs its precision natively (None: it does not say)."""
        return None

    @abc.abstractmethod
    def load(self, spec: str, input_override: str | None = None) -> InputSpec:
        """Load the model once (in the template process, before any inference)."""

    @abc.abstractmethod
    def set_threads(self, threads: int) -> None:
        """Use `threads` intra-op threads from now on (called first in the worker, after fork)."""

    @abc.abstractmethod
    def run(self, batch: np.ndarray) -> np.ndarray:
        """Run one batch (first axis = samples); numpy in, numpy out."""

    def prepare_threads(self, threads: int) -> Callable[[], None]:
        """Build what `threads` needs without disturbing the serving model; return the cheap swap.

        Called from a background thread while the worker's main thread keeps serving; new pool threads
        inherit that thread's CPU affinity, so the worker sets it to the new cores first. The returned
        `commit` is called by the main thread between jobs. In-place runtimes have nothing to build.
        """
        return lambda: self.set_threads(threads)

    def serve_only(self) -> None:
        """This thread will only run inference from now on (a worker's main thread): drop per-call setup."""
        return None  # session runtimes have none

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


class SessionRuntime(Runtime):
    """A runtime whose thread count is fixed per session (ONNX Runtime, OpenVINO).

    The template only makes sure the converted file is in the cache and reads the model's declared
    input from it: no session, no thread pool. Each worker builds its own session for its thread count,
    with its own copy of the (repacked) weights: unlike torch's, they are not shared copy-on-write.
    """

    rethreads_in_place = False

    def __init__(self) -> None:
        self.path: Path | None = None
        self.input: InputSpec | None = None
        # The cores the template may use (its affinity at load): what a worker may be re-pinned to later.
        self.usable_cpus: set[int] = os.sched_getaffinity(0)
        self.threads = 0
        self._serving: Any = None

    def load(self, spec: str, input_override: str | None = None) -> InputSpec:
        from workers.models.cache import ensure_converted, ensure_quantized

        self.usable_cpus = os.sched_getaffinity(0)
        if self.precision == "int8":  # OpenVINO only (workers.models.spec): quantized in a subprocess, if not cached
            converted = ensure_quantized(spec, input_override, self.calibration)
            self.quantization = converted.meta.get("quantization")
        else:
            converted = ensure_converted(spec, input_override, self.name)  # a subprocess, if not cached
        self.use_file(converted.path, converted.input)
        return converted.input

    def use_file(self, path: Path, input_spec: InputSpec) -> None:
        """Serve an already converted file (what `load` does after the cache lookup)."""
        from packrat_daemon.wire.errors import ConfigError

        if input_spec.dtype == "bfloat16":
            raise ConfigError(f"runtime {self.name} cannot take bfloat16 inputs (numpy has none); use --runtime torch")
        self.path, self.input = Path(path), input_spec

    def set_threads(self, threads: int) -> None:
        self._install(self._build(threads), threads)

    def prepare_threads(self, threads: int) -> Callable[[], None]:
        built = self._build(threads)  # slow (graph optimisation, weight packing): off the serving thread
        return lambda: self._install(built, threads)

    def run(self, batch: np.ndarray) -> np.ndarray:
        serving = self._serving  # one read: a concurrent commit swaps the reference, never this session
        assert serving is not None, "load() and set_threads() first"
        return self._run(serving, batch)

    def _install(self, built: Any, threads: int) -> None:
        retired = [self._serving]
        self._serving, self.threads = built, threads
        if retired[0] is not None:
            # Releasing a session joins its pool threads and frees its packed weights (≈6 ms for ResNet-50
            # here): a short-lived thread does it, so OpenVINO's commit is a swap (6.4 → 0.3 ms). ONNX
            # Runtime's destructor holds the GIL, so its commit still stalls Python (not inference) ≈6 ms.
            threading.Thread(target=retired.clear, name="packrat-release", daemon=True).start()

    @abc.abstractmethod
    def _build(self, threads: int) -> Any:
        """A ready-to-run session for `threads` threads (called in the worker, maybe off its main thread)."""

    @abc.abstractmethod
    def _run(self, serving: Any, batch: np.ndarray) -> np.ndarray: ...


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


def _emulated(numbers_file: str | None = None) -> Runtime:
    # Imported on demand: workers.runtimes.emulated builds on this module's Runtime.
    from workers.runtimes.emulated import EmulatedRuntime

    return EmulatedRuntime(numbers_file)


RUNTIMES: dict[str, Callable[[], Runtime]] = {
    "torch": TorchRuntime, "onnxruntime": OnnxRuntime, "openvino": OpenVinoRuntime, EMULATED: _emulated
}  # fmt: skip


def make_runtime(name: str, precision: str = "fp32") -> Runtime:
    """The runtime `name`; the daemon starts an emulated template as `emulated:FILE`, FILE holding the
    numbers its workers wait (workers.runtimes.emulated)."""
    if name.startswith(f"{EMULATED}:"):
        runtime = _emulated(name.partition(":")[2])
        runtime.use_precision(precision)
        return runtime
    check_runtime(name)  # an unknown name or a missing package: a ConfigError that says what to install
    runtime = RUNTIMES[name]()
    runtime.use_precision(precision)
    return runtime
