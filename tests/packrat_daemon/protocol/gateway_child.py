"""A gateway composed as `gateway.serve_gateway` composes it, in a process of its own for the tests: a real `RestApp`
under uvicorn and a real gRPC server (threaded or grpc.aio) over a `DataPlane`, and the metrics port of their own.

A process of its own because Packrat's generated gRPC messages and tritonclient's share the `inference.` names,
and one process's protobuf pool cannot hold both (test_grpc_stubs says the same): the tests, which import
tritonclient, drive this one through its standard input and output, a line each way:

    python -m tests.packrat_daemon.protocol.gateway_child ENDPOINT REST RPC METRICS_PORT
    → {"http": PORT, "grpc": PORT}                 once it serves and the daemon's model is known
    ← draining 1 | draining 0                       the gateway's own drain (its stop signal) on or off
    ← serve-metrics PORT                            serve_metrics once more: → "ok", or "error MESSAGE"
    ← stop                                          stop everything and exit 0

Readiness is asked of the daemon at every question (READY_TTL_S 0), so a test sees a change of the daemon's at once.
"""

from __future__ import annotations

import asyncio
import json
import socket
import sys
from typing import Any

import grpc
import uvicorn

from packrat_daemon.protocol import dataplane
from packrat_daemon.protocol.dataplane import DataPlane
from packrat_daemon.protocol.gateway_metrics import serve_metrics
from packrat_daemon.protocol.grpc.server import grpc_server, threaded_grpc_server
from packrat_daemon.protocol.rest import RestApp
from packrat_daemon.protocol.upstream import ThreadUpstreams, Upstream
from packrat_daemon.wire.errors import ConfigError

MODEL = "tiny"


async def _serve_rest(plane: DataPlane) -> tuple[uvicorn.Server, asyncio.Task[None], int]:
    """A RestApp under uvicorn on a port of its own, started: the server, its task and the port."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(RestApp(plane), lifespan="off", access_log=False, log_level="warning"))
    rest_task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        await asyncio.sleep(0.005)
    return server, rest_task, sock.getsockname()[1]


async def _answer(plane: DataPlane, stopping: asyncio.Event) -> None:
    """The test's lines on standard input, until "stop" or its end."""
    loop = asyncio.get_running_loop()
    while True:
        line = (await loop.run_in_executor(None, sys.stdin.readline)).split()
        if not line or line[0] == "stop":
            break
        if line[0] == "draining":
            plane.draining = line[1] == "1"
            print("ok", flush=True)
        elif line[0] == "serve-metrics":
            try:
                serve_metrics(plane.metrics, "127.0.0.1", int(line[1]), stopping)
                print("ok", flush=True)
            except ConfigError as exc:
                print(f"error {exc}", flush=True)


async def _stop_rpc(rpc: Any, threads: ThreadUpstreams | None) -> None:
    if isinstance(rpc, grpc.aio.Server):
        await rpc.stop(0)
    elif rpc is not None:
        rpc.stop(0).wait()
    if threads is not None:
        threads.close()


async def main(endpoint: str, rest: bool, rpc_kind: str, metrics_port: int) -> None:
    dataplane.READY_TTL_S = 0.0
    loop = asyncio.get_running_loop()
    stopping = asyncio.Event()
    upstream = Upstream(endpoint, None)
    plane = DataPlane(upstream, MODEL, timeout_s=5.0)
    server: uvicorn.Server | None = None
    rpc: Any = None
    threads: ThreadUpstreams | None = None
    ports = {"http": 0, "grpc": 0}
    if rest:
        server, rest_task, ports["http"] = await _serve_rest(plane)
    if rpc_kind == "threads":
        threads = ThreadUpstreams(endpoint, None, upstream)
        rpc = threaded_grpc_server(plane, threads, loop, 1 << 20)
    elif rpc_kind == "aio":
        rpc = grpc_server(plane, 1 << 20)
    if rpc is not None:
        ports["grpc"] = rpc.add_insecure_port("127.0.0.1:0")
        started = rpc.start()
        if asyncio.iscoroutine(started):
            await started
    metrics_task = serve_metrics(plane.metrics, "127.0.0.1", metrics_port, stopping)
    while not await plane.ready():  # the model described before the first client asks, as gateway._warm_up does
        await asyncio.sleep(0.01)
    print(json.dumps(ports), flush=True)
    await _answer(plane, stopping)
    stopping.set()
    if server is not None:
        server.should_exit = True
        await rest_task
    await _stop_rpc(rpc, threads)
    if metrics_task is not None:
        await metrics_task
    upstream.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2] == "1", sys.argv[3], int(sys.argv[4])))
