"""The measuring bench on real workers: cells side by side or alone, which workers stay alive, plans
compared in one run, and a bfloat16 model measured like any other."""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from packrat_daemon.fleet.backend import Backend, ModelInfo
from packrat_daemon.fleet.pool import WorkerState
from packrat_daemon.measure.bench import Bench, default_grid, model_session
from policies.planning.topology import Topology

TWO_CORES = Topology.synthetic(2)


@pytest.fixture(scope="module")
def tiny_mlp() -> Iterator[tuple[Backend, ModelInfo]]:
    with model_session("builtin:tiny-mlp") as session:
        yield session


def live_threads(bench: Bench) -> dict[int, int]:
    """Thread count → how many cell workers of that count are alive."""
    return {t: sum(w.state is WorkerState.READY for w in live.workers) for t, live in bench._cell_workers.items()}


@pytest.mark.slow
def test_a_cell_runs_side_by_side_on_every_core_and_moves_on_with_its_thread_count(
    tiny_mlp: tuple[Backend, ModelInfo],
) -> None:
    backend, info = tiny_mlp
    bench = Bench(backend, TWO_CORES, info)
    try:
        cell = bench.measure_cell(1, 4)
        assert 3 <= cell.samples <= 7 and 0 < cell.latency_ms < 1000
        assert cell.p90_ms is not None and cell.p90_ms >= cell.latency_ms
        assert live_threads(bench) == {1: 2}  # two 1-thread workers fill the two cores
        bench.measure_cell(1, 2)
        assert live_threads(bench) == {1: 2}  # the same workers measure the next batch
        bench.measure_cell(2, 4)
        assert live_threads(bench) == {2: 1}  # the 1-thread workers were stopped first
    finally:
        bench.close()
    assert bench._cell_workers == {}


@pytest.mark.slow
def test_alone_one_worker_per_thread_count_and_kept_when_asked(tiny_mlp: tuple[Backend, ModelInfo]) -> None:
    backend, info = tiny_mlp
    bench = Bench(backend, TWO_CORES, info, repeats=1, side_by_side=False, keep_workers=True)
    try:
        assert bench.measure_cell(1, 2).samples >= 1
        bench.measure_cell(2, 2)
        assert live_threads(bench) == {1: 1, 2: 1}
        first = bench._cell_workers[1].workers[0]
        bench.measure_cell(1, 8)
        assert bench._cell_workers[1].workers[0] is first  # returning to a thread count forks nothing
    finally:
        bench.close()


@pytest.mark.slow
def test_plans_are_compared_in_one_interleaved_run(tiny_mlp: tuple[Backend, ModelInfo]) -> None:
    backend, info = tiny_mlp
    bench = Bench(backend, TWO_CORES, info)
    timings = bench.compare({"split": [(1, 2), (1, 2)], "alone": [(2, 4)]}, rounds=3)
    assert timings["split"].instances == ((1, 2), (1, 2)) and timings["alone"].instances == ((2, 4),)
    for timing in timings.values():
        assert timing.rounds == 3
        assert timing.latency_ms == pytest.approx(max(timing.per_instance_ms), rel=0.5)
        assert 0 < timing.latency_ms <= timing.wall_ms
    assert not [w for w in bench.pool.workers.values() if w.state is not WorkerState.DEAD]  # all stopped


@pytest.mark.slow
def test_a_bfloat16_model_is_measured(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Regression: the daemon's sample inputs could not make bfloat16 ("data type 'bfloat16' not
    # understood"), so every measurement of a bfloat16 model failed before a worker ran it.
    (tmp_path / "bf16_models.py").write_text(
        textwrap.dedent(
            """
            import torch
            from torch import nn

            class Bf16Linear(nn.Module):
                packrat_input = "bfloat16:8"

                def __init__(self) -> None:
                    super().__init__()
                    self.linear = nn.Linear(8, 4).to(torch.bfloat16)

                def forward(self, x: torch.Tensor) -> torch.Tensor:
                    return self.linear(x).float()  # numpy, and so the wire, has no bfloat16 output

            def bf16_linear() -> nn.Module:
                return Bf16Linear()
            """
        )
    )
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}:{Path(__file__).resolve().parents[3]}")
    with model_session("bf16_models:bf16_linear") as (backend, info):
        assert info.dtype == "bfloat16"
        bench = Bench(backend, TWO_CORES, info, repeats=1)
        try:
            cell = bench.measure_cell(1, 2)
        finally:
            bench.close()
    assert cell.samples >= 1 and 0 < cell.latency_ms < 1000


def test_the_default_grid_doubles_batches_up_to_the_largest() -> None:
    assert default_grid(3, 16) == ([1, 2, 3], [1, 2, 4, 8, 16])
    assert default_grid(2, 12) == ([1, 2], [1, 2, 4, 8, 12])
    assert default_grid(1, 1) == ([1], [1])
