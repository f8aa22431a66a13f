"""The gateway's DEALER to the daemon (packrat_daemon/protocol/upstream.py) against a real daemon."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import pytest

from packrat_daemon.protocol.upstream import Upstream
from tests.helpers.daemons import running_daemon


def _ipv6_loopback_port() -> int | None:
    """A free port on the IPv6 loopback, or None where this machine has none."""
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
            return int(probe.getsockname()[1])
    except OSError:
        return None


@pytest.mark.slow
@pytest.mark.skipif(_ipv6_loopback_port() is None, reason="no IPv6 loopback (::1) on this machine")
def test_the_upstream_reaches_a_daemon_on_ipv6_loopback(tmp_path: Path) -> None:
    # Before: the DEALER lacked ZMQ_IPV6, so connecting to tcp://[::1]:P never handshook and every request
    # failed with "no connection to the daemon".
    port = _ipv6_loopback_port()
    endpoint = f"tcp://[::1]:{port}"
    with running_daemon(tmp_path, "--model", "tests.model_factories:doubler", "--policy", "fixed",
                        "--plan", "1x1", "--max-batch", "2", "--no-adapt", bind=endpoint):  # fmt: skip
        upstream = Upstream(endpoint)

        async def ask() -> dict[str, object]:
            for _ in range(200):  # the socket monitor reports the handshake asynchronously
                upstream._watch()
                if upstream.connected:
                    break
                await asyncio.sleep(0.05)
            return await upstream.describe("info", timeout_s=10.0)

        try:
            info = asyncio.run(ask())
        finally:
            upstream.close()
        assert info["ok"] is True and info["model"] == "tests.model_factories:doubler"
