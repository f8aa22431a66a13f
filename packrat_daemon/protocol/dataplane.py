"""The Open Inference Protocol's data plane, free of any transport: health, metadata, Triton's model
configuration and statistics extensions, and inference, each forwarded to the daemon over its own protocol.

The REST and gRPC frontends (`protocol.rest`, `protocol.grpc.server`) only turn their wire form into the
calls below and the answers (or `OipError`) back. The model's description (`protocol.model`) is learned from the
daemon (`protocol.discovery`): from its `info`, and its outputs' datatypes and shapes from one single-sample
inference when the daemon starts serving.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from packrat_daemon import __version__
from packrat_daemon.protocol.discovery import PROBE_TIMEOUT_S, described_differently, discover, followed
from packrat_daemon.protocol.errors import OipError, Status
from packrat_daemon.protocol.gateway_metrics import GatewayMetrics
from packrat_daemon.protocol.model import (
    VERSION,
    InferInput,
    InferResult,
    ModelSpec,
    TensorSpec,
    sendable_inputs,
    triton_config,
)
from packrat_daemon.protocol.stats import Statistics
from packrat_daemon.protocol.upstream import (
    BlockingUpstream,
    Upstream,
    UpstreamCancelled,
    UpstreamGone,
    UpstreamTimeout,
)
from packrat_daemon.wire.codec import ErrorCode

log = logging.getLogger("packrat.oip")

EXTENSIONS = ("binary_tensor_data", "model_configuration", "statistics")
# How long a readiness answer is reused: probes from many clients cost the daemon one `status` per window.
READY_TTL_S = 0.5
# Past the request's own timeout the daemon answers TIMEOUT itself; the gateway waits this much longer for it.
REPLY_MARGIN_S = 0.5


class DataPlane:
    """What both frontends serve, for the daemon at the other end of `upstream`."""

    def __init__(
        self,
        upstream: Upstream,
        model_name: str | None = None,
        timeout_s: float = 60.0,
    ) -> None:
        self.upstream = upstream
        self.model_name = model_name  # None: named after the daemon's model spec (default_model_name)
        self.timeout_s = timeout_s  # for requests that bring no deadline of their own
        self.draining = False  # set on the gateway's own stop signal: refuse new work, finish what is in flight
        self.in_flight = 0  # inferences between their checks and their answers: the drain waits for none
        self._in_flight_lock = threading.Lock()  # the threaded gRPC server's handlers count from their threads
        self.spec: ModelSpec | None = None
        self.statistics = Statistics()
        self.metrics = GatewayMetrics()  # the gateway's Prometheus metrics, which its REST and gRPC handlers count
        self._ready = False
        self._checked = -math.inf
        self._probe_lock = asyncio.Lock()

    # -- health --------------------------------------------------------------------------------
    def live(self) -> bool:
        return True  # answering at all is being live; readiness says whether inferences are served

    async def ready(self) -> bool:
        """True once the daemon serves (its workers are up and it accepts inferences), false while it starts
        or drains, or while the gateway itself stops."""
        if self.draining:
            return False
        async with self._probe_lock:
            if time.monotonic() - self._checked >= READY_TTL_S:
                self._ready = await self._probe()
                self._checked = time.monotonic()
            return self._ready and not self.draining

    async def _probe(self) -> bool:
        try:
            status = await self.upstream.describe("status", PROBE_TIMEOUT_S)
        except UpstreamTimeout:
            return False
        if not status.get("ok") or not status.get("queue", {}).get("accepting"):
            return False
        if self.spec is None or described_differently(self.spec, status):
            # First, or the daemon behind changed (restarted with another model, or reloaded to another max_batch).
            self.spec = await discover(self.upstream, status, self.model_name)
        else:
            self.spec = followed(self.spec, status)
        return self.spec is not None

    # -- metadata ------------------------------------------------------------------------------
    def server_metadata(self) -> dict[str, Any]:
        return {"name": "packrat", "version": __version__, "extensions": list(EXTENSIONS)}

    async def model(self, name: str, version: str | None = None) -> ModelSpec:
        """The served model if `name` (and `version`) name it; NOT_FOUND, or UNAVAILABLE before it serves."""
        spec = self.spec
        if spec is None:
            await self.ready()
            spec = self.spec
        if spec is None:
            raise OipError(Status.UNAVAILABLE, "the daemon is not serving yet (it is starting); retry later")
        return self._named(spec, name, version)

    @staticmethod
    def _named(spec: ModelSpec, name: str, version: str | None) -> ModelSpec:
        if name != spec.name:
            raise OipError(Status.NOT_FOUND, f"unknown model {name!r}; this server serves {spec.name!r}")
        if version not in (None, "", VERSION):
            raise OipError(Status.NOT_FOUND, f"model {name!r} has no version {version!r}; it has version {VERSION}")
        return spec

    async def model_ready(self, name: str, version: str | None = None) -> bool:
        ready = await self.ready()
        try:
            await self.model(name, version)
        except OipError:
            return False
        return ready

    async def _current(self, name: str, version: str | None) -> ModelSpec:
        """`model`, with the description asked of the daemon again if it is older than READY_TTL_S (one `status`
        per window, shared with the readiness probes): metadata says the runtime served now, not at the start."""
        await self.ready()
        return await self.model(name, version)

    async def model_metadata(self, name: str, version: str | None = None) -> dict[str, Any]:
        spec = await self._current(name, version)
        return {
            "name": spec.name,
            "versions": [VERSION],
            "platform": f"packrat_{spec.runtime}",
            "inputs": [tensor.to_json() for tensor in spec.inputs],
            "outputs": [tensor.to_json() for tensor in spec.outputs],
        }

    async def model_config(self, name: str, version: str | None = None) -> dict[str, Any]:
        """Triton's model configuration (its JSON form): what `perf_analyzer` reads before it starts."""
        return triton_config(await self._current(name, version))

    async def model_statistics(self, name: str = "", version: str | None = None) -> list[dict[str, Any]]:
        """The statistics extension's `model_stats`: of the named model, or (name empty) of every model."""
        spec = self.spec if not name else await self.model(name, version)
        return [] if spec is None else [self.statistics.to_json(spec.name, VERSION)]

    # -- inference -----------------------------------------------------------------------------
    async def infer(
        self,
        name: str,
        version: str | None,
        inputs: list[InferInput],
        outputs: list[str] | None,
        request_id: str = "",
        timeout_s: float | None = None,
        started_ns: int | None = None,
        client: str | None = None,
    ) -> InferResult:
        """Run the model on its inputs; `outputs` names the outputs asked for (None: all of them). `client` names
        the end client (its connection) for the daemon's fairness; cancelling this coroutine cancels the request
        in the daemon's queue."""
        started_ns = time.perf_counter_ns() if started_ns is None else started_ns
        spec = await self.model(name, version)
        with self._counted(started_ns):
            array, dtype = self._sendable(spec, inputs, outputs)
            sent_ns, wait = time.perf_counter_ns(), self._wait(timeout_s)
            with self._upstream_errors(wait, timeout_s):
                header, output = await self.upstream.infer(array, wait, dtype=dtype, client=client)
            return self._result(spec, header, output, outputs, request_id, started_ns, sent_ns)

    def known_model(self, name: str, version: str | None = None) -> ModelSpec | None:
        """`model`'s answer where it needs no `await` (the model is known); None where it would ask the daemon."""
        return None if self.spec is None else self._named(self.spec, name, version)

    def infer_blocking(
        self,
        upstream: BlockingUpstream,
        spec: ModelSpec,
        inputs: list[InferInput],
        outputs: list[str] | None,
        request_id: str,
        timeout_s: float | None,
        started_ns: int,
        client: str | None = None,
        cancelled: Callable[[], bool] | None = None,
    ) -> InferResult:
        """`infer` for a thread of its own with a connection of its own (the threaded gRPC server's handlers), for
        the model `known_model` gave; it blocks that thread, never the loop. Statistics are shared with `infer`."""
        with self._counted(started_ns):
            array, dtype = self._sendable(spec, inputs, outputs)
            sent_ns, wait = time.perf_counter_ns(), self._wait(timeout_s)
            with self._upstream_errors(wait, timeout_s):
                header, output = upstream.infer(array, wait, dtype=dtype, client=client, cancelled=cancelled)
            return self._result(spec, header, output, outputs, request_id, started_ns, sent_ns)

    # The steps `infer` and `infer_blocking` share: they differ only in awaiting the upstream or blocking on it.
    @contextlib.contextmanager
    def _counted(self, started_ns: int) -> Iterator[None]:
        """An OipError raised inside counts as a failed inference in the statistics extension."""
        with self._in_flight_lock:
            self.in_flight += 1
        try:
            yield
        except OipError:
            self.statistics.failed(time.perf_counter_ns() - started_ns)
            raise
        finally:
            with self._in_flight_lock:
                self.in_flight -= 1

    def _wait(self, timeout_s: float | None) -> float:
        """How long the daemon is given: the request's own timeout, else the gateway's."""
        return max(self.timeout_s if timeout_s is None else timeout_s, 1e-3)

    @contextlib.contextmanager
    def _upstream_errors(self, wait: float, timeout_s: float | None) -> Iterator[None]:
        """The daemon gone or silent, as the OipError a client is given."""
        try:
            yield
        except UpstreamCancelled as exc:
            raise OipError(Status.CANCELLED, f"{exc}; it was taken off the daemon's queue") from None
        except UpstreamGone as exc:
            self._ready, self._checked = False, time.monotonic()
            raise OipError(Status.UNAVAILABLE, f"{exc}; retry later") from None
        except UpstreamTimeout:
            raise OipError(
                Status.UNAVAILABLE if timeout_s is None else Status.DEADLINE_EXCEEDED,
                f"the daemon did not answer within {wait:g} s; is it running?",
            ) from None

    def _sendable(
        self, spec: ModelSpec, inputs: list[InferInput], outputs: list[str] | None
    ) -> tuple[np.ndarray | dict[str, np.ndarray], str | None]:
        checked = sendable_inputs(spec, inputs, outputs)
        if self.draining:
            raise OipError(Status.UNAVAILABLE, "the server is shutting down; retry elsewhere", "SHUTTING_DOWN")
        return checked

    def _result(
        self,
        spec: ModelSpec,
        header: dict[str, Any],
        output: Any,
        outputs: list[str] | None,
        request_id: str,
        started_ns: int,
        sent_ns: int,
    ) -> InferResult:
        """The daemon's reply as a result, or its error as an OipError."""
        if not header["ok"]:
            error = header["error"]
            if error["code"] == ErrorCode.SHUTTING_DOWN:
                self._ready, self._checked = False, time.monotonic()  # readiness says so from now on
            raise OipError.from_packrat(error["code"], error["message"])
        assert output is not None  # an ok infer reply always carries its tensors (decode_reply checks)
        timing = header.get("timing") or {}
        answered: tuple[tuple[TensorSpec, np.ndarray], ...] = ()
        if isinstance(output, dict):
            asked = set(outputs or (tensor.name for tensor in spec.outputs))
            answered = tuple((t, output[t.name]) for t in spec.outputs if t.name in asked and t.name in output)
            if not answered:
                raise OipError(Status.INTERNAL, "the daemon answered none of the outputs asked for")
        first = answered[0][1] if answered else output
        assert isinstance(first, np.ndarray)
        return InferResult(
            spec,
            request_id,
            first,
            started_ns,
            queue_ns=int(timing.get("queue_ms", 0) * 1e6),
            compute_ns=int(timing.get("compute_ms", 0) * 1e6),
            input_ns=sent_ns - started_ns,
            outputs=answered,
        )

    def answered(self, result: InferResult, encoding_ns: int) -> None:
        """Count an answered request, once the transport has encoded its result (which it began at `encoding_ns`)."""
        now = time.perf_counter_ns()
        self.statistics.succeeded(
            result.array.shape[0],
            now - result.started_ns,
            result.queue_ns,
            result.compute_ns,
            result.input_ns,
            now - encoding_ns,
        )
