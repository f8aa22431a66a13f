"""A model that hangs on some inputs (issue 27, 9): a real daemon, a busy hang on marked inputs batched with
innocent ones. The hung request is answered with an error naming the hang, never re-sent to hang worker after
worker; every innocent request of its batch gets its result."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from packrat_daemon.wire.client import AsyncClient
from packrat_daemon.wire.errors import InternalError
from tests.helpers.daemons import running_daemon

MARKED = -5000.0  # tests/model_factories.py's HangsOnMarked spins on a value of -1000 or less


@pytest.mark.slow
def test_a_hang_fails_only_its_own_request_without_a_profile(tmp_path: Path) -> None:
    # --policy fixed and no profile: no prediction, so the slice's deadline is the job timeout. Before: the hung
    # worker was replaced at the job timeout and its slice re-sent to the next worker, which hung again; with
    # one worker the batch was answered "every worker died while serving this batch, twice", innocents included.
    args = ["--model", "tests.model_factories:hangs_on_marked_inputs", "--policy", "fixed", "--plan", "1x4",
            "--max-batch", "4", "--max-delay-ms", "100", "--job-timeout-s", "1.5", "--no-adapt"]  # fmt: skip
    with running_daemon(tmp_path, *args) as (endpoint, process):

        async def mixed() -> tuple[list[object], object]:
            async with AsyncClient(endpoint, timeout=60) as client:
                calls = [client.infer(np.full((1, 16), MARKED if k == 1 else float(k), np.float32)) for k in range(4)]
                outcomes = await asyncio.gather(*calls, return_exceptions=True)
                after = await client.infer(np.full((1, 16), 3.0, np.float32))  # still serving, on a new worker
                return outcomes, after

        outcomes, after = asyncio.run(mixed())
        assert process.poll() is None
    assert isinstance(outcomes[1], InternalError) and "hung" in str(outcomes[1]), outcomes[1]
    for k in (0, 2, 3):  # batched with the hung one, then run again without it
        assert isinstance(outcomes[k], np.ndarray), (k, outcomes[k])
        np.testing.assert_array_equal(outcomes[k], np.full((1, 16), 2.0 * k, np.float32))
    np.testing.assert_array_equal(after, np.full((1, 16), 6.0, np.float32))
    log = (tmp_path / "daemon.log").read_text()
    assert log.count("has not answered its") <= 3, log  # the batch's slice, then the hung request alone: no more
