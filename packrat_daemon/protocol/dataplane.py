"""The Open Inference Protocol's data plane, free of any transport: health, metadata, Triton's model
configuration and statistics extensions, and inference, each forwarded to the daemon over its own protocol.

The REST and gRPC frontends (`protocol.rest`, `protocol.grpc.server`) only turn their wire form into the
calls below and the answers (or `OipError`) back. The model's description comes from the daemon's `info`,
and its outputs' datatypes and shapes from one single-sample inference when the daemon starts serving.

A model of one input and one output is served as `input` and `output`, over the daemon's protocol version 1. A
model of several inputs or outputs is served under their own names (the daemon's `info` lists them), over its
protocol version 2: every input by name, every output (or those a request asks for) by name.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from packrat_daemon import __version__
from packrat_daemon.protocol.errors import OipError, Status
from packrat_daemon.protocol.gateway_metrics import GatewayMetrics
from packrat_daemon.protocol.stats import Statistics
from packrat_daemon.protocol.tensors import OIP_DATATYPE, PACKRAT_DTYPE
from packrat_daemon.protocol.upstream import (
    BlockingUpstream,
    Upstream,
    UpstreamCancelled,
    UpstreamGone,
    UpstreamTimeout,
)
from packrat_daemon.wire.codec import ErrorCode

log = logging.getLogger("packrat.oip")

VERSION = "1"  # the one version of the one model a daemon serves
INPUT_NAME, OUTPUT_NAME = "input", "output"
EXTENSIONS = ("binary_tensor_data", "model_configuration", "statistics")
# How long a readiness answer is reused: probes from many clients cost the daemon one `status` per window.
READY_TTL_S = 0.5
PROBE_TIMEOUT_S = 1.0  # a kubelet probe's default timeout: an answer later than that counts as a failure anyway
# Past the request's own timeout the daemon answers TIMEOUT itself; the gateway waits this much longer for it.
REPLY_MARGIN_S = 0.5


@dataclass(frozen=True)
class TensorSpec:
    name: str
    datatype: str  # the OIP name
    shape: tuple[int, ...]  # one sample's, without the batch axis

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "datatype": self.datatype, "shape": [-1, *self.shape]}


@dataclass(frozen=True)
class ModelSpec:
    name: str
    model: str  # the daemon's model spec
    runtime: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    max_batch: int
    max_message_bytes: int  # the daemon's limit on one request (info.limits)
    instances: int
    named: bool = False  # several inputs or outputs: sent to the daemon by name (its protocol version 2)
    max_delay_ms: float | None = None  # the daemon's batching delay (info.max_delay_ms, live): the config says it

    @property
    def input(self) -> TensorSpec:
        return self.inputs[0]

    @property
    def output(self) -> TensorSpec:
        return self.outputs[0]

    def input_named(self, name: str) -> TensorSpec | None:
        return next((tensor for tensor in self.inputs if tensor.name == name), None)


@dataclass(frozen=True)
class InferInput:
    name: str
    datatype: str
    array: np.ndarray


@dataclass(frozen=True)
class InferResult:
    model: ModelSpec
    request_id: str
    array: np.ndarray  # the first output answered
    started_ns: int
    queue_ns: int
    compute_ns: int
    input_ns: int
    outputs: tuple[tuple[TensorSpec, np.ndarray], ...] = ()  # every output answered, in the model's order

    def answered(self) -> tuple[tuple[TensorSpec, np.ndarray], ...]:
        return self.outputs or ((self.model.output, self.array),)


def default_model_name(spec: str) -> str:
    """The name a model is served as: builtin:resnet50 → resnet50, /mnt/models/model.pt2 → model,
    pkg.module:factory → factory."""
    tail = spec.rstrip("/").rsplit("/", 1)[-1].rsplit(":", 1)[-1]
    return tail.split(".", 1)[0] if "." in tail and "/" in spec else tail


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
        if self.spec is None or self._described_differently(status):
            # First, or the daemon behind changed (restarted with another model, or reloaded to another max_batch).
            self.spec = await self._discover(status)
        else:
            self.spec = self._followed(self.spec, status)
        return self.spec is not None

    def _described_differently(self, status: dict[str, Any]) -> bool:
        spec = self.spec
        assert spec is not None
        given = (status["model"], status["input"]["dtype"], tuple(status["input"]["shape"]), status["max_batch"])
        return given != (spec.model, PACKRAT_DTYPE[spec.input.datatype], spec.input.shape, spec.max_batch)

    @staticmethod
    def _followed(spec: ModelSpec, status: dict[str, Any]) -> ModelSpec:
        """`spec` with what the daemon changes while it serves the same tensors: its runtime (a switch to OpenVINO or
        ONNX Runtime measured faster), its plan's instances, its batching delay (a reload). None changes an output."""
        runtime = status.get("runtime", spec.runtime)
        instances = len(status.get("plan", {}).get("instances", [])) or spec.instances
        delay = status.get("max_delay_ms", spec.max_delay_ms)
        if (runtime, instances, delay) == (spec.runtime, spec.instances, spec.max_delay_ms):
            return spec
        if runtime != spec.runtime:
            log.info("model %r is now served by %s (was %s)", spec.name, runtime, spec.runtime)
        return dataclasses.replace(spec, runtime=runtime, instances=instances, max_delay_ms=delay)

    async def _discover(self, info: dict[str, Any]) -> ModelSpec | None:
        """The model's description: `info`, and the outputs from a single-sample inference of zeros."""
        named_inputs = info.get("inputs") or [{"name": INPUT_NAME, **info["input"]}]
        named = len(named_inputs) > 1 or len(info.get("outputs") or ()) > 1
        zeros = {
            tensor["name"]: np.zeros((1, *tensor["shape"]), dtype=np.uint16 if tensor["dtype"] == "bfloat16" else
                                     tensor["dtype"])
            for tensor in named_inputs
        }  # fmt: skip
        dtype = info["input"]["dtype"]
        probe: np.ndarray | dict[str, np.ndarray] = zeros if named else next(iter(zeros.values()))
        try:
            header, output = await self.upstream.infer(probe, PROBE_TIMEOUT_S * 5, dtype=dtype)
        except UpstreamTimeout:
            return None
        if not header.get("ok") or output is None:
            log.warning("the probe for the model's output failed (%s); trying again later", header.get("error"))
            return None
        if named:
            assert isinstance(output, dict)  # a version-2 reply names its outputs
            dtypes = {entry["name"]: entry["dtype"] for entry in header["outputs"]}
            inputs = tuple(TensorSpec(t["name"], OIP_DATATYPE[t["dtype"]], tuple(t["shape"])) for t in named_inputs)
            outputs = tuple(TensorSpec(key, OIP_DATATYPE[dtypes[key]], tuple(a.shape[1:])) for key, a in output.items())
        else:
            assert isinstance(output, np.ndarray)
            inputs = (TensorSpec(INPUT_NAME, OIP_DATATYPE[dtype], tuple(info["input"]["shape"])),)
            outputs = (TensorSpec(OUTPUT_NAME, OIP_DATATYPE[header["dtype"]], tuple(output.shape[1:])),)
        name = self.model_name or default_model_name(info["model"])
        spec = ModelSpec(
            name=name,
            model=info["model"],
            runtime=info.get("runtime", "torch"),
            inputs=inputs,
            outputs=outputs,
            max_batch=int(info["max_batch"]),
            max_message_bytes=int(info["limits"]["max_message_bytes"]),
            instances=len(info.get("plan", {}).get("instances", [])) or 1,
            named=named,
            max_delay_ms=info.get("max_delay_ms"),
        )
        log.info("serving model %r (%s) over the Open Inference Protocol", name, spec.model)
        return spec

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
        spec = await self._current(name, version)
        batching: dict[str, Any] = {}
        if spec.max_delay_ms is not None:
            batching["max_queue_delay_microseconds"] = round(spec.max_delay_ms * 1000)
        return {
            "name": spec.name,
            "platform": f"packrat_{spec.runtime}",
            "backend": "packrat",
            "max_batch_size": spec.max_batch,
            "input": [_config_tensor(tensor, "FORMAT_NONE") for tensor in spec.inputs],
            "output": [_config_tensor(tensor, None) for tensor in spec.outputs],
            # Packrat always batches across requests: present (even empty), it tells perf_analyzer so.
            "dynamic_batching": batching,
            "instance_group": [{"name": spec.name, "kind": "KIND_CPU", "count": spec.instances}],
            "parameters": {"packrat_model": {"string_value": spec.model}},
        }

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
        checked = self._checked_input(spec, inputs, outputs)
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

    @staticmethod
    def _checked_input(
        spec: ModelSpec, inputs: list[InferInput], outputs: list[str] | None
    ) -> tuple[np.ndarray | dict[str, np.ndarray], str | None]:
        names = ", ".join(f"'{tensor.name}'" for tensor in spec.inputs)
        for output in outputs or ():
            if output not in {tensor.name for tensor in spec.outputs}:
                listed = ", ".join(f"'{tensor.name}'" for tensor in spec.outputs)
                raise OipError(Status.INVALID_ARGUMENT, f"unknown output '{output}'; the model's outputs are {listed}")
        if not spec.named:
            if len(inputs) != 1:
                raise OipError(Status.INVALID_ARGUMENT, f"the model takes one input, {names}; got {len(inputs)}")
            given = inputs[0]
            check_tensor(spec, given.name, given.datatype, given.array.shape)
            return given.array, "bfloat16" if given.datatype == "BF16" else None
        arrays: dict[str, np.ndarray] = {}
        for given in inputs:
            check_tensor(spec, given.name, given.datatype, given.array.shape)
            if given.name in arrays:
                raise OipError(Status.INVALID_ARGUMENT, f"input '{given.name}' is given twice")
            if given.datatype == "BF16":
                raise OipError(Status.INVALID_ARGUMENT, "bfloat16 inputs are served to models of one input only")
            arrays[given.name] = given.array
        missing = [tensor.name for tensor in spec.inputs if tensor.name not in arrays]
        if missing:
            raise OipError(Status.INVALID_ARGUMENT, f"input '{missing[0]}' is missing; the model takes {names}")
        counts = {array.shape[0] for array in arrays.values()}
        if len(counts) > 1:
            listed = ", ".join(f"{name} {array.shape[0]}" for name, array in arrays.items())
            raise OipError(
                Status.INVALID_ARGUMENT,
                f"the inputs have different numbers of samples ({listed}); each input's first axis counts the same",
            )
        return arrays, None


def check_tensor(spec: ModelSpec, name: str, datatype: str, shape: tuple[int, ...]) -> None:
    """INVALID_ARGUMENT or TOO_LARGE unless an input of this name, datatype and shape fits the model. The
    transports ask it before they decode a tensor, so no request makes them decode more than the largest
    one the model takes."""
    model_input = spec.input_named(name)
    if model_input is None:
        if len(spec.inputs) == 1:
            raise OipError(Status.INVALID_ARGUMENT, f"unknown input '{name}'; the model's input is '{spec.input.name}'")
        listed = ", ".join(f"'{tensor.name}'" for tensor in spec.inputs)
        raise OipError(Status.INVALID_ARGUMENT, f"unknown input '{name}'; the model's inputs are {listed}")
    if datatype != model_input.datatype:
        raise OipError(
            Status.INVALID_ARGUMENT,
            f"input '{name}' is {datatype}, but the model takes {model_input.datatype}; cast it",
        )
    if tuple(shape[1:]) != model_input.shape:
        raise OipError(
            Status.INVALID_ARGUMENT,
            f"input '{name}' has shape {list(shape)}, but the model takes "
            f"[N, {', '.join(map(str, model_input.shape))}] (N samples)",
        )
    if shape[0] > spec.max_batch:
        raise OipError(
            Status.TOO_LARGE,
            f"input '{name}' has {shape[0]} samples; this server takes at most {spec.max_batch} a request: send fewer",
        )


def _config_tensor(tensor: TensorSpec, layout: str | None) -> dict[str, Any]:
    entry: dict[str, Any] = {"name": tensor.name, "data_type": f"TYPE_{tensor.datatype}", "dims": list(tensor.shape)}
    if layout is not None:
        entry["format"] = layout
    return entry
