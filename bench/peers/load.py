"""The one client every peer gets (harness side, .venv): closed loop at a concurrency, or open-loop Poisson at a
rate, over TorchServe's REST API, the Open Inference Protocol's REST API (binary data) or Packrat's ZeroMQ client.

Latency is timed from just before a request is sent to its whole reply read; errors (a non-200 status, a reply of
the wrong size, a timeout, a refused connection) are counted by kind and never timed.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import numpy as np
from payload import expected_output_bytes, make_input, oip_request

try:
    import aiohttp
except ImportError as exc:  # pragma: no cover - the test extras install it (tritonclient[http])
    raise SystemExit(f"bench/peers needs aiohttp in Packrat's .venv: .venv/bin/pip install aiohttp ({exc})") from exc

import packrat_peer  # noqa: F401  (puts the repository on sys.path, for the ZeroMQ client)


def percentiles(latencies_ms: list[float]) -> dict[str, float | None]:
    if not latencies_ms:
        return {"p50": None, "p90": None, "p99": None}
    values = np.asarray(latencies_ms)
    return {f"p{q}": round(float(np.percentile(values, q)), 2) for q in (50, 90, 99)}


class Sender:
    """Sends one prepared request to one target; `await send()` returns None on success or an error's name."""

    def __init__(self, target: dict[str, Any], model: str, batch: int, timeout_s: float) -> None:
        self.target, self.timeout_s = target, timeout_s
        self.array = make_input(model, batch)
        self.expected = expected_output_bytes(model, batch)
        self.kind = target["kind"]
        self.session: aiohttp.ClientSession | None = None
        self.client: Any = None
        if self.kind == "oip":
            self.body, self.headers = oip_request(self.array)
        elif self.kind == "torchserve":
            self.body, self.headers = self.array.tobytes(), {"Content-Type": "application/octet-stream"}

    async def open(self) -> None:
        if self.kind == "zmq":
            from packrat_daemon.wire.client import AsyncClient

            self.client = AsyncClient(self.target["endpoint"], timeout=self.timeout_s)
        else:
            connector = aiohttp.TCPConnector(limit=0, force_close=False)
            self.session = aiohttp.ClientSession(
                connector=connector, timeout=aiohttp.ClientTimeout(total=self.timeout_s)
            )

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()
        if self.client is not None:
            self.client.close()

    async def send(self) -> str | None:
        try:
            if self.kind == "zmq":
                out = await self.client.infer(self.array)
                return None if out.nbytes == self.expected else "WRONG_SIZE"
            assert self.session is not None
            async with self.session.post(self.target["url"], data=self.body, headers=self.headers) as reply:
                data = await reply.read()
                if reply.status != 200:
                    return f"HTTP_{reply.status}"
                header = reply.headers.get("Inference-Header-Content-Length")
                size = len(data) - int(header) if header is not None else len(data)
                return None if size == self.expected else "WRONG_SIZE"
        except TimeoutError:
            return "CLIENT_TIMEOUT"
        except Exception as exc:  # noqa: BLE001 - every failure is counted under its own name
            return getattr(exc, "code", None) or type(exc).__name__


async def _timed(sender: Sender, latencies: list[float], errors: dict[str, int]) -> None:
    began = time.perf_counter()
    error = await sender.send()
    if error is None:
        latencies.append((time.perf_counter() - began) * 1000.0)
    else:
        errors[error] = errors.get(error, 0) + 1


def _report(latencies: list[float], errors: dict[str, int], window_s: float, batch: int) -> dict[str, Any]:
    ok = len(latencies)
    return {
        "sent": ok + sum(errors.values()),
        "ok": ok,
        "errors": errors,
        "throughput_rps": round(ok / window_s, 3) if window_s > 0 else None,
        "samples_per_s": round(ok * batch / window_s, 3) if window_s > 0 else None,
        "latency_ms": percentiles(latencies),
        "window_s": round(window_s, 2),
    }


async def closed_loop(sender: Sender, concurrency: int, duration_s: float, warmup_s: float) -> dict[str, Any]:
    """`concurrency` clients back to back for `duration_s` (after `warmup_s` of the same, not counted)."""
    latencies: list[float] = []
    errors: dict[str, int] = {}

    async def client(until: float, sink: list[float], errs: dict[str, int]) -> None:
        while time.perf_counter() < until:
            await _timed(sender, sink, errs)

    if warmup_s > 0:
        until = time.perf_counter() + warmup_s
        await asyncio.gather(*(client(until, [], {}) for _ in range(concurrency)))
    began = time.perf_counter()
    until = began + duration_s
    await asyncio.gather(*(client(until, latencies, errors) for _ in range(concurrency)))
    return {
        "mode": "closed",
        "concurrency": concurrency,
        **_report(latencies, errors, time.perf_counter() - began, len(sender.array)),
    }


async def open_loop(sender: Sender, rate: float, duration_s: float, seed: int, warmup_s: float) -> dict[str, Any]:
    """Poisson arrivals at `rate` requests/s: exactly round(rate × duration) requests at exponential gaps, each
    sent at its time whether or not the earlier ones were answered."""
    if warmup_s > 0:
        await closed_loop(sender, 1, warmup_s, 0.0)
    count = max(1, round(rate * duration_s))
    gaps = np.random.default_rng(seed).exponential(1.0 / rate, size=count)
    times = np.cumsum(gaps) - gaps[0]
    latencies: list[float] = []
    errors: dict[str, int] = {}
    lags: list[float] = []
    tasks = []
    began = time.perf_counter()
    for at in times:
        delay = began + float(at) - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        lags.append((time.perf_counter() - began - float(at)) * 1000.0)
        tasks.append(asyncio.create_task(_timed(sender, latencies, errors)))
    await asyncio.wait(tasks, timeout=sender.timeout_s + 5.0)
    for task in tasks:
        if not task.done():
            task.cancel()
            errors["UNFINISHED"] = errors.get("UNFINISHED", 0) + 1
    window = max(time.perf_counter() - began, duration_s)
    report = _report(latencies, errors, window, len(sender.array))
    return {"mode": "poisson", "rate_rps": rate, "send_lag_p99_ms": round(float(np.percentile(lags, 99)), 2), **report}


async def measure(
    target: dict[str, Any],
    model: str,
    batch: int,
    point: dict[str, Any],
    duration_s: float,
    warmup_s: float,
    timeout_s: float,
    seed: int = 0,
) -> dict[str, Any]:
    """One point (closed loop {"concurrency": N} or Poisson {"rate": R}) against one target."""
    sender = Sender(target, model, batch, timeout_s)
    await sender.open()
    try:
        if "concurrency" in point:
            return await closed_loop(sender, int(point["concurrency"]), duration_s, warmup_s)
        return await open_loop(sender, float(point["rate"]), duration_s, seed, warmup_s)
    finally:
        await sender.close()
