"""A model that hangs on some inputs (issue 27, 9): a real daemon, a busy or a sleeping hang on marked inputs batched
with innocent ones. The hung request is answered with an error naming the hang, never re-sent to hang worker after
worker; every innocent request of its batch gets its result. A request that is only slow (late by the wall clock,
using little CPU, as on a loaded machine) is answered its result, not taken for a hang."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from packrat_daemon.wire.client import AsyncClient
from packrat_daemon.wire.errors import InternalError
from tests.helpers.daemons import running_daemon
from tests.model_factories import StallsOnMarked

MARKED = -5000.0  # tests/model_factories.py's HangsOnMarked spins on a value of -1000 or less


def batched_with(endpoint: str, marked: float) -> list[object]:
    """Four one-input requests sent at once (one batch), the second holding `marked`: their outcomes."""

    async def send() -> list[object]:
        async with AsyncClient(endpoint, timeout=60) as client:
            calls = [client.infer(np.full((1, 16), marked if k == 1 else float(k), np.float32)) for k in range(4)]
            return await asyncio.gather(*calls, return_exceptions=True)

    return asyncio.run(send())


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
    # Told from what its shape took in production (the workers' warm-ups, the answers), not at the job timeout as
    # before: every innocent request in the hung slice waited that long.
    assert "in production" in str(outcomes[1]) and "job timeout" not in str(outcomes[1]), outcomes[1]
    for k in (0, 2, 3):  # batched with the hung one, then run again without it
        assert isinstance(outcomes[k], np.ndarray), (k, outcomes[k])
        np.testing.assert_array_equal(outcomes[k], np.full((1, 16), 2.0 * k, np.float32))
    np.testing.assert_array_equal(after, np.full((1, 16), 6.0, np.float32))
    log = (tmp_path / "daemon.log").read_text()
    # The batch's slice, then the hung request alone: no more, and never a hung slice re-sent to another worker.
    assert log.count("the batch is given up") == 2 and "sending the rows to another worker" not in log, log


@pytest.mark.slow
def test_a_slow_request_gets_its_result_and_a_sleeping_or_spinning_hang_fails_only_its_own(tmp_path: Path) -> None:
    # Each batch is predicted 25 ms: its deadline is serve's floor, 1 s, and so is its CPU budget (one thread). Before,
    # a slice past its deadline was given up whatever its CPU did: the slow request (2.5 s, half a CPU second) was
    # given up in its batch, run alone, given up again and answered INTERNAL, as on a loaded machine.
    profile = tmp_path / "profile.csv"
    profile.write_text("threads,batch,latency_ms\n1,1,25\n1,2,25\n1,4,25\n")
    args = ["--model", "tests.model_factories:stalls_on_marked_inputs", "--policy", "fixed", "--plan", "1x4",
            "--max-batch", "4", "--max-delay-ms", "100", "--profile", str(profile), "--no-adapt"]  # fmt: skip
    with running_daemon(tmp_path, *args) as (endpoint, process):
        slow = batched_with(endpoint, StallsOnMarked.SLOW)
        log = tmp_path / "daemon.log"
        given_up_when_slow = log.read_text().count("the batch is given up")
        sleeping = batched_with(endpoint, StallsOnMarked.SLEEP)
        spinning = batched_with(endpoint, StallsOnMarked.SPIN)
        assert process.poll() is None
    for outcomes, marked in ((slow, StallsOnMarked.SLOW), (sleeping, None), (spinning, None)):
        for k in (0, 1, 2, 3):
            if k == 1 and marked is None:
                assert isinstance(outcomes[1], InternalError) and "hung" in str(outcomes[1]), outcomes[1]
                continue
            value = marked if k == 1 and marked is not None else float(k)
            assert isinstance(outcomes[k], np.ndarray), (k, outcomes[k])
            np.testing.assert_array_equal(outcomes[k], np.full((1, 16), 2.0 * value, np.float32))
    assert given_up_when_slow == 0
    text = log.read_text()
    assert "replaced only once its CPU time stops" in text  # the slow slice, looked at past its deadline
    assert "its CPU time stopped" in str(sleeping[1]) and "it spins" in str(spinning[1])
    assert text.count("the batch is given up") == 4  # each hang: its batch, then the hung request alone


@pytest.mark.slow
def test_a_hang_holds_one_worker_while_the_others_serve(tmp_path: Path) -> None:
    # Two workers, no profile: a slice's deadline is the job timeout. Before, the one batch in flight waited for the
    # hung slice, then the hung request's run alone held it again: every client waited twice the timeout. Now the
    # hung batch moves aside once late (past the hedge floor, a typical slice having been answered), and the run
    # alone runs aside too, on a worker the batches can spare.
    args = ["--model", "tests.model_factories:hangs_on_marked_inputs", "--policy", "fixed", "--plan", "2*1x2",
            "--max-batch", "4", "--max-delay-ms", "100", "--job-timeout-s", "1.5", "--no-adapt"]  # fmt: skip
    with running_daemon(tmp_path, *args) as (endpoint, process):

        async def traffic() -> tuple[list[object], list[object]]:
            async with AsyncClient(endpoint, timeout=60) as client:
                await client.infer(np.full((1, 16), 3.0, np.float32))  # a slice's typical time, from its answer
                marked = asyncio.ensure_future(client.infer(np.full((1, 16), MARKED, np.float32)))
                innocent: list[object] = []
                while not marked.done():  # one after another while the marked request hangs
                    innocent.append(await client.infer(np.full((1, 16), 3.0, np.float32)))
                return [await asyncio.gather(marked, return_exceptions=True)][0], innocent

        marked, innocent = asyncio.run(traffic())
        assert process.poll() is None
    assert isinstance(marked[0], InternalError) and "hung" in str(marked[0]), marked
    assert innocent and all(isinstance(o, np.ndarray) and (o == 6.0).all() for o in innocent), innocent
    log = (tmp_path / "daemon.log").read_text()
    assert "the batch moves aside" in log and "aside from the batches" in log, log
