"""The generator's loops against a stand-in client (no daemon): timing, bounds, and every request accounted."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from packrat_daemon.load import generator as generator_module
from packrat_daemon.load.arrivals import BatchMix, Poisson, open_loop_schedule
from packrat_daemon.load.generator import Generator, Inputs, LoadSpec
from packrat_daemon.load.lengths import Uniform
from packrat_daemon.wire.errors import BadRequest, ClientTimeout, ConfigError, Overloaded

INFO = {"input": {"dtype": "float32", "shape": [3], "high": None}, "max_batch": 32}


class StandInClient:
    """Answers after `service_s`; `outcome(n)` may raise for the n-th call (from 0). Records what it saw."""

    def __init__(self, service_s: float = 0.0, outcome: Callable[[int], None] | None = None) -> None:
        self.service_s = service_s
        self.outcome = outcome
        self.calls: list[tuple[float, int, str | None]] = []
        self.in_flight = 0
        self.most_in_flight = 0

    async def infer(self, array: np.ndarray, *, timeout: float, dtype: str | None = None) -> np.ndarray:
        index = len(self.calls)
        self.calls.append((time.perf_counter(), array.shape[0], dtype))
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await asyncio.sleep(self.service_s)
            if self.outcome is not None:
                self.outcome(index)
            return np.zeros((array.shape[0], 2), np.float32)
        finally:
            self.in_flight -= 1


def run(client: Any, spec: LoadSpec, info: dict[str, Any] = INFO) -> Any:
    async def go() -> Any:
        largest = spec.mix.largest
        return await Generator(client, Inputs(info, largest), progress=False).run(spec)

    return asyncio.run(go())


@pytest.mark.slow
def test_open_loop_sends_on_schedule_whatever_the_replies():
    client = StandInClient(service_s=0.05)  # slower than the gaps: an open loop does not wait
    spec = LoadSpec(mix=BatchMix.parse("1:0.5,4:0.5"), process=Poisson(200.0), duration_s=1.5, seed=3)
    tally = run(client, spec)
    schedule = open_loop_schedule(spec.process, spec.mix, duration_s=1.5, rng=random.Random(3))
    assert tally.sent == len(schedule) == len(client.calls) == tally.ok
    assert [samples for _, samples, _ in client.calls] == [samples for _, samples in schedule]
    assert client.most_in_flight > 3
    # A loop that waited for each reply would send for 300 × 50 ms = 15 s and fall ever further behind; the
    # bounds leave room for a starved CPU (the suite runs beside other work) and none for waiting.
    assert tally.send_window_s == pytest.approx(1.5, abs=0.5)
    assert tally.sent / tally.send_window_s == pytest.approx(len(schedule) / 1.5, rel=0.25)
    assert float(np.median(tally.lags_s)) < 0.1 and max(tally.lags_s) < 1.0


def test_every_sent_request_ends_as_ok_or_an_error_by_code():
    def outcome(index: int) -> None:
        if index % 5 == 4:
            raise ClientTimeout("no reply")
        if index % 3 == 2:
            raise Overloaded("OVERLOADED", "queue full")

    client = StandInClient(outcome=outcome)
    tally = run(client, LoadSpec(mix=BatchMix.single(2), concurrency=2, requests=30))
    expected_timeouts = sum(1 for i in range(30) if i % 5 == 4)
    expected_overloaded = sum(1 for i in range(30) if i % 5 != 4 and i % 3 == 2)
    assert tally.sent == 30
    assert dict(tally.errors) == {"CLIENT_TIMEOUT": expected_timeouts, "OVERLOADED": expected_overloaded}
    assert tally.ok == 30 - expected_timeouts - expected_overloaded
    assert len(tally.latencies_s) == tally.ok  # errors are not timed


def test_requests_still_in_flight_at_the_end_are_cancelled_and_counted(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(generator_module, "FINAL_GRACE_S", 0.05)

    class Stuck(StandInClient):
        async def infer(self, array: np.ndarray, *, timeout: float, dtype: str | None = None) -> np.ndarray:
            await asyncio.Event().wait()  # a client that ignores its own timeout
            raise AssertionError("unreachable")

    spec = LoadSpec(mix=BatchMix.single(1), process=Poisson(100.0), requests=5, timeout_s=0.05)
    started = time.perf_counter()
    tally = run(Stuck(), spec)
    assert time.perf_counter() - started < 2.0
    assert tally.sent == 5 and tally.ok == 0 and dict(tally.errors) == {"UNFINISHED": 5}


def test_closed_loop_keeps_n_requests_in_flight_and_stops_at_its_count():
    client = StandInClient(service_s=0.005)
    tally = run(client, LoadSpec(mix=BatchMix.single(4), concurrency=3, requests=31))
    assert tally.sent == tally.ok == len(client.calls) == 31
    assert client.most_in_flight == 3


def test_closed_loop_stops_at_its_duration():
    client = StandInClient(service_s=0.01)
    started = time.perf_counter()
    tally = run(client, LoadSpec(mix=BatchMix.single(1), concurrency=2, duration_s=0.4))
    assert 0.4 <= time.perf_counter() - started < 1.0
    assert tally.sent == tally.ok and 10 < tally.sent < 90


def test_a_closed_loop_needs_a_bound():
    with pytest.raises(ConfigError, match="duration or a number of requests"):
        LoadSpec(mix=BatchMix.single(1))


def test_warm_up_sends_every_size_of_the_mix():
    client = StandInClient()

    async def go() -> Any:
        generator = Generator(client, Inputs(INFO, 32), progress=False)
        return await generator.warm_up(LoadSpec(mix=BatchMix.parse("1:1,8:1,32:1"), requests=1), 0.05)

    tally = asyncio.run(go())
    assert {samples for _, samples, _ in client.calls} == {1, 8, 32}
    assert tally.sent == tally.ok >= 3


def test_inputs_match_the_model_and_refuse_requests_over_max_batch():
    inputs = Inputs(INFO, 8)
    assert inputs.rows(5).shape == (5, 3) and inputs.rows(5).dtype == np.float32
    with pytest.raises(ConfigError, match="max_batch 32"):
        Inputs(INFO, 33)
    bf16 = {"input": {"dtype": "bfloat16", "shape": [2], "high": None}, "max_batch": 4}
    client = StandInClient()
    run(client, LoadSpec(mix=BatchMix.single(2), requests=1), info=bf16)
    assert client.calls[0][2] == "bfloat16"  # raw bits as uint16, labelled for the wire


@pytest.mark.parametrize(
    "spec",
    [
        LoadSpec(mix=BatchMix.single(1), process=Poisson(100.0), duration_s=5.0),
        LoadSpec(mix=BatchMix.single(1), concurrency=3, duration_s=5.0),
    ],
)
def test_a_cancelled_run_stops_and_still_adds_up(spec: LoadSpec):
    client = StandInClient(service_s=0.1)

    async def go() -> Any:
        run_task = asyncio.create_task(Generator(client, Inputs(INFO, 1), progress=False).run(spec))
        await asyncio.sleep(0.25)  # some requests answered, some in flight
        run_task.cancel()  # what asyncio.run does on Ctrl-C
        return await run_task

    started = time.perf_counter()
    tally = asyncio.run(go())
    assert time.perf_counter() - started < 1.5
    assert tally.interrupted and tally.send_window_s == pytest.approx(0.25, abs=0.15)
    assert tally.sent == tally.ok + sum(tally.errors.values())
    assert tally.ok > 0 and tally.errors["UNFINISHED"] > 0 and set(tally.errors) == {"UNFINISHED"}


class NamedStandIn(StandInClient):
    """Takes named arrays, as a model of several inputs; refuses the first two requests as its server would."""

    def __init__(self) -> None:
        super().__init__()
        self.requests: list[Any] = []

    async def infer(self, array: Any, *, timeout: float, dtype: Any = None) -> Any:
        self.requests.append(array)
        if len(self.requests) <= 2:
            raise BadRequest("BAD_REQUEST", f"input 'b' is missing ({len(self.requests)})")
        return {"sum": np.zeros((len(next(iter(array.values()))), 4), np.float32)}


def test_a_model_of_two_inputs_is_sent_both_by_name_and_the_server_s_message_kept():
    info = {"input": {"dtype": "float32", "shape": [4]}, "max_batch": 8,
            "inputs": [{"name": n, "dtype": "float32", "shape": [4], "high": None} for n in ("a", "b")]}  # fmt: skip
    client = NamedStandIn()
    tally = run(client, LoadSpec(mix=BatchMix.parse("1:1,4:1"), requests=12, seed=1), info=info)
    assert tally.sent == 12 and tally.ok == 10 and dict(tally.errors) == {"BAD_REQUEST": 2}
    assert tally.messages == {"BAD_REQUEST": "input 'b' is missing (1)"}
    assert all(list(request) == ["a", "b"] for request in client.requests)
    assert {request["a"].shape[0] for request in client.requests} == {1, 4}


def test_with_lengths_each_request_carries_its_length_and_its_tokens_are_counted():
    info = {"input": {}, "max_batch": 4, "inputs": [{"name": "ids", "dtype": "int64", "shape": [-1], "high": 50,
            "max_length": 64, "min_length": 1}]}  # fmt: skip
    client = StandInClient()

    async def go() -> Any:
        inputs = Inputs(info, 2, lengths=Uniform(3, 64))
        return await Generator(client, inputs, progress=False).run(LoadSpec(mix=BatchMix.single(2), requests=40))

    tally = asyncio.run(go())
    assert tally.ok == 40
    lengths = Inputs(info, 2, lengths=Uniform(3, 64))
    expected = [lengths.length() for _ in range(40)]
    assert tally.tokens_ok == 2 * sum(expected)  # type: ignore[arg-type]
