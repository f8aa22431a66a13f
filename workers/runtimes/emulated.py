"""The emulated runtime: workers that do not compute, so that 16-128 of them fit on a small machine.

A measuring instrument, never a way to serve a model: each call waits for the latency the daemon's
profile gives this worker's thread count and the call's batch size, L̂(t, b), stretched by a slow-down
factor for the emulated cores busy at that moment, and then answers zeros of the model's output shape.

The daemon (`packrat serve --runtime emulated`, packrat_daemon.measure.emulation) writes the numbers the workers
need to a JSON file and starts the template with `--runtime emulated:FILE`:

    {"latency_ms": {"T": [L̂(T, 1), L̂(T, 2), …]},   per thread count, batch sizes 1, 2, … (null: not carried),
                                                    each over f(T): alone, a call waits L̂ itself
     "cores": C,                                    the cores emulated
     "contention": [f(1), …, f(C)],                 the slow-down when 1 … C cores are busy
     "label": "…"}                                  how the daemon describes the emulation

More busy threads than cores time-share them: the factor then also grows as busy / C (`slowdown`).
How many cores are busy is counted in memory the template shares with every worker it forks
(`BusyBoard`). This module imports no torch, so the template and its workers stay small; the model's
input and output shapes are learned once by a throwaway process that does (`learn_shapes`), and cached.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import multiprocessing
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from packrat_daemon.wire.errors import ConfigError, ModelSpecError
from packrat_daemon.wire.length_cost import equivalent_batch, interpolate
from workers.models.cache import entry_dir
from workers.models.spec import (
    EMULATED,
    ONNX_FILE,
    InputSpec,
    available_runtimes,
    model_kind,
    model_runtimes,
    sample_input,
)
from workers.runtimes.base import Runtime
from workers.runtimes.torch_runtime import TorchRuntime

# Slots on the busy board: more workers than any plan for 128 cores keeps warm (spare layouts included).
BOARD_SLOTS = 4096
# A call re-reads the busy count this often (a fraction of its latency, but not more often than
# STEP_MIN_S): the others start and finish meanwhile, and each stretch runs at the factor of its moment.
STEPS_PER_CALL = 8
STEP_MIN_S = 0.002
# How late this worker's wake-ups come, learned as a moving average (this weight per sleep, capped): a
# machine shared with other work wakes a sleeper a fraction of a millisecond or more after its timer.
LATE_WEIGHT = 0.1
LATE_MAX_S = 0.002
SHAPES_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class Numbers:
    """What the daemon hands its emulated workers (the JSON file above)."""

    latency_ms: dict[int, tuple[float | None, ...]]  # threads → L̂ for batch 1, 2, …
    cores: int
    contention: tuple[float, ...]  # f(1) … f(cores)
    label: str

    @classmethod
    def read(cls, path: str | os.PathLike[str]) -> Numbers:
        try:
            data = json.loads(Path(path).read_text())
            return cls(
                {int(t): tuple(row) for t, row in data["latency_ms"].items()},
                int(data["cores"]),
                tuple(float(f) for f in data["contention"]),
                str(data["label"]),
            )
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ConfigError(f"cannot read the emulated workers' numbers from {path}: {exc}") from None

    def to_json(self) -> dict[str, Any]:
        return {
            "latency_ms": {str(t): list(row) for t, row in self.latency_ms.items()},
            "cores": self.cores,
            "contention": list(self.contention),
            "label": self.label,
        }

    def latency_s(self, threads: int, batch: int, length: int = 0, reference: int = 0) -> float:
        """L̂(threads, batch) in seconds; ValueError when the profile cannot carry it. `length`: the batch's padded
        length along a free axis, the profile's being `reference`: then the profiled batches' latencies at the
        equivalent batch (packrat_daemon.wire.length_cost, the rule the planner predicts by)."""
        row = self.latency_ms.get(threads, ())
        if length and reference and length != reference:
            latency = interpolate(_profiled_points(row), equivalent_batch(batch, length, reference))
        else:
            latency = row[batch - 1] if 1 <= batch <= len(row) else None
        if latency is None:
            raise ValueError(f"the profile has no latency for {threads} thread(s) at batch {batch}")
        return latency / 1000.0

    def slowdown(self, busy_threads: int) -> float:
        """The factor a call runs slower by while `busy_threads` threads (its own included) are busy."""
        if busy_threads <= 0:
            return 1.0
        factor = self.contention[min(busy_threads, self.cores) - 1]
        # Beyond the cores, threads time-share them (an oversubscribed plan such as torchserve's).
        return factor * max(1.0, busy_threads / self.cores)


class BusyBoard:
    """How many emulated cores are busy now, shared by every worker forked from one template.

    Made in the template before it forks. Each worker claims a slot (its pid) once, and writes its thread
    count there while a call runs and 0 after; it writes only its own slot, so only claiming takes the
    lock. A slot whose worker died (killed mid-call, say) is swept when the next worker claims one.
    """

    def __init__(self, slots: int = BOARD_SLOTS) -> None:
        self._owners = multiprocessing.RawArray(ctypes.c_int64, slots)
        self._threads = multiprocessing.RawArray(ctypes.c_int32, slots)
        self._lock = multiprocessing.Lock()
        self._slot = -1

    def claim(self) -> None:
        """Take a slot for this process (in the worker, after the fork)."""
        owners = np.frombuffer(memoryview(self._owners), dtype=np.int64)
        threads = np.frombuffer(memoryview(self._threads), dtype=np.int32)
        with self._lock:
            for slot in np.flatnonzero(owners):
                if not _alive(int(owners[slot])):
                    owners[slot], threads[slot] = 0, 0
            free = np.flatnonzero(owners == 0)
            if free.size == 0:
                raise RuntimeError(f"all {len(owners)} slots of the emulated workers' busy board are taken")
            self._slot = int(free[0])
            owners[self._slot] = os.getpid()

    @property
    def claimed(self) -> bool:
        return self._slot >= 0

    def busy(self) -> int:
        """Threads busy now, over every worker."""
        return int(np.frombuffer(memoryview(self._threads), dtype=np.int32).sum())

    def set(self, threads: int) -> None:
        self._threads[self._slot] = threads


def _alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, dead but not yet reaped by the template, does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rpartition(")")[2].split()[0] not in ("Z", "X")


def _profiled_points(row: Sequence[float | None]) -> list[tuple[int, float]]:
    """The profiled (batch, ms) points of a row of L̂ for batches 1, 2, …: the last batch of each step (L̂ is the
    smallest profiled batch's latency at or above b)."""
    points = []
    for batch, latency in enumerate(row, start=1):
        following = row[batch] if batch < len(row) else None
        if latency is not None and latency != following:
            points.append((batch, latency))
    return points


class EmulatedRuntime(Runtime):
    name = EMULATED
    # Its workers compute nothing, so they are left unpinned: the cores they stand for need not exist here.
    pins: ClassVar[bool] = False

    def __init__(self, numbers_file: str | None = None) -> None:
        self.numbers_file = numbers_file
        self.numbers: Numbers | None = None
        self.threads = 1
        self.output_shape: tuple[int, ...] = ()
        self.output_dtype = np.dtype(np.float32)
        self.board: BusyBoard | None = None
        self.spec = InputSpec("float32", ())
        self._late_s = 0.0  # the learned lateness of a wake-up (see _wait)

    def load(self, spec: str, input_override: str | None = None) -> InputSpec:
        if self.numbers_file is None:
            raise ConfigError(
                "the emulated runtime waits the latencies of a profile, which the daemon hands it: "
                "run `packrat serve --runtime emulated --profile FILE` (docs/emulation.md)"
            )
        self.numbers = Numbers.read(self.numbers_file)
        shapes = learn_shapes(spec, input_override)
        self.output_shape = tuple(shapes["output"]["shape"])
        self.output_dtype = np.dtype(shapes["output"]["dtype"])
        self.board = BusyBoard()  # before the template forks: every worker shares it
        self.spec = InputSpec.from_json(shapes["input"])
        return self.spec

    def set_threads(self, threads: int) -> None:
        self.threads = threads

    def run(self, batch: np.ndarray) -> np.ndarray:
        assert self.numbers is not None and self.board is not None, "load() first"
        rows, spec = int(batch.shape[0]), self.spec
        length = spec.length_of(batch.shape[1:]) if spec.ragged else 0  # a batch padded to its longest: tokens
        latency_s = self.numbers.latency_s(self.threads, rows, length, spec.max_length)
        if not self.board.claimed:
            self.board.claim()
        self.board.set(self.threads)
        try:
            self._wait(latency_s)
        finally:
            self.board.set(0)
        return np.zeros((rows, *self.output_shape), dtype=self.output_dtype)

    def _wait(self, latency_s: float) -> None:
        """Sleep until the call's work is done, at the slow-down of each stretch's busy count.

        Progress is credited with the time each stretch really took, so a late wake-up is not lost. The
        last one would still add its lateness to the call (on a busy machine the process waits for a core
        after its timer fires), so the worker learns how late its wake-ups come and ends the wait that
        much before the work is done: the wait then lands on L̂ × slow-down, not on it plus the lateness.
        """
        assert self.numbers is not None and self.board is not None
        done = 0.0  # fraction of the call's work done
        step_s = max(STEP_MIN_S, latency_s / STEPS_PER_CALL)
        last = time.perf_counter()
        while True:
            stretched_s = latency_s * self.numbers.slowdown(self.board.busy())
            left_s = (1.0 - done) * stretched_s
            if left_s <= self._late_s:
                return
            asked_s = min(left_s - self._late_s, step_s)
            time.sleep(asked_s)
            now = time.perf_counter()
            late_s = min(max(now - last - asked_s, 0.0), LATE_MAX_S)
            self._late_s += LATE_WEIGHT * (late_s - self._late_s)
            done += (now - last) / stretched_s
            last = now


def learn_shapes(spec: str, input_override: str | None) -> dict[str, Any]:
    """The model's input and per-sample output: {"input": InputSpec JSON, "output": {"dtype", "shape"}}.

    Measured once by a throwaway process that loads the model with torch and runs one sample (this
    process must stay torch-free), then read from workers.models.cache's cache folder.
    """
    cached = entry_dir(spec, input_override, EMULATED) / "shapes.json"
    if cached.is_file():
        return json.loads(cached.read_text())
    command = [sys.executable, "-m", "workers.runtimes.emulated", "--model", spec]
    if input_override:
        command += ["--input", input_override]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=SHAPES_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        raise ModelSpecError(f"learning the shapes of {spec} took over {SHAPES_TIMEOUT_S:.0f} s") from None
    if done.returncode != 0:
        raise ModelSpecError(f"could not learn the shapes of {spec}: {done.stderr.strip()[-2000:]}")
    shapes = json.loads(done.stdout)
    cached.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=cached.parent, delete=False, suffix=".tmp") as handle:
        json.dump(shapes, handle)
    os.replace(handle.name, cached)  # in one step: a concurrent reader never sees half a file
    return shapes


def main(argv: Sequence[str] | None = None) -> int:
    """The throwaway process of `learn_shapes`: load the model with torch (an ONNX file with a runtime that
    runs it), run one sample, print the shapes."""
    parser = argparse.ArgumentParser(prog="python -m workers.runtimes.emulated")
    parser.add_argument("--model", required=True)
    parser.add_argument("--input")
    args = parser.parse_args(argv)
    runtime: Runtime = TorchRuntime()
    if model_kind(args.model) == ONNX_FILE:  # PyTorch cannot run one: the first installed runtime that can
        from workers.runtimes import make_runtime
        from workers.runtimes.registry import computing

        # None installed: the first that could, whose ConfigError says what to install.
        able = model_runtimes(args.model, available_runtimes()) or model_runtimes(args.model, list(computing()))
        runtime = make_runtime(able[0])
    input_spec = runtime.load(args.model, args.input)
    runtime.set_threads(1)
    output = runtime.run(sample_input(input_spec, 1))
    shapes = {"input": input_spec.to_json(), "output": {"dtype": output.dtype.str, "shape": list(output.shape[1:])}}
    print(json.dumps(shapes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
