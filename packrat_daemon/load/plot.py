"""`--plot FILE.png`: a sweep's latency–throughput curve. matplotlib is an optional extra (`.[plot]`)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from packrat_daemon.wire.errors import ConfigError

INSTALL = "pip install -e '.[plot]' (or pip install matplotlib)"


def check_plotting(needed_by: str = "--plot") -> None:
    """Raise before a sweep runs (or a report reads its files), not after, when a plot cannot be drawn."""
    if importlib.util.find_spec("matplotlib") is None:
        raise ConfigError(f"{needed_by} needs matplotlib, which is not installed: {INSTALL}")


def plot_sweep(reports: list[dict[str, Any]], path: str | Path, title: str = "") -> None:
    """p50 and p99 latency against achieved throughput, one point per offered rate."""
    check_plotting()
    # The object API without pyplot: no global figure state and no display backend to choose.
    from matplotlib.figure import Figure

    points = [r for r in reports if r["throughput_rps"] is not None and r["latency_ms"]["p50"] is not None]
    if not points:
        raise ConfigError("no rate of the sweep had an answered request; there is no curve to plot")
    figure = Figure(figsize=(7, 4.5), layout="constrained")
    axes = figure.subplots()
    throughput = [r["throughput_rps"] for r in points]
    for name, style in (("p50", "o-"), ("p99", "s--")):
        axes.plot(throughput, [r["latency_ms"][name] for r in points], style, label=name)
    for report in points:
        axes.annotate(
            f"{report['rate_rps']:g}/s",
            (report["throughput_rps"], report["latency_ms"]["p99"]),
            textcoords="offset points",
            xytext=(0, 6),
            ha="center",
            fontsize=7,
        )
    axes.set_xlabel("throughput (answered requests/s)")
    axes.set_ylabel("latency (ms)")
    axes.set_title(title or "latency against throughput (labels: offered rate)", fontsize=9)
    axes.grid(alpha=0.3)
    axes.legend()
    try:
        figure.savefig(path, dpi=120)
    except OSError as exc:
        raise ConfigError(f"cannot write the plot to {path}: {exc.strerror or exc}") from None
