"""A real Prometheus (the Debian package) scrapes a real daemon under client load.

Its `histogram_quantile(0.9, …)` over the requests of the run must be within 10% of the p90 the clients
measured, and `promtool check metrics` must find nothing to say about the daemon's exposition.
"""

from __future__ import annotations

import sys
import urllib.request
from pathlib import Path

import pytest

from tests.helpers.daemons import REPO, running_daemon

sys.path.insert(0, str(REPO / "bench"))
from prometheus_scrape import (  # noqa: E402
    Prometheus,
    closed_loop,
    compare,
    daemon_args,
    free_port,
    missing_binaries,
    promtool_check,
)

MISSING = missing_binaries()
pytestmark = [pytest.mark.slow, pytest.mark.skipif(MISSING is not None, reason=MISSING or "")]


def test_prometheus_p90_is_within_10_percent_of_the_clients_and_promtool_is_clean(tmp_path: Path) -> None:
    port = free_port()
    with running_daemon(tmp_path, *daemon_args(port), timeout=300) as (endpoint, _):
        prometheus = Prometheus(tmp_path, [f"127.0.0.1:{port}"])
        try:
            prometheus.wait_for("up", 1.0)
            latencies = closed_loop(endpoint, clients=4, seconds=6.0)
            result = compare(prometheus, latencies)
            exposition = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
        finally:
            prometheus.close()
    p90 = result["quantiles"]["p90"]
    assert result["requests"] > 100
    assert p90["ratio"] is not None and 0.9 <= p90["ratio"] <= 1.1, result
    status, said = promtool_check(exposition)
    assert (status, said.strip()) == (0, ""), said
    assert b"packrat_layout_compute_seconds_bucket" in exposition  # the per-layout series are linted too
