"""The grid: anchors where plans are decided, and filled rows that never contradict a measurement."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from packrat_daemon.search import Grid, fill_rows
from packrat_daemon.search.gp import Surrogate
from policies.planning.profile import Profile
from tests.helpers.replay_tables import BATCHES, GRID, THREADS, batch_limited, resnet50_table


def test_a_small_budget_spends_fewer_cells_on_anchors():
    grid = Grid(list(resnet50_table()), 2, [8, 16])
    assert len(grid.anchors(8)) == 3
    assert len(grid.anchors(44)) == 5
    # No plan for B >= 8 on 2 cores has its slowest instance below 4 inputs: no anchor there.
    assert all(b >= 4 for _, b in grid.anchors(44))


@settings(max_examples=25, deadline=None)
@given(
    picks=st.lists(st.integers(0, len(GRID) - 1), min_size=3, max_size=30, unique=True),
    jitter=st.floats(0.0, 0.2),
    seed=st.integers(0, 10_000),
)
def test_filled_rows_are_positive_monotone_and_keep_measurements(picks: list[int], jitter: float, seed: int):
    rng = np.random.default_rng(seed)
    measured = {GRID[k]: batch_limited(*GRID[k]) * math.exp(jitter * rng.standard_normal()) for k in picks}
    grid = Grid(GRID, 16, [1024])
    mean, sigma = Surrogate(measured).predict(grid.cells)
    assert np.all(mean > 0) and np.all(np.isfinite(mean)) and np.all(sigma > 0)
    table = fill_rows(grid, measured, dict(zip(grid.cells, mean.tolist(), strict=True)))
    assert set(table) == set(GRID)
    for cell, value in measured.items():
        assert table[cell] == value
    for t in THREADS:
        row = [table[(t, b)] for b in BATCHES]
        assert all(v > 0 for v in row)
        for j, b in enumerate(BATCHES):
            if (t, b) not in measured:  # a filled cell never undercuts anything to its left
                assert row[j] >= max(row[:j], default=0.0)
    Profile.from_latencies(table)  # valid: positive and finite everywhere
