"""The emulated runtime: its numbers, the busy board shared across forks, the wait, and no torch."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from packrat_daemon.wire.errors import ConfigError
from workers.models.cache import entry_dir
from workers.models.spec import EMULATED, InputSpec, available_runtimes
from workers.runtimes import make_runtime
from workers.runtimes.emulated import LATE_MAX_S, BusyBoard, EmulatedRuntime, Numbers, learn_shapes

REPO = Path(__file__).resolve().parents[3]
EARLY_MS = 1000.0 * LATE_MAX_S  # a worker ends its waits up to its learned wake-up lateness early


def numbers(latency_ms: float = 30.0, cores: int = 4, contention: tuple[float, ...] = (1.0, 1.0, 1.0, 1.0)) -> Numbers:
    return Numbers({1: (latency_ms, 2 * latency_ms, None), 2: (latency_ms / 2,)}, cores, contention, "test")


def test_numbers_round_trip_and_latencies(tmp_path: Path) -> None:
    path = tmp_path / "numbers.json"
    path.write_text(json.dumps(numbers().to_json()))
    read = Numbers.read(path)
    assert read == numbers()
    assert read.latency_s(1, 2) == pytest.approx(0.060)
    assert read.latency_s(2, 1) == pytest.approx(0.015)
    for threads, batch in [(1, 3), (1, 4), (3, 1), (1, 0)]:  # null, beyond the row, no row, no batch
        with pytest.raises(ValueError, match="no latency"):
            read.latency_s(threads, batch)


def test_unreadable_numbers_say_which_file(tmp_path: Path) -> None:
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(ConfigError, match="bad.json"):
        Numbers.read(tmp_path / "bad.json")


def test_slowdown_is_the_contention_then_time_sharing_beyond_the_cores() -> None:
    emulation = numbers(contention=(1.0, 1.1, 1.2, 1.5))
    assert [emulation.slowdown(busy) for busy in (0, 1, 2, 4)] == [1.0, 1.0, 1.1, 1.5]
    assert emulation.slowdown(8) == pytest.approx(3.0)  # 8 threads time-share 4 cores, at full contention


def _in_child(work: Callable[[], None]) -> int:
    pid = os.fork()
    if pid == 0:
        try:
            work()
        finally:
            os._exit(0)
    return pid


def test_the_busy_board_is_shared_by_forked_workers_and_sweeps_dead_ones() -> None:
    board = BusyBoard(slots=8)
    read_end, write_end = os.pipe()

    def busy_then_wait() -> None:
        board.claim()
        board.set(3)
        os.write(write_end, b"x")
        time.sleep(30)  # killed below while "busy", as a hung worker would be

    first, second = _in_child(busy_then_wait), _in_child(busy_then_wait)
    assert os.read(read_end, 1) + os.read(read_end, 1) == b"xx"
    assert board.busy() == 6
    os.kill(first, 9)
    os.waitpid(first, 0)
    assert board.busy() == 6  # the dead worker's slot still says busy until a worker claims a slot
    board.claim()
    assert board.busy() == 3
    os.kill(second, 9)
    os.waitpid(second, 0)


def _runtime(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, emulation: Numbers) -> EmulatedRuntime:
    """An emulated runtime loaded from cached shapes (learning them takes torch: see the slow test)."""
    monkeypatch.setenv("PACKRAT_CACHE_DIR", str(tmp_path / "cache"))
    shapes = {"input": InputSpec("float32", (5,)).to_json(), "output": {"dtype": "<f4", "shape": [3, 2]}}
    cached = entry_dir("builtin:tiny-mlp", None, EMULATED) / "shapes.json"
    cached.parent.mkdir(parents=True)
    cached.write_text(json.dumps(shapes))
    (tmp_path / "numbers.json").write_text(json.dumps(emulation.to_json()))
    runtime = make_runtime(f"{EMULATED}:{tmp_path / 'numbers.json'}")
    assert isinstance(runtime, EmulatedRuntime)
    assert runtime.load("builtin:tiny-mlp") == InputSpec("float32", (5,))
    return runtime


def _timed(runtime: EmulatedRuntime, rows: int) -> tuple[np.ndarray, float]:
    start = time.perf_counter()
    out = runtime.run(np.ones((rows, 5), np.float32))
    return out, (time.perf_counter() - start) * 1000.0


def test_a_call_waits_the_profiles_latency_and_answers_zeros_of_the_output_shape(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runtime = _runtime(tmp_path, monkeypatch, numbers(latency_ms=40.0))
    runtime.set_threads(1)
    out, elapsed = _timed(runtime, 2)
    assert out.shape == (2, 3, 2) and out.dtype == np.float32 and not out.any()
    assert 80.0 - EARLY_MS <= elapsed < 120.0  # L̂(1, 2) = 80 ms; a busy machine may wake it late
    runtime.set_threads(2)
    assert 20.0 - EARLY_MS <= _timed(runtime, 1)[1] < 45.0  # L̂(2, 1) = 20 ms
    assert runtime.board is not None and runtime.board.busy() == 0  # nothing left marked busy


def test_a_call_waits_longer_while_other_cores_are_busy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    runtime = _runtime(tmp_path, monkeypatch, numbers(latency_ms=40.0, contention=(1.0, 1.0, 1.5, 2.0)))
    runtime.set_threads(1)
    other = BusyBoard.__new__(BusyBoard)  # a second worker on the same board, as a fork would have it
    other.__dict__.update(runtime.board.__dict__)  # type: ignore[union-attr]
    other.claim()
    other.set(3)  # three more cores busy: four in all, factor 2
    assert 80.0 - EARLY_MS <= _timed(runtime, 1)[1] < 120.0
    other.set(0)
    assert 40.0 - EARLY_MS <= _timed(runtime, 1)[1] < 70.0


def test_a_worker_learns_how_late_it_wakes_and_ends_its_waits_on_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runtime = _runtime(tmp_path, monkeypatch, numbers(latency_ms=16.0))
    runtime.set_threads(1)
    sleep = time.sleep
    monkeypatch.setattr(time, "sleep", lambda seconds: sleep(seconds + 0.001))  # every wake-up 1 ms late
    for _ in range(5):
        _timed(runtime, 1)
    settled = statistics.median(_timed(runtime, 1)[1] for _ in range(7))
    assert 16.0 - EARLY_MS <= settled < 16.6  # not 17 ms and more: the lateness is learned and waited less


def test_the_emulated_runtime_needs_the_daemons_numbers_and_is_no_auto_candidate() -> None:
    assert EMULATED not in available_runtimes()
    runtime = make_runtime(EMULATED)
    assert runtime.pins is False
    with pytest.raises(ConfigError, match="--runtime emulated --profile"):
        runtime.load("builtin:tiny-mlp")


@pytest.mark.slow
def test_the_template_and_the_emulated_workers_import_no_torch() -> None:
    code = "import sys, workers.template, workers.runtimes.emulated; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], cwd=REPO, check=False).returncode == 0


@pytest.mark.slow
def test_shapes_are_learned_once_by_a_throwaway_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PACKRAT_CACHE_DIR", str(tmp_path))
    shapes = learn_shapes("builtin:tiny-mlp", None)
    assert shapes["output"]["shape"] and len(shapes["input"]["shape"]) == 1
    assert (entry_dir("builtin:tiny-mlp", None, EMULATED) / "shapes.json").is_file()
    start = time.perf_counter()
    assert learn_shapes("builtin:tiny-mlp", None) == shapes
    assert time.perf_counter() - start < 0.5  # the cache, not another process with torch
