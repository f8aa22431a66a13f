"""Sending the traffic: open loop (a schedule of arrivals) or closed loop (N clients, each waiting for its
reply before the next request), on one `AsyncClient`.

Open loop sends each request at its scheduled time whether or not earlier ones were answered, so a slow
server meets more traffic, as it would in production. Every loop here is bounded twice: by its count
(the schedule, or `requests`) and by time (the duration, each request's timeout, and a final wait for
what is still in flight, after which the rest is cancelled and counted `UNFINISHED`). A run that is
cancelled (Ctrl-C) stops sending, counts what is in flight as `UNFINISHED` and returns its tally, marked
`interrupted`, so the report still adds up.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from packrat_daemon.load.arrivals import ArrivalProcess, BatchMix, Trace, open_loop_schedule
from packrat_daemon.load.inputs import Inputs
from packrat_daemon.load.report import CLIENT_CLOSED, CLIENT_TIMEOUT, UNFINISHED, Tally
from packrat_daemon.ops.progress import Progress
from packrat_daemon.wire.client import AsyncClient
from packrat_daemon.wire.codec import ProtocolError
from packrat_daemon.wire.errors import ClientClosed, ClientTimeout, ConfigError, PackratError, ServerError

# Beyond each request's own timeout, how long the end of a run waits for replies before cancelling them.
FINAL_GRACE_S = 5.0
PROGRESS_EVERY_S = 1.0
# The warm-up's count bound, beside its time: a tiny model answers in well under a millisecond.
WARM_UP_MAX_REQUESTS = 100_000


@dataclass(frozen=True)
class LoadSpec:
    """What to send: open loop when `process` is set, otherwise closed loop with `concurrency` clients."""

    mix: BatchMix
    process: ArrivalProcess | None = None
    concurrency: int = 1
    duration_s: float | None = None
    requests: int | None = None
    timeout_s: float = 30.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.process is None and self.duration_s is None and self.requests is None:
            raise ConfigError("a closed loop needs a duration or a number of requests")
        if self.concurrency < 1:
            raise ConfigError(f"the concurrency must be at least 1, got {self.concurrency}")

    def describe(self) -> str:
        if self.process is None:
            return f"closed loop, concurrency {self.concurrency}, samples {self.mix.describe()}"
        if isinstance(self.process, Trace):
            return f"{self.process.describe()}, samples as recorded"
        return f"{self.process.describe()}, samples {self.mix.describe()}"


def error_message(exc: PackratError) -> str:
    """What a failed request's error says: the server's own message, or the client's."""
    return exc.message if isinstance(exc, ServerError | ProtocolError) else str(exc)


def error_code(exc: PackratError) -> str:
    """The code a failed request is counted under: the server's, or what the client itself saw."""
    if isinstance(exc, ServerError | ProtocolError):
        return str(exc.code)
    if isinstance(exc, ClientTimeout):
        return CLIENT_TIMEOUT
    if isinstance(exc, ClientClosed):
        return CLIENT_CLOSED
    return type(exc).__name__


class Generator:
    """Runs load specs against one daemon through `client`; each run returns its own `Tally`."""

    def __init__(self, client: AsyncClient, inputs: Inputs, *, progress: bool = True) -> None:
        self.client = client
        self.inputs = inputs
        self.progress = progress

    async def _one(self, tally: Tally, samples: int, timeout_s: float, due: float | None = None) -> None:
        # The caller counts the request as sent when it decides to send it, so one cancelled before it
        # ran is still sent and then counted UNFINISHED: sent = ok + errors holds in every case.
        length = self.inputs.length()
        request = self.inputs.request(samples, length)
        began = time.perf_counter()
        tally.sends.append((began - tally.started, samples))
        if due is not None:
            tally.lags_s.append(max(0.0, began - due))
        try:
            await self.client.infer(request, timeout=timeout_s, dtype=self.inputs.wire_dtype)
        except PackratError as exc:
            tally.failed(error_code(exc), time.perf_counter(), error_message(exc))
        else:
            now = time.perf_counter()
            tally.answered(now - began, samples, now, length)

    async def warm_up(self, spec: LoadSpec, seconds: float) -> Tally:
        """Closed loop for `seconds`, each size of the mix in turn: connections, workers' first calls and
        the allocator's pools are warm before anything is counted."""
        sizes = itertools.cycle(spec.mix.sizes)
        tally = Tally(started=time.perf_counter(), started_unix_s=time.time())
        end = tally.started + seconds
        clients = max(1, spec.concurrency)
        at_least = len(spec.mix.sizes)  # every size once, even past the time

        async def client_loop() -> None:
            while tally.sent < WARM_UP_MAX_REQUESTS and (time.perf_counter() < end or tally.sent < at_least):
                tally.sent += 1
                await self._one(tally, next(sizes), spec.timeout_s)

        await asyncio.gather(*(client_loop() for _ in range(clients)))
        return tally

    async def run(self, spec: LoadSpec) -> Tally:
        if spec.process is not None:
            schedule = open_loop_schedule(
                spec.process,
                spec.mix,
                duration_s=spec.duration_s,
                requests=spec.requests,
                rng=random.Random(spec.seed),
            )
            return await self._open_loop(spec, schedule)
        return await self._closed_loop(spec)

    async def _open_loop(self, spec: LoadSpec, schedule: list[tuple[float, int]]) -> Tally:
        tally = Tally(started=time.perf_counter(), started_unix_s=time.time())
        start = tally.started
        tasks: set[asyncio.Task[None]] = set()
        ticker = self._ticker(tally, len(schedule), lambda: tally.sent)

        async def send_all() -> None:
            for t, samples in schedule:
                due = start + t
                delay = due - time.perf_counter()
                # When behind, still yield once a request so the replies already in are read.
                await asyncio.sleep(max(delay, 0.0))
                tally.sent += 1
                task = asyncio.create_task(self._one(tally, samples, spec.timeout_s, due))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            await asyncio.sleep(0)  # let the last request leave before the sending window closes
            sending_end = max(time.perf_counter(), start + (spec.duration_s or 0.0))
            tally.send_window_s = sending_end - start
            if tasks:
                await asyncio.wait(set(tasks), timeout=spec.timeout_s + FINAL_GRACE_S)

        return await self._supervise(tally, send_all(), tasks, ticker)

    async def _closed_loop(self, spec: LoadSpec) -> Tally:
        tally = Tally(started=time.perf_counter(), started_unix_s=time.time())
        end = tally.started + spec.duration_s if spec.duration_s is not None else None
        rng = random.Random(spec.seed)
        # One shared count: `requests` in all, not per client. Without it the duration alone bounds the
        # loop, each request by its timeout.
        budget = iter(range(spec.requests)) if spec.requests is not None else itertools.count()
        if end is not None:
            total, done = max(1, round(spec.duration_s or 0)), lambda: int(time.perf_counter() - tally.started)
        else:
            total, done = spec.requests or 1, lambda: tally.sent
        ticker = self._ticker(tally, total, done)

        async def client_loop() -> None:
            while (end is None or time.perf_counter() < end) and next(budget, None) is not None:
                tally.sent += 1
                await self._one(tally, spec.mix.draw(rng), spec.timeout_s)

        clients = {asyncio.create_task(client_loop()) for _ in range(spec.concurrency)}

        async def run_clients() -> None:
            await asyncio.gather(*clients)
            tally.send_window_s = time.perf_counter() - tally.started

        return await self._supervise(tally, run_clients(), clients, ticker)

    async def _supervise(
        self, tally: Tally, body: Awaitable[None], tasks: set[asyncio.Task[None]], ticker: asyncio.Task[None]
    ) -> Tally:
        """Run a loop's `body`; Ctrl-C marks the tally interrupted; what is still running is cancelled."""
        try:
            await body
        except asyncio.CancelledError:
            self._interrupted(tally)
        finally:
            await self._cancel(tally, tasks)
            ticker.cancel()
        return tally

    @staticmethod
    def _interrupted(tally: Tally) -> None:
        """The run was cancelled (Ctrl-C under asyncio.run): it ends here and reports what it has."""
        tally.interrupted = True
        tally.send_window_s = time.perf_counter() - tally.started

    @staticmethod
    async def _cancel(tally: Tally, tasks: set[asyncio.Task[None]]) -> None:
        """Cancel what is still running; each request it leaves unanswered is counted UNFINISHED."""
        pending = [task for task in tasks if not task.done()]
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        now = time.perf_counter()
        for _ in range(tally.in_flight):
            tally.failed(UNFINISHED, now)

    def _ticker(self, tally: Tally, total: int, done: Callable[[], int]) -> asyncio.Task[None]:
        async def tick() -> None:
            progress = Progress(total, "load", enabled=self.progress)
            try:
                while True:
                    await asyncio.sleep(PROGRESS_EVERY_S)
                    progress.done = done()
                    progress.note(f"sent {tally.sent} ok {tally.ok} errors {sum(tally.errors.values())}")
            finally:
                progress.close()

        return asyncio.create_task(tick())
