"""A real Prometheus scraping a real daemon under client load, and how its quantiles compare with the client's.

`python bench/prometheus_scrape.py` starts the Debian package's `prometheus` on loopback (a temporary
config and storage folder, a 1 s scrape interval), a daemon serving a paced model (25 ms a batch,
asleep), and closed-loop clients; then it asks Prometheus for `histogram_quantile(0.9, …)` over every
request of the run and prints it beside the p90 the clients measured, as JSON. The test
tests/packrat_daemon/test_prometheus.py and the dashboard's screenshot (bench/dashboard_render.py) use the
same pieces.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from harness import REPO, DaemonProcess, free_port, stop

from packrat_daemon.wire.client import Client

PACED_MODEL = "tests.model_factories:paced_mlp"  # tests/model_factories.py: 25 ms a batch, asleep
QUANTILES = (0.5, 0.9, 0.99)


def missing_binaries() -> str | None:
    """Why a real Prometheus cannot run here, or None when it can."""
    missing = [name for name in ("prometheus", "promtool") if shutil.which(name) is None]
    if missing:
        return f"{' and '.join(missing)} not on PATH: install the Debian package (apt-get install prometheus)"
    return None


class Prometheus:
    """`prometheus` on 127.0.0.1 scraping `targets` every `interval_s`, its data in `folder`."""

    def __init__(self, folder: Path, targets: list[str], interval_s: float = 1.0) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = folder / "prometheus.yml"
        config.write_text(
            f"global:\n  scrape_interval: {interval_s:g}s\n  evaluation_interval: {interval_s:g}s\n"
            f"scrape_configs:\n  - job_name: packrat\n    static_configs:\n      - targets: {json.dumps(targets)}\n"
        )
        self.log_path = folder / "prometheus.log"
        command = [
            "prometheus",
            f"--config.file={config}",
            f"--storage.tsdb.path={folder / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--log.level=warn",
        ]
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        self._wait(lambda: self._get("/-/ready") is not None, 60, "Prometheus did not become ready")

    def _get(self, path: str) -> bytes | None:
        try:
            with urllib.request.urlopen(self.url + path, timeout=5) as reply:
                return reply.read()
        except OSError:
            return None

    def _wait(self, done: Callable[[], bool], timeout: float, message: str) -> None:
        deadline = time.monotonic() + timeout
        while not done():
            if self.process.poll() is not None:
                raise RuntimeError(f"prometheus exited: {self.log_path.read_text(errors='replace')[-2000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{message} within {timeout:.0f} s")
            time.sleep(0.2)

    def api(self, endpoint: str, **params: Any) -> Any:
        try:
            with urllib.request.urlopen(f"{self.url}/api/v1/{endpoint}?{urllib.parse.urlencode(params)}") as answer:
                reply = json.loads(answer.read())
        except urllib.error.HTTPError as exc:  # a bad query: Prometheus says why in the body
            reply = json.loads(exc.read() or b"{}")
        if reply.get("status") != "success":
            raise RuntimeError(f"Prometheus refused {params}: {reply.get('error')}")
        return reply["data"]["result"]

    def value(self, expression: str) -> float | None:
        """An expression's one value now, or None when it has none (yet)."""
        result = self.api("query", query=expression)
        return float(result[0]["value"][1]) if result else None

    def wait_for(self, expression: str, expected: float, timeout: float = 60.0) -> None:
        """Until `expression` is `expected`: e.g. until the scrape after a load saw all its requests."""
        self._wait(lambda: self.value(expression) == expected, timeout, f"{expression} did not reach {expected}")

    def close(self) -> None:
        stop(self.process, 30)
        self.process.wait()


def closed_loop(endpoint: str, clients: int, seconds: float, samples: int = 1) -> list[float]:
    """`clients` threads, each sending one request after another for `seconds`; every latency in s."""
    latencies: list[float] = []
    lock = threading.Lock()
    stop = time.monotonic() + seconds

    def client() -> None:
        x = np.ones((samples, 16), dtype=np.float32)
        mine = []
        with Client(endpoint, timeout=30) as c:
            while time.monotonic() < stop:
                start = time.perf_counter()
                c.infer(x)
                mine.append(time.perf_counter() - start)
        with lock:
            latencies.extend(mine)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return latencies


def compare(prometheus: Prometheus, latencies: list[float], before: tuple[float, float] | None = None) -> dict:
    """Prometheus's quantiles over exactly the requests in `latencies` beside the clients' own, once a scrape
    has seen them all. The raw cumulative buckets, no rate window: with `before` (the unix time and the
    request count of a scrape just before the run) the buckets as they were then are subtracted (`@`)."""
    count = "sum(packrat_request_latency_seconds_count)"
    buckets = "sum by (le) (packrat_request_latency_seconds_bucket{at})"
    if before is not None:
        at, counted = before
        prometheus.wait_for(count, counted + len(latencies))
        buckets = f"({buckets.format(at='')} - {buckets.format(at=f' @ {at:.3f}')})"
    else:
        prometheus.wait_for(count, float(len(latencies)))
        buckets = buckets.format(at="")
    rows = {}
    for q in QUANTILES:
        scraped = prometheus.value(f"histogram_quantile({q}, {buckets})")
        measured = float(np.percentile(latencies, q * 100))
        rows[f"p{q * 100:g}"] = {
            "prometheus_ms": None if scraped is None else round(scraped * 1000, 3),
            "client_ms": round(measured * 1000, 3),
            "ratio": None if scraped is None else round(scraped / measured, 4),
        }
    return {"requests": len(latencies), "quantiles": rows}


def promtool_check(metrics_text: bytes) -> tuple[int, str]:
    """`promtool check metrics` on an exposition: its exit status and what it said."""
    done = subprocess.run(["promtool", "check", "metrics"], input=metrics_text, capture_output=True, timeout=60)
    return done.returncode, (done.stdout + done.stderr).decode(errors="replace")


def daemon_args(metrics_port: int) -> list[str]:
    """A daemon for the paced model under the packrat policy, its profile measured at start."""
    return ["--model", PACED_MODEL, "--max-batch", "4", "--batches", "1,2,4", "--metrics-port", str(metrics_port)]


def main() -> None:
    reason = missing_binaries()
    if reason:
        sys.exit(reason)
    sys.path.insert(0, str(REPO))
    from tests.helpers.daemons import daemon_env  # the daemon imports the paced model from tests/

    os.environ.update(daemon_env())
    with tempfile.TemporaryDirectory(prefix="packrat-prometheus-") as folder:
        port = free_port()
        daemon = DaemonProcess("scraped", Path(folder), daemon_args(port))
        prometheus = None
        try:
            info = daemon.wait()
            prometheus = Prometheus(Path(folder), [f"127.0.0.1:{port}"])
            prometheus.wait_for("up", 1.0)
            runs, before = [], None
            for clients in (1, 3, 8):
                latencies = closed_loop(daemon.endpoint, clients, 8.0)
                runs.append({"clients": clients, **compare(prometheus, latencies, before)})
                before = (time.time(), float(sum(run["requests"] for run in runs)))
            status, said = promtool_check(urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read())
            print(json.dumps({
                "model": PACED_MODEL, "plan": info["plan"], "scrape_interval_s": 1.0,
                "promtool_check_metrics": {"exit_status": status, "output": said.strip()},
                "runs": runs,
            }, indent=2))  # fmt: skip
        finally:
            if prometheus is not None:
                prometheus.close()
            daemon.close()


if __name__ == "__main__":
    main()
