"""One service: the daemon and the frontends beside it start, serve and stop together (docs/oip.md, "One
service"). The Open Inference Protocol gateway starts first, so a port it cannot bind fails the start before
minutes of profiling; the daemon is ready only while it serves; on a stop signal it drains first (`Daemon`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import zmq

from packrat_daemon.config import ServeConfig
from packrat_daemon.daemon import Daemon
from packrat_daemon.ops.metrics import Metrics
from packrat_daemon.protocol.launch import GatewayProcess
from packrat_daemon.signals import SignalQueue
from packrat_daemon.startup import Started, start_up

log = logging.getLogger("packrat.daemon")


def serve(config: ServeConfig, reload_config: Callable[[], ServeConfig] | None = None) -> int:
    """Start up, serve until a stop signal, drain, shut down; the caller's signal handlers are back on return."""
    signals, context, metrics = SignalQueue(), zmq.Context(), Metrics(config.model)
    gateway = GatewayProcess.from_config(config)  # --http-port/--grpc-port (docs/oip.md, "One service")
    started: Started | None = None
    daemon: Daemon | None = None
    with signals.installed():
        try:
            if gateway is not None:  # first: a port it cannot bind fails the start before minutes of profiling
                gateway.start()
                metrics.frontends_serving = lambda: gateway.serving
            started = start_up(config, context, metrics, lambda: signals.interrupting)
            daemon = Daemon(config, started, context, metrics, signals, reload_config, gateway)
            daemon.start()
            daemon.run()
        except KeyboardInterrupt:
            log.info("interrupted during start-up")
            return 130
        finally:
            metrics.close()
            if daemon is not None:
                daemon.close()
            elif started is not None:  # the daemon was never built: its template is still ours to stop
                started.served.backend.close()
                if started.measuring is not None:
                    started.measuring.close()
            if gateway is not None:
                gateway.close()
            if daemon is None:  # a failed start may leave sockets open, on which term() would wait for ever
                context.destroy(linger=0)
            else:
                context.term()
            log.info("stopped")
    return 0
