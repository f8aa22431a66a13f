"""The runtime interface without a real runtime: precision, timed runs, and a session runtime's re-threading."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from packrat_daemon.wire.errors import ConfigError
from workers.models.spec import InputSpec
from workers.runtimes.base import Runtime, SessionRuntime

RELEASED_ON: list[str] = []  # the thread each fake session was freed on


class Session:
    """What a fake session runtime builds: it adds its thread count to the batch."""

    def __init__(self, threads: int) -> None:
        self.threads = threads

    def __del__(self) -> None:
        RELEASED_ON.append(threading.current_thread().name)


class Adding(SessionRuntime):
    name = "adding"  # a runtime missing from workers.models.spec's table serves fp32 only

    def __init__(self) -> None:
        super().__init__()
        self.built: list[int] = []

    def _build(self, threads: int) -> Any:
        self.built.append(threads)
        return Session(threads)

    def _run(self, serving: Any, batch: np.ndarray) -> np.ndarray:
        return batch + serving.threads


class Sleeping(Runtime):
    name = "sleeping"

    def load(self, spec: str, input_override: str | None = None) -> InputSpec:
        return InputSpec("float32", (1,))

    def set_threads(self, threads: int) -> None:
        pass

    def run(self, batch: np.ndarray) -> np.ndarray:
        time.sleep(0.02)
        return batch


def test_use_precision_refuses_what_the_runtime_cannot_serve() -> None:
    runtime = Sleeping()
    runtime.use_precision("fp32")
    assert (runtime.precision, runtime.calibration) == ("fp32", None)
    with pytest.raises(ConfigError, match="runtime sleeping cannot serve bf16"):
        runtime.use_precision("bf16")
    with pytest.raises(ConfigError, match="unknown precision 'fp8'"):
        runtime.use_precision("fp8")


def test_timed_run_measures_the_run_in_milliseconds() -> None:
    out, elapsed_ms = Sleeping().timed_run(np.ones((2, 1), dtype=np.float32))
    assert out.shape == (2, 1) and 20.0 <= elapsed_ms < 1000.0


def test_a_session_runtime_builds_beside_the_serving_session_and_commit_swaps() -> None:
    runtime = Adding()
    runtime.set_threads(1)
    RELEASED_ON.clear()
    batch = np.zeros(3)
    commit = runtime.prepare_threads(2)
    assert runtime.built == [1, 2]  # built now, off the serving thread in a worker
    np.testing.assert_array_equal(runtime.run(batch), batch + 1)  # still served by the old session
    assert runtime.threads == 1
    commit()
    assert runtime.threads == 2 and runtime.built == [1, 2]  # the commit only swaps
    np.testing.assert_array_equal(runtime.run(batch), batch + 2)
    deadline = time.monotonic() + 5.0
    while not RELEASED_ON and time.monotonic() < deadline:
        time.sleep(0.01)
    assert RELEASED_ON == ["packrat-release"]  # freeing a session is slow: never on the serving thread


def test_a_session_runtime_runs_only_once_it_has_threads() -> None:
    with pytest.raises(AssertionError, match="set_threads"):
        Adding().run(np.zeros(1))


def test_a_session_runtime_refuses_bfloat16_inputs_and_keeps_the_file(tmp_path: Path) -> None:
    runtime = Adding()
    with pytest.raises(ConfigError, match="runtime adding cannot take bfloat16 inputs.*--runtime torch"):
        runtime.use_file(tmp_path / "model.onnx", InputSpec("bfloat16", (4,)))
    runtime.use_file(tmp_path / "model.onnx", InputSpec("float32", (4,)))
    assert runtime.path == tmp_path / "model.onnx" and runtime.input == InputSpec("float32", (4,))
