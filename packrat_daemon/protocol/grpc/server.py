"""The Open Inference Protocol over gRPC: `inference.GRPCInferenceService` (grpc.aio) over the data plane.

Inputs come as `raw_input_contents` (the fast path: views of the received bytes, no copy, `grpc.wire`) or
typed `contents`; outputs always go back as `raw_output_contents`, which every client reads. `ModelInfer` is
registered bytes in, bytes out so that its tensors are not copied by protobuf; every other call uses the
generated messages. A failure is the gRPC status of its `Status` with the message as details. Calls not in
the service (streaming, the model repository, shared memory) are answered UNIMPLEMENTED by gRPC itself.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import heapq
import logging
import math
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from typing import Any, TypeVar

import grpc
import numpy as np

from packrat_daemon.protocol import tensors
from packrat_daemon.protocol.dataplane import DataPlane
from packrat_daemon.protocol.errors import OipError, Status
from packrat_daemon.protocol.gateway_metrics import GRPC, GRPC_ENDPOINTS, UNKNOWN, Call
from packrat_daemon.protocol.grpc import inference_pb2 as pb
from packrat_daemon.protocol.grpc.wire import encode_infer_response, split_infer_request
from packrat_daemon.protocol.model import InferInput, InferResult, ModelSpec, check_tensor
from packrat_daemon.protocol.upstream import ThreadUpstreams
from packrat_daemon.wire.codec import MAX_TIMEOUT_MS

log = logging.getLogger("packrat.oip")

T = TypeVar("T")

# The threaded server's handler threads: as many inferences in flight at once, each with its own connection to the
# daemon (made when a thread first serves one); more wait for a free thread. grpcio starts threads as calls need
# them, so one client sending one request at a time uses one.
HANDLER_THREADS = 32
# Calls at once, running or waiting for a handler; more are refused RESOURCE_EXHAUSTED at once. Each may hold a
# message of up to --max-request-mb while it waits, so this bounds what gRPC holds (docs/oip.md, "Limits"). As many
# as REST's connections: a load generator at concurrency 128 or 256 (perf_analyzer's sweeps) must not be refused.
MAX_CONCURRENT_CALLS = 1000
# A call's time remaining past this is no deadline at all: the daemon's `timeout_ms` is at most 2**31 - 1 ms.
_NO_DEADLINE_S = (2**31 - 1) / 1000.0

# Which typed-contents field carries each datatype (the protocol's table); FP16 and BF16 travel raw only.
_CONTENTS_FIELD = {
    "BOOL": "bool_contents",
    "UINT8": "uint_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
}


async def _answer(context: grpc.aio.ServicerContext, call: Callable[[], Awaitable[T]], seen: Call) -> T:
    """`call()`, or the call aborted with the gRPC status of its failure (never an unexplained UNKNOWN); `seen`
    counts it in the gateway's metrics."""
    with seen:
        try:
            return await call()
        except OipError as exc:
            seen.refused(exc.status, exc.packrat_code)
            await context.abort(grpc.StatusCode[exc.status.grpc], exc.message)
        except Exception:
            log.exception("internal error in a gRPC call")
            seen.refused(Status.INTERNAL)
            await context.abort(grpc.StatusCode.INTERNAL, "the server failed on this request; it is logged")
    raise AssertionError("context.abort returns only by raising")


def _answer_blocking(context: grpc.ServicerContext, call: Callable[[], T], seen: Call) -> T:
    """`_answer` for the threaded server's handlers."""
    with seen:
        try:
            return call()
        except OipError as exc:
            seen.refused(exc.status, exc.packrat_code)
            code, details = grpc.StatusCode[exc.status.grpc], exc.message
        except Exception:
            log.exception("internal error in a gRPC call")
            seen.refused(Status.INTERNAL)
            code, details = grpc.StatusCode.INTERNAL, "the server failed on this request; it is logged"
        context.abort(code, details)
    raise AssertionError("context.abort returns only by raising")


class Calls:
    """Every call of the service but `ModelInfer`: its response message, or OipError. Both servers answer them
    from the data plane on the gateway's loop."""

    def __init__(self, plane: DataPlane) -> None:
        self.plane = plane

    async def ServerLive(self, request: Any) -> pb.ServerLiveResponse:  # noqa: N802 - gRPC's names
        return pb.ServerLiveResponse(live=self.plane.live())

    async def ServerReady(self, request: Any) -> pb.ServerReadyResponse:  # noqa: N802
        return pb.ServerReadyResponse(ready=await self.plane.ready())

    async def ModelReady(self, request: pb.ModelReadyRequest) -> pb.ModelReadyResponse:  # noqa: N802
        return pb.ModelReadyResponse(ready=await self.plane.model_ready(request.name, request.version))

    async def ServerMetadata(self, request: Any) -> pb.ServerMetadataResponse:  # noqa: N802
        return pb.ServerMetadataResponse(**self.plane.server_metadata())

    async def ModelMetadata(self, request: pb.ModelMetadataRequest) -> pb.ModelMetadataResponse:  # noqa: N802
        metadata = await self.plane.model_metadata(request.name, request.version)
        tensor = pb.ModelMetadataResponse.TensorMetadata
        return pb.ModelMetadataResponse(
            name=metadata["name"],
            versions=metadata["versions"],
            platform=metadata["platform"],
            inputs=[tensor(**entry) for entry in metadata["inputs"]],
            outputs=[tensor(**entry) for entry in metadata["outputs"]],
        )

    async def ModelConfig(self, request: pb.ModelConfigRequest) -> pb.ModelConfigResponse:  # noqa: N802
        config = await self.plane.model_config(request.name, request.version)
        message = pb.ModelConfig(
            name=config["name"],
            platform=config["platform"],
            backend=config["backend"],
            max_batch_size=config["max_batch_size"],
            input=[pb.ModelInput(**entry) for entry in config["input"]],
            output=[pb.ModelOutput(**entry) for entry in config["output"]],
            instance_group=[pb.ModelInstanceGroup(**entry) for entry in config["instance_group"]],
            dynamic_batching=pb.ModelDynamicBatching(**config["dynamic_batching"]),
        )
        for key, value in config["parameters"].items():
            message.parameters[key].string_value = value["string_value"]
        return pb.ModelConfigResponse(config=message)

    async def ModelStatistics(self, request: pb.ModelStatisticsRequest) -> pb.ModelStatisticsResponse:  # noqa: N802
        stats = await self.plane.model_statistics(request.name, request.version)
        response = pb.ModelStatisticsResponse()
        for entry in stats:
            model = response.model_stats.add()
            model.name, model.version = entry["name"], entry["version"]
            model.last_inference = entry["last_inference"]
            model.inference_count, model.execution_count = entry["inference_count"], entry["execution_count"]
            for key, value in entry["inference_stats"].items():
                getattr(model.inference_stats, key).CopyFrom(pb.StatisticDuration(**value))
            for batch in entry["batch_stats"]:
                added = model.batch_stats.add(batch_size=batch["batch_size"])
                for key in ("compute_input", "compute_infer", "compute_output"):
                    getattr(added, key).CopyFrom(pb.StatisticDuration(**batch[key]))
        return response


def _infer_call(
    request: pb.ModelInferRequest, raw: list[memoryview], spec: ModelSpec, remaining: float | None
) -> tuple[list[InferInput], list[str] | None, float | None]:
    """What `ModelInfer` asks of the data plane: (inputs, outputs asked for, timeout in seconds or None)."""
    inputs = _inputs(request, raw, spec)
    outputs = [output.name for output in request.outputs] or None
    return inputs, outputs, _timeout(request, remaining)


def _encoded(plane: DataPlane, spec: ModelSpec, result: InferResult) -> bytes:
    encoding = time.perf_counter_ns()
    # Every output asked for, in the model's order.
    answered = [(tensor.name, tensor.datatype, array) for tensor, array in result.answered()]
    response = encode_infer_response(spec.name, "1", result.request_id, answered)
    plane.answered(result, encoding)
    return response


class CallSlots:
    """Numbers for the calls in flight, the lowest free one first: the end client the daemon's batcher goes round
    for a call (docs/protocol.md 2.2). gRPC carries many clients' calls on one connection (grpcio even shares one
    connection between a process's channels to the same server), so neither the connection nor the peer tells the
    clients apart; a number per call in flight, reused, recurs as a closed-loop client does, and takes its turn as
    a REST connection or a threaded handler's connection does."""

    def __init__(self) -> None:
        self._free: list[int] = []
        self._next = 0

    @contextlib.contextmanager
    def taken(self) -> Iterator[int]:
        slot = heapq.heappop(self._free) if self._free else self._next
        self._next = max(self._next, slot + 1)
        try:
            yield slot
        finally:
            heapq.heappush(self._free, slot)


class InferenceServicer:
    """The service on grpc.aio, on the gateway's loop."""

    def __init__(self, plane: DataPlane) -> None:
        self.plane = plane
        self.calls = Calls(plane)
        self.slots = CallSlots()

    def handler(self, name: str) -> Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]]:
        call = getattr(self.calls, name)
        endpoint = GRPC_ENDPOINTS.get(name, UNKNOWN)

        async def handle(request: Any, context: grpc.aio.ServicerContext) -> Any:
            return await _answer(context, lambda: call(request), self.plane.metrics.call(GRPC, endpoint))

        return handle

    async def ModelInfer(self, data: bytes, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        """A serialized ModelInferRequest in, a serialized ModelInferResponse out (registered without protobuf's
        (de)serializers: `grpc.wire` says why)."""
        started = time.perf_counter_ns()

        async def call() -> bytes:
            request, raw = split_infer_request(data)
            spec = await self.plane.model(request.model_name, request.model_version)
            inputs, outputs, timeout_s = _infer_call(request, raw, spec, context.time_remaining())
            # grpc.aio cancels this coroutine when its client cancels the call: the upstream then cancels the request.
            with self.slots.taken() as slot:
                result = await self.plane.infer(
                    request.model_name, request.model_version, inputs, outputs, request.id, timeout_s, started,
                    client=f"grpc-call:{slot}",
                )  # fmt: skip
            return _encoded(self.plane, spec, result)

        return await _answer(context, call, self.plane.metrics.call(GRPC, "infer"))


class ThreadedServicer:
    """The service on grpcio's threaded server: `ModelInfer` runs in its handler thread, which sends to the daemon
    on a connection of its own and waits for the reply itself (`upstream.ThreadUpstreams`); the loop is not on an
    inference's path. Every other call, and an inference that finds the model not known yet, is answered on the
    gateway's loop, as the asyncio server answers it."""

    # How long a handler waits for a call run on the loop: readiness is bounded by its probe timeout already.
    LOOP_CALL_TIMEOUT_S = 30.0

    def __init__(self, plane: DataPlane, upstreams: ThreadUpstreams, loop: asyncio.AbstractEventLoop) -> None:
        self.plane = plane
        self.calls = Calls(plane)
        self.upstreams = upstreams
        self.loop = loop

    def _on_loop(self, coroutine: Coroutine[Any, Any, T]) -> T:
        future = asyncio.run_coroutine_threadsafe(coroutine, self.loop)
        try:
            return future.result(self.LOOP_CALL_TIMEOUT_S)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise OipError(Status.UNAVAILABLE, "the gateway is too busy to answer; retry later") from None

    def handler(self, name: str) -> Callable[[Any, grpc.ServicerContext], Any]:
        call = getattr(self.calls, name)
        endpoint = GRPC_ENDPOINTS.get(name, UNKNOWN)

        def handle(request: Any, context: grpc.ServicerContext) -> Any:
            seen = self.plane.metrics.call(GRPC, endpoint)
            return _answer_blocking(context, lambda: self._on_loop(call(request)), seen)

        return handle

    def ModelInfer(self, data: bytes, context: grpc.ServicerContext) -> Any:  # noqa: N802
        """As `InferenceServicer.ModelInfer`, in this thread."""
        started = time.perf_counter_ns()

        def call() -> bytes:
            request, raw = split_infer_request(data)
            plane = self.plane
            spec = plane.known_model(request.model_name, request.model_version)
            if spec is None:  # not serving yet: the loop asks the daemon (readiness), as the asyncio server does
                spec = self._on_loop(plane.model(request.model_name, request.model_version))
            inputs, outputs, timeout_s = _infer_call(request, raw, spec, context.time_remaining())
            upstream = self.upstreams.mine()
            # No `client`: the daemon goes round this thread's own connection, a turn per call in flight.
            result = plane.infer_blocking(
                upstream, spec, inputs, outputs, request.id, timeout_s, started,
                cancelled=lambda: not context.is_active(),
            )  # fmt: skip
            return _encoded(plane, spec, result)

        return _answer_blocking(context, call, self.plane.metrics.call(GRPC, "infer"))


def _inputs(request: pb.ModelInferRequest, raw: list[memoryview], spec: ModelSpec) -> list[InferInput]:
    if raw and len(raw) != len(request.inputs):
        raise OipError(
            Status.INVALID_ARGUMENT,
            f"{len(raw)} raw_input_contents for {len(request.inputs)} inputs; give one per input, in order",
        )
    inputs = []
    for index, tensor in enumerate(request.inputs):
        datatype = tensors.check_datatype(tensor.datatype, tensor.name)
        shape = tensors.check_shape(list(tensor.shape), tensor.name)
        if "shared_memory_region" in tensor.parameters:
            raise OipError(Status.UNIMPLEMENTED, "the shared-memory extensions are not served by Packrat")
        check_tensor(spec, tensor.name, datatype, shape)  # before decoding: at most the largest request it takes
        if raw:
            if tensor.HasField("contents"):
                raise OipError(Status.INVALID_ARGUMENT, f"input '{tensor.name}' has both contents and raw contents")
            array = tensors.from_bytes(raw[index], datatype, shape, tensor.name)
        else:
            field = _CONTENTS_FIELD.get(datatype)
            if field is None:
                raise OipError(
                    Status.INVALID_ARGUMENT, f"input '{tensor.name}': {datatype} must be sent as raw_input_contents"
                )
            values = getattr(tensor.contents, field)
            if len(values) != math.prod(shape):  # a count is free; converting the values is not
                raise OipError(
                    Status.INVALID_ARGUMENT,
                    f"input '{tensor.name}': {len(values)} values for shape {list(shape)} ({math.prod(shape)})",
                )
            array = tensors.from_values(np.asarray(values), datatype, shape, tensor.name)
        inputs.append(InferInput(tensor.name, datatype, array))
    return inputs


def _timeout(request: pb.ModelInferRequest, remaining: float | None) -> float | None:
    """The request's deadline in seconds: the call's own, or the `timeout` parameter (microseconds), whichever
    is sooner; None if it has neither (grpcio's threaded server gives a call without a deadline an unbounded
    `time_remaining`, grpc.aio None)."""
    choices = [] if remaining is None or remaining > _NO_DEADLINE_S else [remaining]
    if "timeout" in request.parameters:
        microseconds = request.parameters["timeout"].int64_param
        if not 1 <= microseconds <= MAX_TIMEOUT_MS * 1000:
            raise OipError(
                Status.INVALID_ARGUMENT,
                f"parameter 'timeout' must be a positive number of microseconds, at most {MAX_TIMEOUT_MS * 1000}",
            )
        choices.append(microseconds / 1e6)
    return min(choices) if choices else None


def grpc_server(plane: DataPlane, max_message_bytes: int) -> grpc.aio.Server:
    """The gRPC server on grpc.aio with the service added; the caller adds its port (plain or TLS) and starts it."""
    server = grpc.aio.server(options=_options(max_message_bytes), maximum_concurrent_rpcs=MAX_CONCURRENT_CALLS)
    add_service(InferenceServicer(plane), server)
    return server


def threaded_grpc_server(
    plane: DataPlane, upstreams: ThreadUpstreams, loop: asyncio.AbstractEventLoop, max_message_bytes: int
) -> grpc.Server:
    """The gRPC server on grpcio's thread pool with the service added; the caller adds its port and starts it."""
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=HANDLER_THREADS, thread_name_prefix="oip-grpc")
    server = grpc.server(pool, options=_options(max_message_bytes), maximum_concurrent_rpcs=MAX_CONCURRENT_CALLS)
    add_service(ThreadedServicer(plane, upstreams, loop), server)
    return server


def _options(max_message_bytes: int) -> list[tuple[str, Any]]:
    # Checked against each message's length prefix before its bytes are read into memory. SO_REUSEPORT off:
    # grpcio sets it by default, and a second server on a taken port would then share it silently.
    return [
        ("grpc.so_reuseport", 0),
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
    ]


def add_service(servicer: InferenceServicer | ThreadedServicer, server: grpc.Server | grpc.aio.Server) -> None:
    """The service's calls on `server`, as the generated `add_GRPCInferenceServiceServicer_to_server` adds
    them, except `ModelInfer`, which takes and returns the serialized messages."""
    service = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    handlers = {}
    for method in service.methods:
        if method.name == "ModelInfer":
            handler = grpc.unary_unary_rpc_method_handler(servicer.ModelInfer)
        else:
            handler = grpc.unary_unary_rpc_method_handler(
                servicer.handler(method.name),
                request_deserializer=getattr(pb, method.input_type.name).FromString,
                response_serializer=getattr(pb, method.output_type.name).SerializeToString,
            )
        handlers[method.name] = handler
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service.full_name, handlers),))
    server.add_registered_method_handlers(service.full_name, handlers)
