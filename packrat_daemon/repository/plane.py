"""One data plane for every model of the repository: each call routed by model name to the model's own
`DataPlane` (its own connection to its daemon, its own description and statistics), so that the REST and gRPC
frontends of the lone gateway (`protocol.rest`, `protocol.grpc.server`) serve the whole repository unchanged.

The server is ready while it is not draining and every model loaded has served once (a model whose daemon died
since is not ready itself, `model_ready`, while the others serve on); an unknown or unloaded model is NOT_FOUND,
naming those served.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from packrat_daemon import __version__
from packrat_daemon.protocol.dataplane import EXTENSIONS, DataPlane
from packrat_daemon.protocol.errors import OipError, Status
from packrat_daemon.protocol.gateway_metrics import GatewayMetrics
from packrat_daemon.protocol.model import InferInput, InferResult, ModelSpec
from packrat_daemon.protocol.upstream import Upstream

REPOSITORY_EXTENSION = "model_repository"


class RepositoryPlane(DataPlane):
    """The DataPlane the frontends see, over one DataPlane per loaded model. Its own upstream is none: every call
    that reaches a daemon goes through the model's plane."""

    def __init__(self, timeout_s: float = 60.0) -> None:  # no DataPlane.__init__: no upstream of its own
        self.model_name = None
        self.timeout_s = timeout_s
        self.draining = False
        self.metrics = GatewayMetrics()
        self.planes: dict[str, DataPlane] = {}  # loaded models, by name: changed on the gateway's loop only
        self.served_once: set[str] = set()
        self.on_probe: Callable[[str, bool], None] = lambda name, ready: None  # the supervisor's readiness
        self._in_flight_lock = threading.Lock()

    @property
    def in_flight(self) -> int:
        return sum(plane.in_flight for plane in list(self.planes.values()))

    @in_flight.setter
    def in_flight(self, value: int) -> None:
        """Nothing: each model's plane counts its own."""

    # -- the models loaded ----------------------------------------------------------------------
    def add(self, name: str, endpoint: str) -> None:
        """Route `name` to the daemon at `endpoint` from now on (on the gateway's loop)."""
        self.remove(name)
        plane = DataPlane(Upstream(endpoint), name, self.timeout_s)
        plane.metrics = self.metrics  # one set of gateway metrics for every model
        self.planes[name] = plane

    def remove(self, name: str) -> None:
        plane = self.planes.pop(name, None)
        self.served_once.discard(name)
        if plane is not None:
            plane.draining = True
            plane.upstream.close()

    def _plane(self, name: str) -> DataPlane:
        plane = self.planes.get(name)
        if plane is None:
            served = ", ".join(sorted(self.planes)) or "none"
            raise OipError(
                Status.NOT_FOUND,
                f"unknown model {name!r}; this server serves {served} (load a model of "
                "the repository with POST /v2/repository/models/NAME/load)",
            )
        return plane

    # -- health ---------------------------------------------------------------------------------
    async def ready(self) -> bool:
        if self.draining:
            return False
        for name in list(self.planes):
            await self.model_ready(name)
        return all(name in self.served_once for name in self.planes) and not self.draining

    async def model_ready(self, name: str, version: str | None = None) -> bool:
        plane = self.planes.get(name)
        if plane is None or self.draining:
            return False
        ready = await plane.model_ready(name, version)
        if ready:
            self.served_once.add(name)
        self.on_probe(name, ready)
        return ready

    # -- metadata -------------------------------------------------------------------------------
    def server_metadata(self) -> dict[str, Any]:
        return {"name": "packrat", "version": __version__, "extensions": [*EXTENSIONS, REPOSITORY_EXTENSION]}

    async def model(self, name: str, version: str | None = None) -> ModelSpec:
        return await self._plane(name).model(name, version)

    def known_model(self, name: str, version: str | None = None) -> ModelSpec | None:
        plane = self.planes.get(name)
        return None if plane is None else plane.known_model(name, version)

    async def model_metadata(self, name: str, version: str | None = None) -> dict[str, Any]:
        return await self._plane(name).model_metadata(name, version)

    async def model_config(self, name: str, version: str | None = None) -> dict[str, Any]:
        return await self._plane(name).model_config(name, version)

    async def model_statistics(self, name: str = "", version: str | None = None) -> list[dict[str, Any]]:
        if name:
            return await self._plane(name).model_statistics(name, version)
        stats = []
        for model, plane in sorted(self.planes.items()):
            if plane.spec is not None:
                stats += await plane.model_statistics(model)
        return stats

    # -- inference ------------------------------------------------------------------------------
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
        if self.draining:
            raise OipError(Status.UNAVAILABLE, "the server is shutting down; retry elsewhere", "SHUTTING_DOWN")
        plane = self._plane(name)
        return await plane.infer(name, version, inputs, outputs, request_id, timeout_s, started_ns, client)

    def answered(self, result: InferResult, encoding_ns: int) -> None:
        plane = self.planes.get(result.model.name)
        if plane is not None:
            plane.answered(result, encoding_ns)
