"""Triton's model-repository extension, over REST and gRPC, in front of the repository's models:

- `POST /v2/repository/index` (body `{"ready": true}` optional): every model of the repository, loaded or not,
  `[{"name", "version", "state", "reason"}]`, state READY, LOADING, UNAVAILABLE, UNLOADING or UNLOADED;
- `POST /v2/repository/models/NAME/load`: start NAME's daemon, wait until it serves, and give it cores through
  the joint plan; 200 once it serves, 400 with its reason if it cannot start;
- `POST /v2/repository/models/NAME/unload`: stop routing to NAME, drain and stop its daemon, and give its cores
  to the others through the joint plan;
- gRPC's `RepositoryIndex`, `RepositoryModelLoad` and `RepositoryModelUnload` on `inference.GRPCInferenceService`.

A load's `config` or `file:` parameters (a configuration or files sent with the request) are refused: the
repository on disk is what is served. Every other path is the Open Inference Protocol's (`protocol.rest`).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import grpc

from packrat_daemon.protocol.errors import OipError, Status
from packrat_daemon.protocol.gateway_metrics import REST, Call
from packrat_daemon.protocol.rest import Receive, RestApp, Scope, Send
from packrat_daemon.repository import repository_pb2 as pb

SERVICE = "inference.GRPCInferenceService"
MAX_BODY_BYTES = 1 << 16


class Models(Protocol):
    """What the extension asks of the repository (`repository.server.RepositoryService`)."""

    async def index(self, ready_only: bool) -> list[dict[str, str]]: ...

    async def load(self, name: str) -> None: ...

    async def unload(self, name: str) -> None: ...


def check_parameters(parameters: dict[str, Any], action: str) -> None:
    """A load with a configuration or files of its own is refused: Packrat serves the repository on disk."""
    sent = [key for key in parameters if key == "config" or key.startswith("file:")]
    if action == "load" and sent:
        raise OipError(
            Status.INVALID_ARGUMENT,
            f"a load with {', '.join(sent)} is not served: Packrat loads the model "
            "as the repository on disk holds it; change it there and load it again",
        )


class RepositoryRestApp:
    """The REST application: the extension's three routes, and every other one the gateway's own `RestApp`'s."""

    def __init__(self, app: RestApp, models: Models) -> None:
        self.app, self.models = app, models

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith("/v2/repository"):
            await self.app(scope, receive, send)
            return
        endpoint = "repository_" + (scope["path"].rstrip("/").rsplit("/", 1)[-1] or "index")
        with self.app.plane.metrics.call(REST, endpoint) as call:
            try:
                status, body = await self._route(scope, receive)
            except OipError as exc:
                call.refused(exc.status, exc.packrat_code)
                status, body = exc.status.http, json.dumps({"error": exc.message}).encode()
            call.status = str(status)
            headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
            await send({"type": "http.response.start", "status": status, "headers": headers})
            await send({"type": "http.response.body", "body": body})

    async def _route(self, scope: Scope, receive: Receive) -> tuple[int, bytes]:
        parts = scope["path"].rstrip("/").split("/")[3:]  # after /v2/repository
        if scope["method"] != "POST":
            raise OipError(Status.INVALID_ARGUMENT, f"{scope['path']} takes POST, not {scope['method']}")
        request = await _json_body(receive)
        if parts == ["index"]:
            ready = request.get("ready", False) is True
            return 200, json.dumps(await self.models.index(ready)).encode()
        if len(parts) == 3 and parts[0] == "models" and parts[2] in ("load", "unload"):
            parameters = request.get("parameters") or {}
            if not isinstance(parameters, dict):
                raise OipError(Status.INVALID_ARGUMENT, "'parameters' must be a JSON object")
            check_parameters(parameters, parts[2])
            await (self.models.load if parts[2] == "load" else self.models.unload)(parts[1])
            return 200, b""
        raise OipError(
            Status.NOT_FOUND,
            f"no route {scope['path']}; the repository extension's routes are "
            "/v2/repository/index and /v2/repository/models/NAME/load (or /unload)",
        )


async def _json_body(receive: Receive) -> dict[str, Any]:
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if len(body) > MAX_BODY_BYTES:
            raise OipError(Status.INVALID_ARGUMENT, f"a repository request's body is at most {MAX_BODY_BYTES} bytes")
        if not message.get("more_body"):
            break
    if not body.strip():
        return {}
    try:
        request = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise OipError(Status.INVALID_ARGUMENT, f"the request body is not valid JSON: {exc}") from None
    if not isinstance(request, dict):
        raise OipError(Status.INVALID_ARGUMENT, "the request body must be a JSON object")
    return request


def grpc_handler(models: Models, call: Callable[[str], Call]) -> grpc.GenericRpcHandler:
    """The extension's three calls on `inference.GRPCInferenceService`, for grpc.aio (`call(endpoint)`: the
    gateway's metrics of one call)."""

    async def index(request: pb.RepositoryIndexRequest, context: grpc.aio.ServicerContext) -> Any:
        async def run() -> Any:
            response = pb.RepositoryIndexResponse()
            for entry in await models.index(request.ready):
                response.models.add(**entry)
            return response

        return await _answer(context, run, call("repository_index"))

    async def load(request: Any, context: grpc.aio.ServicerContext) -> Any:
        async def run() -> Any:
            check_parameters(dict(request.parameters), "load")
            await models.load(request.model_name)
            return pb.RepositoryModelLoadResponse()

        return await _answer(context, run, call("repository_load"))

    async def unload(request: Any, context: grpc.aio.ServicerContext) -> Any:
        async def run() -> Any:
            await models.unload(request.model_name)
            return pb.RepositoryModelUnloadResponse()

        return await _answer(context, run, call("repository_unload"))

    def method(function: Any, request: Any, response: Any) -> grpc.RpcMethodHandler:
        return grpc.unary_unary_rpc_method_handler(
            function, request_deserializer=request.FromString, response_serializer=response.SerializeToString
        )

    handlers = {
        "RepositoryIndex": method(index, pb.RepositoryIndexRequest, pb.RepositoryIndexResponse),
        "RepositoryModelLoad": method(load, pb.RepositoryModelLoadRequest, pb.RepositoryModelLoadResponse),
        "RepositoryModelUnload": method(unload, pb.RepositoryModelUnloadRequest, pb.RepositoryModelUnloadResponse),
    }
    return grpc.method_handlers_generic_handler(SERVICE, handlers)


async def _answer(context: grpc.aio.ServicerContext, run: Callable[[], Awaitable[Any]], seen: Call) -> Any:
    with seen:
        try:
            return await run()
        except OipError as exc:
            seen.refused(exc.status, exc.packrat_code)
            await context.abort(grpc.StatusCode[exc.status.grpc], exc.message)
    raise AssertionError("context.abort returns only by raising")
