"""`packrat report`: real PNG files from a profile and a load sweep, and clear errors."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from packrat_daemon.cli import main
from packrat_daemon.commands.report import draw_heatmap, draw_latency, draw_plans, implausible, plan_rows, read_profile
from packrat_daemon.load.report import Tally, summarize
from packrat_daemon.wire.errors import ConfigError
from policies.planning.profile import Cell, Profile

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def profile_csv(path: Path) -> Path:
    """L(t, b) = 2 + b · (1 + 9 / t) ms on up to 4 threads: splitting a large batch pays, a single input not."""
    rows = [f"{t},{b},{2 + b * (1 + 9 / t):.6f}" for t in (1, 2, 3, 4) for b in (1, 2, 4, 8)]
    path.write_text("threads,batch,latency_ms\n" + "\n".join(rows) + "\n")
    return path


def sweep_json(path: Path) -> Path:
    """`packrat load --json --sweep` output, made by the load command's own summarize()."""
    reports = []
    for rate, latency_s in ((50, 0.004), (100, 0.005), (200, 0.009)):
        tally = Tally(started=0.0, sent=rate, send_window_s=1.0, last_done=1.0)
        for k in range(rate):
            tally.answered(latency_s * (1 + k / rate), 1, 1.0)
        reports.append(summarize(tally, rate_rps=float(rate)))
    path.write_text(json.dumps({"sweep": reports}))
    return path


def assert_png(path: Path) -> None:
    from matplotlib.image import imread

    assert path.read_bytes()[:8] == PNG_SIGNATURE
    height, width, _ = imread(path).shape
    assert height > 200 and width > 300


@pytest.mark.slow
def test_report_writes_every_plot_as_a_png(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    profile, sweep = profile_csv(tmp_path / "profile.csv"), sweep_json(tmp_path / "sweep.json")
    out = tmp_path / "report"
    assert main(["report", "--profile", str(profile), "--load", str(sweep), "--out", str(out)]) == 0
    names = ["profile-heatmap.png", "profile-latency.png", "plans.png", "load-curve.png"]
    assert capsys.readouterr().out.split() == [str(out / name) for name in names]
    for name in names:
        assert_png(out / name)


def test_the_plans_drawn_are_the_solvers_with_their_speed_up_over_single(tmp_path: Path) -> None:
    profile = Profile.read_csv(profile_csv(tmp_path / "profile.csv"))
    rows = {row["batch"]: row for row in plan_rows(profile, cores=4)}
    assert rows[1]["layout"] == "4" and rows[1]["speedup"] == pytest.approx(1.0)  # one input: one instance
    # Eight inputs on four 1-thread instances (2 each: 2 + 2·10 = 22 ms) against one 4-thread (2 + 8·3.25 = 28 ms).
    assert rows[8]["layout"] == "4×1" and rows[8]["speedup"] == pytest.approx(28 / 22)


def test_cores_beyond_the_profile_s_threads_are_refused_before_an_empty_chart(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("matplotlib")
    profile, out = profile_csv(tmp_path / "profile.csv"), tmp_path / "out"  # measured with up to 4 threads
    assert main(["report", "--profile", str(profile), "--cores", "16", "--out", str(out)]) == 2
    error = capsys.readouterr().err
    assert "no plan's speed-up can be drawn for 16 cores: profile.csv's largest thread count is 4" in error
    assert "give --cores 4 or fewer" in error and not list(out.glob("*.png"))


@pytest.mark.slow
def test_batch_sizes_without_a_speed_up_are_named_and_the_rest_drawn(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("matplotlib")
    profile = profile_csv(tmp_path / "profile.csv")
    kept = [line for line in profile.read_text().splitlines() if not line.startswith("4,8,")]  # single's, at 8
    profile.write_text("\n".join(kept) + "\n")
    assert main(["report", "--profile", str(profile), "--out", str(tmp_path / "out")]) == 0
    assert "has no 4-thread cell for `single` (or no plan) at batch size(s) 8" in capsys.readouterr().err
    assert_png(tmp_path / "out" / "plans.png")


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("not json at all", "is not JSON"),
        ('{"rate_rps": 5}', "is not the output of packrat load --json"),
        ("[1, 2]", "is not the output of packrat load --json"),
    ],
)
def test_a_bad_load_file_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str, message: str
) -> None:
    bad = tmp_path / "load.json"
    bad.write_text(content)
    assert main(["report", "--load", str(bad), "--out", str(tmp_path / "out")]) == 2
    error = capsys.readouterr().err
    assert message in error and "Traceback" not in error and not (tmp_path / "out" / "load-curve.png").exists()


def test_a_bad_or_missing_profile_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "profile.csv"
    bad.write_bytes(b"threads,batch\n1,1\n")
    assert main(["report", "--profile", str(bad), "--out", str(tmp_path)]) == 2
    assert "latency_ms" in capsys.readouterr().err
    assert main(["report", "--profile", str(tmp_path / "none.csv"), "--out", str(tmp_path)]) == 2
    assert "none.csv" in capsys.readouterr().err
    assert main(["report", "--out", str(tmp_path)]) == 2
    assert "nothing to draw" in capsys.readouterr().err


def test_without_matplotlib_it_says_how_to_install_it_before_reading_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # how Python marks a package as not importable
    profile = profile_csv(tmp_path / "profile.csv")
    assert main(["report", "--profile", str(profile), "--out", str(tmp_path / "out")]) == 2
    error = capsys.readouterr().err
    assert "packrat report needs matplotlib" in error and "pip install" in error
    assert not (tmp_path / "out").exists()


def test_the_titles_fit_their_figures_and_threads_tick_at_whole_numbers(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    profile = Profile.read_csv(profile_csv(tmp_path / "profile.csv"))
    name = "resnet50-measured-on-the-build-machine-profile.csv"  # long, as a real file's name is
    figures = [draw_plans(profile, 4, name, doubtful=True), draw_latency(profile, name), draw_heatmap(profile, name)]
    for figure in figures:
        figure.canvas.draw()
        axes = figure.axes[0]
        box, frame = axes.title.get_window_extent(), figure.bbox
        assert frame.x0 <= box.x0 and box.x1 <= frame.x1 and box.y1 <= frame.y1, axes.title.get_text()
    ticks = figures[1].axes[0].get_xticks()
    assert list(ticks) == [1, 2, 3, 4]  # never 1.2, 1.4 ...


def loaded_profile_csv(path: Path) -> Path:
    """Measured beside a CPU hog: two threads slower than one (the step waits for its descheduled thread)."""
    rows = [f"{t},{b},{b * (1.0 if t == 1 else 31.0):.6f}" for t in (1, 2) for b in (1, 2, 4)]
    path.write_text("threads,batch,latency_ms\n" + "\n".join(rows) + "\n")
    return path


def test_a_profile_measured_under_load_is_warned_about(tmp_path: Path) -> None:
    profile = Profile.read_csv(loaded_profile_csv(tmp_path / "loaded.csv"))
    rows = plan_rows(profile, cores=2)
    assert max(row["speedup"] for row in rows) > 2  # the "31×" the issue saw
    warnings = implausible(profile, rows, cores=2)
    assert "exceed the 2 cores planned for" in warnings[0] and "measured while other work ran" in warnings[0]
    assert "at batch size(s) 1, 2, 4 the profile has 2 threads slower than 1" in warnings[1]
    quiet = Profile.read_csv(profile_csv(tmp_path / "quiet.csv"))
    assert implausible(quiet, plan_rows(quiet, cores=4), cores=4) == []


def state_file(path: Path) -> Path:
    """A daemon's learned-profile.json: two candidates' entries, the served one named."""
    from packrat_daemon.ops.state_document import Entry

    cells = {(t, b): Cell(2 + b * (1 + 9 / t), 3, 3 + b * (1 + 9 / t)) for t in (1, 2) for b in (1, 2, 4)}
    entries = {}
    for runtime in ("openvino", "torch"):
        ident = {"model": "builtin:resnet50", "runtime": runtime, "precision": "fp32"}
        entries[runtime] = Entry(ident, Profile(cells, model="builtin:resnet50", runtime=runtime)).to_json()
    path.write_text(json.dumps({"format": 2, "entries": entries, "served": {"key": "openvino"}}))
    return path


def test_the_daemons_own_state_file_is_read(tmp_path: Path) -> None:
    path = state_file(tmp_path / "learned-profile.json")
    profile, notes = read_profile(str(path), None)
    assert (profile.runtime, len(profile), notes) == ("openvino", 6, [])  # the served candidate's
    assert read_profile(str(path), "torch")[0].runtime == "torch"
    with pytest.raises(ConfigError, match="holds no profile of 'onnxruntime'; it has openvino, torch"):
        read_profile(str(path), "onnxruntime")
    (tmp_path / "other.json").write_text('{"format": 2}')
    with pytest.raises(ConfigError, match="neither a profile CSV nor a daemon's state file"):
        read_profile(str(tmp_path / "other.json"), None)
