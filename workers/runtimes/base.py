"""The runtime interface a worker runs a model through: `Runtime`, and `SessionRuntime` for the runtimes
whose thread count is fixed per session.

Every runtime follows the same life: `load` once in the template process (which must never start a
thread pool or run inference: the template forks workers, and libgomp, ONNX Runtime's and TBB's pools
are not fork-safe), then in each forked, pinned worker `set_threads` and `run` per batch. ONNX Runtime
and OpenVINO fix their thread count when a session is built, so re-threading them builds a new session
beside the serving one (`prepare_threads`, in a background thread) and swaps it in between jobs.

Precision (`use_precision`, before `load`): fp32, or bf16 where the runtime has a bf16 path (each runtime's
module says how it serves it). Whether a reduced precision may be served is the accuracy guard's decision
(`workers.models.precision`, `packrat_daemon.measure.accuracy`), never the runtime's.
"""

from __future__ import annotations

import abc
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from packrat_daemon.wire.codec import pack_records, unpack_records
from packrat_daemon.wire.errors import ConfigError
from workers.models.cache import ensure_converted, ensure_quantized
from workers.models.calibration import split_precision
from workers.models.free_axis import LayoutsByLength
from workers.models.spec import DEFAULT_OUTPUT_NAME, InputSpec, check_precision


def log_notes(notes: list[str] | tuple[str, ...]) -> None:
    """Say in the daemon's log (the template's stderr) what the user should know of how the model is served."""
    for note in notes:
        print(f"packrat: {note}", file=sys.stderr, flush=True)


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
        self._named = False
        self._input_names: list[str] = []
        self._input_layout = LayoutsByLength(InputSpec("uint8", ()))
        self._output_names: list[str] = []
        # The cores the template may use (its affinity at load): what a worker may be re-pinned to later.
        self.usable_cpus: set[int] = os.sched_getaffinity(0)
        self.threads = 0
        self._serving: Any = None

    def load(self, spec: str, input_override: str | None = None) -> InputSpec:
        self.usable_cpus = os.sched_getaffinity(0)
        if self.precision == "int8":  # OpenVINO only (workers.models.spec): quantized in a subprocess, if not cached
            converted = ensure_quantized(spec, input_override, self.calibration)
            self.quantization = converted.meta.get("quantization")
        else:
            converted = ensure_converted(spec, input_override, self.name)  # a subprocess, if not cached
        log_notes(converted.meta.get("notes", []))  # e.g. the one output served of several
        self.use_file(converted.path, converted.input)
        return converted.input

    def use_file(self, path: Path, input_spec: InputSpec) -> None:
        """Serve an already converted file (what `load` does after the cache lookup)."""
        if any(tensor.dtype == "bfloat16" for tensor in (*input_spec.named_inputs(), *input_spec.outputs)):
            raise ConfigError(f"runtime {self.name} cannot take bfloat16 inputs (numpy has none); use --runtime torch")
        self.path, self.input = Path(path), input_spec
        # A model of several inputs, or of named outputs (a graph may have more than are served), is fed and read by
        # name; one of one input and one unnamed output (declared as DEFAULT_OUTPUT_NAME, whatever the graph calls
        # it: an exporter names a lone tensor as it likes) by position.
        outputs = input_spec.outputs
        unnamed = len(outputs) == 1 and outputs[0].name == DEFAULT_OUTPUT_NAME
        self._named = input_spec.records or (bool(outputs) and not unnamed)
        self._input_names = [tensor.name for tensor in input_spec.inputs]
        self._input_layout = LayoutsByLength(input_spec)  # at each length, for a model of a free axis
        self._output_names = [tensor.name for tensor in input_spec.outputs]

    def set_threads(self, threads: int) -> None:
        self._install(self._build(threads), threads)

    def prepare_threads(self, threads: int) -> Callable[[], None]:
        built = self._build(threads)  # slow (graph optimisation, weight packing): off the serving thread
        return lambda: self._install(built, threads)

    def run(self, batch: np.ndarray) -> np.ndarray:
        if self._named:
            outputs = self.run_all(batch)
            return pack_records(outputs) if len(outputs) > 1 else outputs[0]
        serving = self._serving  # one read: a concurrent commit swaps the reference, never this session
        assert serving is not None, "load() and set_threads() first"
        return self._run(serving, batch)

    def run_all(self, batch: np.ndarray) -> list[np.ndarray]:
        """Every output of a model fed by name: `batch` is the records of its inputs (or its one input)."""
        serving = self._serving
        assert serving is not None, "load() and set_threads() first"
        feeds: dict[str | int, np.ndarray]
        if len(self._input_names) > 1:
            layout = self._input_layout.of(batch.shape[1])
            feeds = dict(zip(self._input_names, unpack_records(batch, layout), strict=True))
        else:  # one input: by position (the graph's own name for it may not be the model's)
            feeds = {0: np.ascontiguousarray(batch)}
        return self._run_named(serving, feeds, self._output_names)

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

    def _run_named(self, serving: Any, feeds: dict[str | int, np.ndarray], outputs: list[str]) -> list[np.ndarray]:
        """The outputs named `outputs`, in order, for the inputs `feeds` (by name, or 0 for a model's one input).
        A runtime that feeds by position alone serves a model of one input and one output only."""
        if len(feeds) != 1 or len(outputs) > 1:
            raise ConfigError(f"runtime {self.name} serves models of one input and one output; use --runtime torch")
        return [self._run(serving, next(iter(feeds.values())))]
