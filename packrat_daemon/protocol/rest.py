"""The Open Inference Protocol over HTTP/REST: a bare ASGI application (served by uvicorn) over the data plane.

Routes (docs/oip.md): `GET /v2`, `/v2/health/live`, `/v2/health/ready`, `/v2/models/M[/versions/V]`,
`.../ready`, `.../config` (Triton's model configuration), `.../stats` and `/v2/models/stats` (statistics),
and `POST .../infer` with JSON tensors or the binary-data extension. Errors are `{"error": "..."}` with the
HTTP status of their `Status`. A request body is read as its bytes arrive, within its size, time and memory
limits (`rest_body`); the connection's own limits (head, connections, idle) are the server's (`http_server`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import numpy as np
from prometheus_client import CONTENT_TYPE_LATEST

from packrat_daemon.protocol import tensors
from packrat_daemon.protocol.dataplane import DataPlane
from packrat_daemon.protocol.errors import OipError, Status
from packrat_daemon.protocol.gateway_metrics import REST, Call, rest_endpoint
from packrat_daemon.protocol.limits import GatewayLimits
from packrat_daemon.protocol.model import InferInput, InferResult, ModelSpec, check_tensor
from packrat_daemon.protocol.rest_body import Bodies, RequestTimeout, read_body
from packrat_daemon.wire.codec import MAX_TIMEOUT_MS

log = logging.getLogger("packrat.oip")

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

HEADER_LENGTH = "inference-header-content-length"
# A JSON tensor takes up to about this many times its binary size (digits, separators): the body limit of an
# infer request is this many times the daemon's own message limit, so the largest JSON request still fits.
JSON_EXPANSION = 8
MIN_BODY_LIMIT = 1 << 20
# JSON bodies (and JSON results) at least this large are decoded (encoded) in a worker thread.
OFFLOAD_BYTES = 1 << 20
# The longest `timeout` parameter (microseconds): the daemon's longest timeout_ms (codec.MAX_TIMEOUT_MS).
MAX_TIMEOUT_US = MAX_TIMEOUT_MS * 1000
_ACTIONS = {"ready", "config", "stats", "infer"}


class ClientLeft(Exception):
    """The client closed its connection while its request waited for the daemon."""


def body_limit(spec: ModelSpec) -> int:
    return max(JSON_EXPANSION * spec.max_message_bytes, MIN_BODY_LIMIT)


class RestApp:
    """The ASGI application; `RestApp(plane, limits)`, served by `http_server.rest_server`."""

    def __init__(self, plane: DataPlane, limits: GatewayLimits | None = None) -> None:
        self.plane = plane
        self.limits = limits or GatewayLimits()
        self.bodies = Bodies(self.limits.bodies_in_flight_mb << 20)  # bodies being received, all connections

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        # In flight until the answer is handed to uvicorn, then counted by its status (gateway_metrics).
        with self.plane.metrics.call(REST, rest_endpoint(scope["path"])) as call:
            await self._respond(scope, receive, send, call)

    async def _respond(self, scope: Scope, receive: Receive, send: Send, call: Call) -> None:
        started = time.perf_counter_ns()
        try:
            status, headers, body = await self._route(scope, receive, started)
        except ClientLeft:
            call.refused(Status.CANCELLED)
            return  # nobody to answer
        except OipError as exc:
            call.refused(exc.status, exc.packrat_code)
            status, headers, body = _error(exc.status, exc.message)
        except json.JSONDecodeError as exc:
            call.refused(Status.INVALID_ARGUMENT)
            status, headers, body = _error(Status.INVALID_ARGUMENT, f"the request body is not valid JSON: {exc}")
        except (ValueError, UnicodeDecodeError, RecursionError) as exc:
            call.refused(Status.INVALID_ARGUMENT)
            status, headers, body = _error(Status.INVALID_ARGUMENT, f"the request is malformed: {exc}")
        except RequestTimeout as exc:  # the body stopped coming: no Status of its own, as it is HTTP's alone
            call.metrics.refused(REST, "body_timeout")
            status, headers, body = _json({"error": str(exc)}, 408)
            headers.append((b"connection", b"close"))
        except Exception:
            # The last resort: no request may take the gateway down; it is logged and answered 500.
            log.exception("internal error on %s %s", scope.get("method"), scope.get("path"))
            call.refused(Status.INTERNAL)
            status, headers, body = _error(Status.INTERNAL, "the server failed on this request; it is logged")
        call.status = str(status)
        headers.append((b"content-length", str(len(body)).encode()))  # not chunked: the size is known
        if self.plane.draining:  # the gateway stops: this connection takes no further request (gateway.drain)
            headers.append((b"connection", b"close"))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    async def _route(self, scope: Scope, receive: Receive, started: int) -> tuple[int, list, bytes]:
        parts = scope["path"].rstrip("/").split("/")[1:]
        method = scope["method"]
        if parts == ["metrics"]:  # the gateway's own metrics (docs/metrics.md), for a Prometheus to scrape
            _only(method, "GET", scope["path"])
            return 200, [(b"content-type", CONTENT_TYPE_LATEST.encode())], self.plane.metrics.exposition()
        if not parts or parts[0] != "v2":
            raise OipError(Status.NOT_FOUND, f"no route {scope['path']}; the protocol's routes start with /v2")
        rest = parts[1:]
        if rest in ([], ["health", "live"], ["health", "ready"], ["models", "stats"]):
            _only(method, "GET", scope["path"])
            if not rest:
                return _json(self.plane.server_metadata())
            if rest == ["models", "stats"]:
                return _json({"model_stats": await self.plane.model_statistics()})
            healthy = self.plane.live() if rest[1] == "live" else await self.plane.ready()
            return _health(healthy, "" if healthy else "the daemon is not serving (starting, or draining)")
        if len(rest) < 2 or rest[0] != "models":
            raise OipError(Status.NOT_FOUND, f"no route {scope['path']}")
        name, tail = rest[1], rest[2:]
        version = None
        if len(tail) >= 2 and tail[0] == "versions":
            version, tail = tail[1], tail[2:]
        action = tail[0] if len(tail) == 1 and tail[0] in _ACTIONS else None
        if tail and action is None:
            raise OipError(Status.NOT_FOUND, f"no route {scope['path']}")
        if action == "infer":
            _only(method, "POST", scope["path"])
            return await self._infer(scope, receive, name, version, started)
        _only(method, "GET", scope["path"])
        if action == "ready":
            ready = await self.plane.model_ready(name, version)
            return _health(ready, "" if ready else f"model {name!r} is not ready")
        if action == "config":
            return _json(await self.plane.model_config(name, version))
        if action == "stats":
            return _json({"model_stats": await self.plane.model_statistics(name, version)})
        return _json(await self.plane.model_metadata(name, version))

    async def _infer(self, scope: Scope, receive: Receive, name: str, version: str | None, started: int):
        spec = await self.plane.model(name, version)  # 404 or 503 before a byte of the body is read
        headers = dict(scope["headers"])
        body = await read_body(receive, headers, body_limit(spec), self.limits, self.bodies)
        header_length = headers.get(HEADER_LENGTH.encode())
        # A large JSON body takes a while to parse, a large JSON result to write: in a worker thread, so that
        # the loop serves the other requests meanwhile (the GIL is handed over every few milliseconds).
        if header_length is None and len(body) >= OFFLOAD_BYTES:
            decoded = await asyncio.to_thread(_decode, body, header_length, spec)
        else:
            decoded = _decode(body, header_length, spec)
        request_id, inputs, outputs, binary_outputs, timeout_s = decoded
        peer = scope.get("client")
        client = None if not peer else f"rest:{peer[0]}:{peer[1]}"  # each connection is an end client (fairness)
        result = await _unless_disconnected(
            self.plane.infer(name, version, inputs, outputs, str(request_id), timeout_s, started, client), receive
        )
        encoding = time.perf_counter_ns()
        as_json = binary_outputs is not True and any(t.name not in (binary_outputs or ()) for t, _ in result.answered())
        if as_json and sum(array.size for _, array in result.answered()) * 8 >= OFFLOAD_BYTES:
            response = await asyncio.to_thread(encode_infer_response, result, request_id, binary_outputs)
        else:
            response = encode_infer_response(result, request_id, binary_outputs)
        self.plane.answered(result, encoding)
        return response


async def _unless_disconnected(inference: Coroutine[Any, Any, InferResult], receive: Receive) -> InferResult:
    """The inference's result; if the client closes its connection first, the inference is cancelled (and with it
    the request in the daemon's queue, if it has not started) and ClientLeft raised: no one reads an answer."""
    task = asyncio.ensure_future(inference)
    watch = asyncio.ensure_future(receive())  # the body is read: what comes now is the client's disconnect
    try:
        await asyncio.wait((task, watch), return_when=asyncio.FIRST_COMPLETED)
        if not task.done() and watch.result()["type"] == "http.disconnect":
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            raise ClientLeft
        return await task
    finally:
        watch.cancel()
        if not task.done():
            task.cancel()


def _decode(body: bytes | bytearray, header_length: bytes | None, spec: ModelSpec) -> tuple:
    """(request id, inputs, outputs asked for, which go binary, timeout) of an infer request's body."""
    request, binary = split_body(body, header_length)
    request_id = request.get("id", "")
    if not isinstance(request_id, str):
        raise OipError(Status.INVALID_ARGUMENT, f"'id' must be a string, got {json.dumps(request_id)[:40]}")
    return (request_id, *parse_infer_request(request, binary, spec))


def split_body(body: bytes | bytearray, header_length: bytes | None) -> tuple[dict[str, Any], memoryview]:
    """The JSON request and the binary data after it (binary-data extension: Inference-Header-Content-Length)."""
    view = memoryview(body)
    if header_length is None:
        size = len(body)
    else:
        try:
            size = int(header_length)
        except ValueError:
            size = -1
        if not 0 <= size <= len(body):
            raise OipError(
                Status.INVALID_ARGUMENT,
                f"Inference-Header-Content-Length is {header_length.decode('latin-1')!r}, but the body has "
                f"{len(body)} bytes",
            )
    request = json.loads(view[:size].tobytes() if header_length is not None else body)
    if not isinstance(request, dict):
        raise OipError(Status.INVALID_ARGUMENT, "the inference request must be a JSON object")
    return request, view[size:]


def parse_infer_request(
    request: dict[str, Any], binary: memoryview, spec: ModelSpec | None = None
) -> tuple[list[InferInput], list[str] | None, set[str] | bool, float | None]:
    """(inputs, names of the outputs asked for or None, which outputs go binary (True: all), timeout). With the
    model's `spec`, each input is checked against it before its data is decoded."""
    parameters = _parameters(request, "the request")
    if "classification" in parameters:
        raise OipError(Status.UNIMPLEMENTED, "the classification extension is not served by Packrat")
    timeout_s = _timeout_s(parameters.get("timeout"))
    raw_inputs = request.get("inputs")
    if not isinstance(raw_inputs, list) or not raw_inputs:
        raise OipError(Status.INVALID_ARGUMENT, "the request needs 'inputs': a list of tensors")
    inputs = _inputs(raw_inputs, binary, spec)
    binary_outputs = parameters.get("binary_data_output") is True
    if request.get("outputs") is None:
        return inputs, None, binary_outputs, timeout_s
    outputs, chosen = _outputs(request["outputs"], binary_outputs)
    return inputs, outputs, chosen, timeout_s


def _timeout_s(timeout: Any) -> float | None:
    """The request's 'timeout' parameter (microseconds) in seconds; None without one."""
    if timeout is None:
        return None
    timeout_s = _positive(timeout, "parameter 'timeout' (microseconds)") / 1e6
    if timeout > MAX_TIMEOUT_US:  # named here: the daemon would name its own timeout_ms
        raise OipError(
            Status.INVALID_ARGUMENT,
            f"parameter 'timeout' is at most {MAX_TIMEOUT_US} microseconds (about 24.8 days), got {timeout}",
        )
    return timeout_s


def _inputs(raw_inputs: list[Any], binary: memoryview, spec: ModelSpec | None) -> list[InferInput]:
    """The request's input tensors, each decoded from its JSON 'data' or its part of the binary data, which they must
    claim to its last byte."""
    inputs, offset = [], 0
    for tensor in raw_inputs:
        if not isinstance(tensor, dict) or not isinstance(tensor.get("name"), str):
            raise OipError(Status.INVALID_ARGUMENT, "each input must be an object with a 'name'")
        name = tensor["name"]
        datatype = tensors.check_datatype(tensor.get("datatype"), name)
        shape = tensors.check_shape(tensor.get("shape"), name)
        tensor_parameters = _parameters(tensor, f"input '{name}'")
        if "shared_memory_region" in tensor_parameters:
            raise OipError(Status.UNIMPLEMENTED, "the shared-memory extensions are not served by Packrat")
        if spec is not None:
            check_tensor(spec, name, datatype, shape)
        size = tensor_parameters.get("binary_data_size")
        if size is not None:
            size = _positive(size, f"input '{name}': binary_data_size")
            if offset + size > len(binary):
                raise OipError(
                    Status.INVALID_ARGUMENT,
                    f"input '{name}': binary_data_size {size} runs past the {len(binary)} bytes of binary data",
                )
            array = tensors.from_bytes(binary[offset : offset + size], datatype, shape, name)
            offset += size
        elif "data" in tensor:
            array = tensors.from_values(tensor["data"], datatype, shape, name)
        else:
            raise OipError(Status.INVALID_ARGUMENT, f"input '{name}' has neither 'data' nor binary_data_size")
        inputs.append(InferInput(name, datatype, array))
    if offset != len(binary):
        raise OipError(
            Status.INVALID_ARGUMENT, f"{len(binary) - offset} bytes of binary data are not claimed by any input"
        )
    return inputs


def _outputs(raw_outputs: Any, binary_outputs: bool) -> tuple[list[str], set[str]]:
    """(the outputs asked for by name, those of them that go binary: each output's binary_data, else the request's
    binary_data_output)."""
    if not isinstance(raw_outputs, list):
        raise OipError(Status.INVALID_ARGUMENT, "'outputs' must be a list of {'name': ...} objects")
    outputs, chosen = [], set()
    for output in raw_outputs:
        if not isinstance(output, dict) or not isinstance(output.get("name"), str):
            raise OipError(Status.INVALID_ARGUMENT, "each requested output must be an object with a 'name'")
        output_parameters = _parameters(output, f"output '{output['name']}'")
        if "classification" in output_parameters:
            raise OipError(Status.UNIMPLEMENTED, "the classification extension is not served by Packrat")
        if output_parameters.get("binary_data", binary_outputs) is True:
            chosen.add(output["name"])
        outputs.append(output["name"])
    return outputs, chosen


def encode_infer_response(
    result: InferResult, request_id: Any, binary_outputs: set[str] | bool
) -> tuple[int, list, bytes]:
    encoded, raws = [], []
    for spec, array in result.answered():  # every output asked for, in the model's order
        output: dict[str, Any] = {"name": spec.name, "datatype": spec.datatype, "shape": list(array.shape)}
        if binary_outputs is True or (isinstance(binary_outputs, set) and spec.name in binary_outputs):
            raw = np.ascontiguousarray(array).tobytes()
            output["parameters"] = {"binary_data_size": len(raw)}
            raws.append(raw)
        else:
            output["data"] = tensors.to_values(array, spec.datatype)
        encoded.append(output)
    response = {"model_name": result.model.name, "model_version": "1", "outputs": encoded}
    if request_id not in (None, ""):
        response["id"] = request_id
    header = json.dumps(response, separators=(",", ":")).encode()
    if not raws:
        return 200, [(b"content-type", b"application/json")], header
    headers = [(b"content-type", b"application/octet-stream"), (HEADER_LENGTH.encode(), str(len(header)).encode())]
    return 200, headers, b"".join([header, *raws])


def _parameters(owner: dict[str, Any], what: str) -> dict[str, Any]:
    parameters = owner.get("parameters") or {}
    if not isinstance(parameters, dict):
        raise OipError(Status.INVALID_ARGUMENT, f"{what}: 'parameters' must be an object")
    return parameters


def _positive(value: Any, what: str) -> int:
    if type(value) is not int or value < 1:
        raise OipError(Status.INVALID_ARGUMENT, f"{what} must be a positive integer, got {str(value)[:40]}")
    return value


def _only(method: str, allowed: str, path: str) -> None:
    if method != allowed:
        raise OipError(Status.METHOD_NOT_ALLOWED, f"{path} takes {allowed}, not {method}")


def _json(value: Any, status: int = 200) -> tuple[int, list, bytes]:
    return status, [(b"content-type", b"application/json")], json.dumps(value, separators=(",", ":")).encode()


def _health(healthy: bool, why: str) -> tuple[int, list, bytes]:
    # The protocol: 200 for true, a 4xx for false (no body needed; the reason helps whoever looks).
    return (200, [], b"") if healthy else _json({"error": why}, 400)


def _error(status: Status, message: str) -> tuple[int, list, bytes]:
    code, headers, body = _json({"error": message}, status.http)
    if status in (Status.OVERLOADED, Status.UNAVAILABLE):
        headers.append((b"retry-after", b"1"))
    return code, headers, body


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
