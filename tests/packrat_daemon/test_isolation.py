"""One bad input fails only its own request (issue 27, 7): a real daemon, a model that raises on some inputs,
poisoned requests batched with innocent ones; every innocent request gets its result."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from packrat_daemon.wire.client import AsyncClient
from packrat_daemon.wire.errors import InternalError
from tests.helpers.daemons import running_daemon


@pytest.mark.slow
def test_poisoned_requests_batched_with_innocent_ones_fail_alone(tmp_path: Path) -> None:
    args = ["--model", "tests.model_factories:poisoned_by_large_values", "--policy", "fixed", "--plan", "1x8",
            "--max-batch", "8", "--max-delay-ms", "50"]  # fmt: skip
    with running_daemon(tmp_path, *args) as (endpoint, _):

        async def mixed() -> list[object]:
            async with AsyncClient(endpoint, timeout=60) as client:
                calls = []
                for k in range(24):
                    x = np.full((1, 16), 5000.0 if k % 4 == 0 else float(k), dtype=np.float32)
                    calls.append(client.infer(x))
                return await asyncio.gather(*calls, return_exceptions=True)

        outcomes = asyncio.run(mixed())
    for k, outcome in enumerate(outcomes):
        if k % 4 == 0:
            assert isinstance(outcome, InternalError), outcome
        else:  # innocent: batched with a poisoned one, re-run without it
            assert isinstance(outcome, np.ndarray), (k, outcome)
            np.testing.assert_array_equal(outcome, np.full((1, 16), 2.0 * k, dtype=np.float32))
