"""An innocent client under attack: requests in a loop, every outcome timed (bench/faults.py, bench/attacks.py)."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import numpy as np

from packrat_daemon.wire.client import AsyncClient, ClientTimeout, ServerError


class Load:
    """`concurrency` async requests in a loop on one client; every outcome with its send and reply time."""

    def __init__(self, endpoint: str, concurrency: int, timeout_s: float = 30.0) -> None:
        self.endpoint, self.concurrency, self.timeout_s = endpoint, concurrency, timeout_s
        self.outcomes: list[tuple[float, float, str]] = []  # (sent, answered, "ok" | error code | "lost")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    def start(self) -> Load:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    async def _run(self) -> None:
        x = np.ones((1, 16), dtype=np.float32)
        async with AsyncClient(self.endpoint, timeout=self.timeout_s) as client:

            async def one() -> None:
                while not self._stop.is_set():
                    sent = time.monotonic()
                    try:
                        await client.infer(x)
                        outcome = "ok"
                    except ServerError as exc:
                        outcome = exc.code
                    except ClientTimeout:
                        outcome = "lost"
                    self.outcomes.append((sent, time.monotonic(), outcome))

            await asyncio.gather(*(one() for _ in range(self.concurrency)))

    def longest_stall(self, start: float, end: float) -> float:
        """The longest time in [start, end] with a request waiting and no reply of any kind."""
        replies = sorted(answered for _, answered, outcome in self.outcomes if outcome != "lost")
        marks = [start] + [t for t in replies if start <= t <= end] + [end]
        return max(b - a for a, b in zip(marks, marks[1:], strict=False))

    def last_reply_before(self, when: float) -> float:
        """The time of the last reply before `when` (or `when`): a stall that a signal extends began there."""
        return max((answered for _, answered, outcome in self.outcomes if outcome != "lost" and answered <= when),
                   default=when)  # fmt: skip

    def summary(self, start: float, end: float) -> dict[str, Any]:
        window = [o for o in self.outcomes if start <= o[0] <= end]
        codes: dict[str, int] = {}
        for _, _, outcome in window:
            codes[outcome] = codes.get(outcome, 0) + 1
        return {
            "requests": len(window),
            "answered_ok": codes.pop("ok", 0),
            "lost": codes.pop("lost", 0),
            "typed_errors": codes,
            "longest_stall_s": round(self.longest_stall(start, end), 3),
        }
