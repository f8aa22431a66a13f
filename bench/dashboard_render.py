"""The Grafana dashboard's screenshot, drawn from a real Prometheus that scraped a real daemon.

`python bench/dashboard_render.py [--out docs/grafana/packrat-dashboard.png]` starts the daemon, Prometheus
and closed-loop clients as bench/prometheus_scrape.py does, drives a few load phases (more clients, larger
requests), then runs every query of docs/grafana/packrat-dashboard.json over the run through Prometheus's
HTTP API and draws each panel where the dashboard's grid puts it, with matplotlib. Grafana is not needed:
the picture shows what the dashboard's own queries return.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from prometheus_scrape import REPO, Prometheus, closed_loop, daemon_args, free_port, missing_binaries

DASHBOARD = REPO / "docs" / "grafana" / "packrat-dashboard.json"
# Grafana's $__rate_interval is at least four scrape intervals; the renderer's Prometheus scrapes every second.
RATE_INTERVAL = "4s"
PHASES = ((1, 1), (4, 1), (8, 1), (4, 4))  # (clients, samples per request)
UNITS = {"s": ("s", 1.0), "bytes": ("MiB", 1 / 2**20), "reqps": ("requests/s", 1.0), "percentunit": ("cores", 1.0)}


def legend(template: str, labels: dict[str, str]) -> str:
    """Grafana's legendFormat: {{label}} replaced by the series' label value."""
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), template) or str(labels)


def panel_series(prometheus: Prometheus, panel: dict[str, Any], start: float, end: float) -> list[tuple]:
    """(legend, times since start, values) for every series of every query of `panel`."""
    series = []
    for target in panel["targets"]:
        expression = target["expr"].replace("$__rate_interval", RATE_INTERVAL)
        for result in prometheus.api("query_range", query=expression, start=start, end=end, step=1):
            points = [(float(t) - start, float(v)) for t, v in result["values"] if v not in ("NaN", "+Inf", "-Inf")]
            if points:
                times, values = zip(*points, strict=True)
                series.append((legend(target.get("legendFormat", ""), result["metric"]), times, values))
    return series


def draw(dashboard: dict[str, Any], drawn: dict[int, list[tuple]], out: Path, caption: str) -> None:
    from matplotlib.figure import Figure
    from matplotlib.gridspec import GridSpec

    panels = dashboard["panels"]
    rows = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in panels)
    figure = Figure(figsize=(16, rows * 0.42), layout="constrained")
    grid = GridSpec(rows, 24, figure=figure)
    for panel in panels:
        g = panel["gridPos"]
        axes = figure.add_subplot(grid[g["y"] : g["y"] + g["h"], g["x"] : g["x"] + g["w"]])
        unit, scale = UNITS.get(panel["fieldConfig"]["defaults"].get("unit", ""), ("", 1.0))
        if unit == "s":  # the panels in seconds hold milliseconds here
            unit, scale = "ms", 1000.0
        for name, times, values in drawn[panel["id"]]:
            dashed = "predicted" in name or "prediction" in name
            axes.plot(times, [v * scale for v in values], "--" if dashed else "-", label=name, linewidth=1.2)
        axes.set_title(panel["title"], fontsize=10, loc="left")
        axes.set_ylabel(unit, fontsize=8)
        axes.set_xlabel("seconds into the run", fontsize=8)
        axes.tick_params(labelsize=7)
        axes.grid(alpha=0.3)
        if drawn[panel["id"]]:
            axes.legend(fontsize=7, loc="upper left")
    figure.suptitle(f"{dashboard['title']} dashboard: {caption}", fontsize=11)
    figure.savefig(out, dpi=90)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DASHBOARD.with_suffix(".png"))
    parser.add_argument("--seconds", type=float, default=20.0, help="length of each load phase")
    args = parser.parse_args()
    reason = missing_binaries()
    if reason:
        sys.exit(reason)
    from harness import DaemonProcess

    sys.path.insert(0, str(REPO))
    from tests.helpers.daemons import daemon_env  # the daemon imports the paced model from tests/

    os.environ.update(daemon_env())
    dashboard = json.loads(DASHBOARD.read_text())
    with tempfile.TemporaryDirectory(prefix="packrat-dashboard-") as folder:
        port = free_port()
        daemon = DaemonProcess("dashboard", Path(folder), daemon_args(port))
        prometheus = None
        try:
            daemon.wait()
            prometheus = Prometheus(Path(folder), [f"127.0.0.1:{port}"])
            prometheus.wait_for("up", 1.0)
            start = time.time()
            for clients, samples in PHASES:
                closed_loop(daemon.endpoint, clients, args.seconds, samples)
            time.sleep(3)  # the last scrapes
            end = time.time()
            drawn = {panel["id"]: panel_series(prometheus, panel, start, end) for panel in dashboard["panels"]}
        finally:
            if prometheus is not None:
                prometheus.close()
            daemon.close()
    phases = ", then ".join(f"{c} client(s) × {s} sample(s)" for c, s in PHASES)
    draw(dashboard, drawn, args.out, f"paced model (25 ms a batch), {args.seconds:g} s each of {phases}")
    empty = [panel["title"] for panel in dashboard["panels"] if not drawn[panel["id"]]]
    print(json.dumps({"out": str(args.out), "series": {p["title"]: len(drawn[p["id"]]) for p in dashboard["panels"]},
                      "empty_panels": empty}, indent=2))  # fmt: skip


if __name__ == "__main__":
    main()
