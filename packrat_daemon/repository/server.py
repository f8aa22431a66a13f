"""`packrat serve --repository DIR`: every model of the repository behind one Open Inference Protocol endpoint
(REST and gRPC, each on one port, with Triton's model-repository extension) and one metrics endpoint; one daemon
per model, supervised (`repository.daemons`); the joint core plan over the models loaded (`repository.joint`).

This process binds the gateway's ports first (a port in use fails the start at once, exit 2), then starts every
model's daemon and routes to each by name as soon as it serves. On SIGTERM (or SIGINT) the gateway stops being
ready, refuses new inferences and answers those it took (as the lone gateway drains, `protocol.gateway`), then
each daemon drains and stops. docs/repository.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import signal
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from packrat_daemon.ops.hardening import private_dir
from packrat_daemon.ops.notify import sd_notify
from packrat_daemon.protocol.gateway import DRAIN_GRACE_S, GatewayOptions, bound, drain, host_port, rest_started
from packrat_daemon.protocol.gateway_metrics import GRPC, serve_metrics
from packrat_daemon.protocol.limits import GatewayLimits
from packrat_daemon.repository.extension import RepositoryRestApp, grpc_handler
from packrat_daemon.repository.joint import JointPlan
from packrat_daemon.repository.layout import Repository, check_shared, read_repository
from packrat_daemon.repository.metrics import RepositoryCollector
from packrat_daemon.repository.plane import RepositoryPlane
from packrat_daemon.repository.service import RepositoryService
from packrat_daemon.wire.errors import ConfigError

log = logging.getLogger("packrat.repository")

STATUS_FILE = "coordinator.json"  # the joint plan's status, in the repository's run dir


def gateway_options(config: Any) -> GatewayOptions:
    """The one gateway's options from the repository's settings; ConfigError before anything starts."""
    if not config.http_port and not config.grpc_port:
        raise ConfigError(
            "a repository is served over the Open Inference Protocol: give --http-port or --grpc-port "
            "(or both), e.g. --http-port 8000 --grpc-port 8001"
        )
    if config.oip_model_name is not None:
        raise ConfigError(
            "--oip-model-name names a lone daemon's model; a repository serves each model under its "
            "own name (its folder, config.pbtxt's name, or [models.NAME])"
        )
    options = GatewayOptions(
        connect="(one per model)",
        http_port=config.http_port,
        grpc_port=config.grpc_port,
        address=config.oip_address,
        tls_cert=config.oip_tls_cert,
        tls_key=config.oip_tls_key,
        insecure_public=config.insecure_public,
        grpc_server="aio",
        metrics_port=config.oip_metrics_port,
        limits=GatewayLimits().with_settings([p for p in (config.oip_limits or "").split(",") if p.strip()]),
    )
    options.check()
    return options


def run_dir_of(config: Any) -> Path:
    """The repository's run dir: --run-dir, else systemd's RuntimeDirectory=, else a private temp folder."""
    given = config.run_dir or os.environ.get("RUNTIME_DIRECTORY", "").split(":")[0]
    return private_dir(given) if given else Path(tempfile.mkdtemp(prefix="packrat-repository-"))


def serve_repository(config: Any, flags: Mapping[str, Any]) -> int:
    """Serve the repository `config.repository` until SIGTERM or SIGINT; 0 once every model has stopped."""
    from policies.planning.topology import Topology

    repository = read_repository(config.repository)
    check_shared(flags, "the command line would")
    options = gateway_options(config)
    run_dir = run_dir_of(config)
    topology = Topology.detect().share(config.cpus)
    joint = JointPlan(topology, run_dir / STATUS_FILE)
    log.info(
        "repository %s: %d model(s) (%s); run dir %s",
        repository.root,
        len(repository.models),
        ", ".join(repository.models),
        run_dir,
    )
    asyncio.run(_serve(repository, flags, options, run_dir, joint))
    return 0


async def _serve(
    repository: Repository, flags: Mapping[str, Any], options: GatewayOptions, run_dir: Path, joint: JointPlan
) -> None:
    from packrat_daemon.protocol.grpc.server import grpc_server
    from packrat_daemon.protocol.http_server import rest_server
    from packrat_daemon.protocol.rest import RestApp

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    # Not a stop: a repository is changed at run time through the extension's load and unload.
    loop.add_signal_handler(
        signal.SIGHUP,
        log.warning,
        "SIGHUP ignored: a repository does not reload; load or "
        "unload models with the repository extension, or restart it to read the repository again",
    )
    plane = RepositoryPlane()
    service = RepositoryService(repository, flags, run_dir, joint, plane)
    plane.metrics.registry.register(RepositoryCollector(service))
    rpc, rest, rest_task = None, None, None
    try:
        serve_metrics(plane.metrics, options.address, options.metrics_port, stop)  # a taken port fails first
        if options.grpc_port:
            rpc = grpc_server(plane, options.max_request_mb << 20)
            rpc.add_generic_rpc_handlers((grpc_handler(service, functools.partial(plane.metrics.call, GRPC)),))
            _bind_grpc(rpc, options)
            await rpc.start()
        if options.http_port:
            refused = functools.partial(plane.metrics.refused, "rest")
            app = RepositoryRestApp(RestApp(plane, options.limits), service)
            rest = rest_server(app, options, DRAIN_GRACE_S, refused)
            rest_task = asyncio.create_task(rest.serve(sockets=[bound(options.address, options.http_port)]))
            await rest_started(rest, rest_task)
        log.info("Open Inference Protocol for the repository: %s (%s)", _ports(options), options.describe())
        starting = asyncio.create_task(service.start())
        await _until_stopped(stop, starting, rest_task)
    finally:
        plane.draining = True
        await drain(plane)
        if rest is not None:
            rest.should_exit = True
        if rpc is not None:
            await rpc.stop(DRAIN_GRACE_S)
        if rest_task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await rest_task
        for name in list(plane.planes):
            plane.remove(name)
        await service.close()
        log.info("repository stopped")


def _bind_grpc(rpc: Any, options: GatewayOptions) -> None:
    import grpc

    target = host_port(options.address, options.grpc_port)
    try:
        if options.tls_cert and options.tls_key:
            with open(options.tls_key, "rb") as key, open(options.tls_cert, "rb") as cert:
                credentials = grpc.ssl_server_credentials([(key.read(), cert.read())])
            bound_port = rpc.add_secure_port(target, credentials)
        else:
            bound_port = rpc.add_insecure_port(target)
    except RuntimeError:
        bound_port = 0
    if not bound_port:
        raise ConfigError(f"cannot bind gRPC to {target}; is the port in use?")


async def _until_stopped(stop: asyncio.Event, starting: asyncio.Task[None], rest_task: Any) -> None:
    """Until a stop signal; READY=1 to systemd once every model loaded at start serves (or failed)."""
    stopped = asyncio.create_task(stop.wait())
    waiting = {stopped, starting, *filter(None, [rest_task])}
    while not stop.is_set():
        done, waiting = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
        if starting in done:
            starting.result()
            sd_notify("READY=1")
        if rest_task is not None and rest_task in done:
            rest_task.result()
            raise RuntimeError("the REST server stopped by itself")
    if not starting.done():
        starting.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await starting


def _ports(options: GatewayOptions) -> str:
    ports = [f"HTTP on {host_port(options.address, options.http_port)}"] if options.http_port else []
    ports += [f"gRPC on {host_port(options.address, options.grpc_port)}"] if options.grpc_port else []
    return " and ".join(ports)
