"""A sweep's latency–throughput curve drawn for real (matplotlib's object API): the file, what it shows,
and the errors for a sweep with nothing to draw, an unwritable path and a missing matplotlib."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

from packrat_daemon.load.plot import INSTALL, check_plotting, plot_sweep
from packrat_daemon.wire.errors import ConfigError

pytest.importorskip("matplotlib", reason="matplotlib is not installed (pip install -e '.[test]')")


def report(rate: float, throughput: float | None, p50: float | None, p99: float | None) -> dict[str, Any]:
    """The fields of one rate's load report that the plot reads."""
    return {"rate_rps": rate, "throughput_rps": throughput, "latency_ms": {"p50": p50, "p99": p99}}


SWEEP = [report(10, 9.9, 1.5, 3.0), report(40, 39.2, 1.8, 4.5), report(160, 120.0, 12.0, 60.0)]


def test_the_curve_is_a_png_of_the_figures_size(tmp_path: Path) -> None:
    from matplotlib.image import imread

    path = tmp_path / "curve.png"
    plot_sweep(SWEEP, path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert imread(path).shape[:2] == (540, 840)  # 7 × 4.5 inches at 120 dpi


def test_each_answered_rate_is_a_labelled_point_under_the_title(tmp_path: Path) -> None:
    path = tmp_path / "curve.svg"  # the format follows the file name; SVG keeps the text as text
    unanswered = report(640, None, None, None)
    plot_sweep([*SWEEP, unanswered], path, title="tiny-mlp at ipc:///run/front.ipc")
    drawing = path.read_text()
    for label in ("10/s", "40/s", "160/s", "tiny-mlp at ipc:///run/front.ipc", "throughput (answered requests/s)"):
        assert f"<!-- {label} -->" in drawing, label
    assert "640/s" not in drawing


def test_without_a_title_it_says_what_the_labels_are(tmp_path: Path) -> None:
    path = tmp_path / "curve.svg"
    plot_sweep(SWEEP, path)
    assert "<!-- latency against throughput (labels: offered rate) -->" in path.read_text()


def test_a_sweep_without_an_answered_request_has_no_curve(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no rate of the sweep had an answered request"):
        plot_sweep([report(10, None, None, None), report(20, 5.0, None, None)], tmp_path / "curve.png")
    assert not (tmp_path / "curve.png").exists()


def test_an_unwritable_path_is_named(tmp_path: Path) -> None:
    path = tmp_path / "missing" / "curve.png"
    with pytest.raises(ConfigError, match=f"cannot write the plot to {path}: No such file or directory"):
        plot_sweep(SWEEP, path)


def test_a_missing_matplotlib_is_named_with_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    check_plotting()  # installed here: nothing to say
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else real(name, *a))
    with pytest.raises(ConfigError, match="packrat report needs matplotlib, which is not installed") as caught:
        check_plotting("packrat report")
    assert str(caught.value).endswith(INSTALL)
    with pytest.raises(ConfigError, match="^--plot needs matplotlib"):
        plot_sweep(SWEEP, "never-written.png")
