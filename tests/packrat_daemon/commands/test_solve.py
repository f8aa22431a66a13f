"""`packrat solve`: its JSON and table output, policies, errors, and that it never imports torch."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from packrat_daemon.cli import main
from policies.planning.profile import Profile
from policies.planning.topology import Topology
from policies.solver import solve

REPO = Path(__file__).resolve().parents[3]


def amdahl_csv(path: Path, max_threads: int, batches: range | list[int], overhead_ms: float = 0.0) -> Path:
    """L(t, b) = overhead + b · (1 + 9 / t) ms: 90% of the work parallelises."""
    rows = [f"{t},{b},{overhead_ms + b * (1 + 9 / t):.6f}" for t in range(1, max_threads + 1) for b in batches]
    path.write_text("# model: amdahl\nthreads,batch,latency_ms\n" + "\n".join(rows) + "\n")
    return path


@pytest.fixture
def profile_path(tmp_path: Path) -> Path:
    return amdahl_csv(tmp_path / "profile.csv", 4, [1, 2, 4, 8, 16], overhead_ms=2.0)


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["solve", *args])
    out, err = capsys.readouterr()
    return code, out, err


# -- JSON ----------------------------------------------------------------------------------------
def test_json_output_has_exactly_the_documented_shape(capsys: pytest.CaptureFixture[str], profile_path: Path) -> None:
    code, out, err = run_cli(capsys, "--profile", str(profile_path), "--cores", "4", "--batch", "1,8", "--json")
    assert (code, err) == (0, "")
    data = json.loads(out)
    assert set(data) == {"cores", "plans"}
    assert data["cores"] == 4
    assert [plan["batch"] for plan in data["plans"]] == [1, 8]
    for plan in data["plans"]:
        assert set(plan) == {"batch", "latency_ms", "instances"}
        assert type(plan["latency_ms"]) is float
        for instance in plan["instances"]:
            assert set(instance) == {"threads", "batch"}
            assert type(instance["threads"]) is int and type(instance["batch"]) is int


@pytest.mark.parametrize("cores", [1, 3, 4])
def test_json_plans_are_the_solvers_answers(capsys: pytest.CaptureFixture[str], profile_path: Path, cores: int) -> None:
    batches = [1, 5, 8, 16]
    _, out, _ = run_cli(
        capsys, "--profile", str(profile_path), "--cores", str(cores), "--batch", ",".join(map(str, batches)), "--json"
    )
    profile = Profile.read_csv(profile_path)
    for plan, batch in zip(json.loads(out)["plans"], batches, strict=True):
        solution = solve(profile, cores, batch)
        assert plan["batch"] == batch
        assert plan["latency_ms"] == pytest.approx(solution.latency_ms, abs=1e-6)
        assert [(i["threads"], i["batch"]) for i in plan["instances"]] == list(solution.instances)


def test_batch_ranges_are_expanded(capsys: pytest.CaptureFixture[str], profile_path: Path) -> None:
    _, out, _ = run_cli(capsys, "--profile", str(profile_path), "--cores", "2", "--batch", "3-5,1", "--json")
    assert [plan["batch"] for plan in json.loads(out)["plans"]] == [1, 3, 4, 5]


def test_cores_default_to_this_machine(capsys: pytest.CaptureFixture[str], profile_path: Path) -> None:
    _, out, _ = run_cli(capsys, "--profile", str(profile_path), "--batch", "1", "--json")
    assert json.loads(out)["cores"] == Topology.detect().usable_cores


# -- the table -----------------------------------------------------------------------------------
def test_table_output_is_readable(capsys: pytest.CaptureFixture[str], profile_path: Path) -> None:
    code, out, _ = run_cli(capsys, "--profile", str(profile_path), "--cores", "4", "--batch", "1,16")
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == f"packrat plans on 4 cores ({profile_path})"
    assert lines[1].split() == ["batch", "latency", "ms", "instances", "(threads×inputs)"]
    # batch 1: one 4-thread instance, 2 + 1 · (1 + 9/4) = 5.25 ms
    assert lines[2].split() == ["1", "5.25", "1", "instance(s):", "1×", "4t×1"]
    # batch 16: four 1-thread instances of 4 inputs, 2 + 4 · 10 = 42 ms
    assert lines[3].split() == ["16", "42.00", "4", "instance(s):", "4×", "1t×4"]
    assert len([line for line in lines if not line.startswith("note:")]) == 4  # a note where this machine has < 4


# -- other policies ------------------------------------------------------------------------------
def test_single_policy_gives_one_instance_with_every_core(
    capsys: pytest.CaptureFixture[str], profile_path: Path
) -> None:
    code, out, _ = run_cli(
        capsys, "--profile", str(profile_path), "--cores", "4", "--batch", "1,8", "--policy", "single", "--json"
    )
    assert code == 0
    plans = json.loads(out)["plans"]
    assert [p["instances"] for p in plans] == [[{"threads": 4, "batch": 1}], [{"threads": 4, "batch": 8}]]
    assert [p["latency_ms"] for p in plans] == pytest.approx([2 + 1 * 3.25, 2 + 8 * 3.25])


def test_fixed_policy_gives_the_users_plan(capsys: pytest.CaptureFixture[str], profile_path: Path) -> None:
    code, out, _ = run_cli(
        capsys,
        "--profile", str(profile_path), "--cores", "4", "--batch", "8",
        "--policy", "fixed", "--plan", "2*1x4", "--json",
    )  # fmt: skip
    assert code == 0
    (plan,) = json.loads(out)["plans"]
    assert plan["instances"] == [{"threads": 1, "batch": 4}, {"threads": 1, "batch": 4}]
    assert plan["latency_ms"] == pytest.approx(2 + 4 * 10)


def test_torchserve_policy_has_no_latency_in_its_table(capsys: pytest.CaptureFixture[str], profile_path: Path) -> None:
    code, out, _ = run_cli(
        capsys, "--profile", str(profile_path), "--cores", "2", "--batch", "4", "--policy", "torchserve"
    )
    assert code == 0
    assert out.splitlines()[2].split()[:3] == ["4", "shared", "2"]
    assert "instances share cores" in out


def test_more_cores_than_this_machine_has_are_planned_with_a_note(
    capsys: pytest.CaptureFixture[str], profile_path: Path
) -> None:
    from policies.planning.topology import Topology

    cores = Topology.detect().usable_cores + 62
    code, out, _ = run_cli(capsys, "--profile", str(profile_path), "--cores", str(cores), "--batch", "4")
    assert code == 0 and f"note: planned for {cores} cores; this machine has" in out


# -- errors --------------------------------------------------------------------------------------
def test_infeasible_batch_exits_2_naming_the_largest_servable_batch(
    capsys: pytest.CaptureFixture[str], profile_path: Path
) -> None:
    # Rows stop at batch 16, so two cores carry at most two 1-thread instances of 16.
    code, out, err = run_cli(capsys, "--profile", str(profile_path), "--cores", "2", "--batch", "8,33", "--json")
    assert code == 2
    assert out == ""
    assert err.startswith("packrat solve: error: batch 33 cannot be served with 2 cores")
    assert "serve at most 32" in err


def test_malformed_profile_exits_2_with_the_line_number(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "bad.csv"
    path.write_text("threads,batch,latency_ms\n1,1,5\n1,2,-1\n")
    code, out, err = run_cli(capsys, "--profile", str(path), "--cores", "2", "--batch", "1")
    assert (code, out) == (2, "")
    assert f"{path}:3: latency_ms must be a positive finite number" in err


def test_missing_profile_exits_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = run_cli(capsys, "--profile", str(tmp_path / "none.csv"), "--batch", "1")
    assert code == 2
    assert "does not exist" in err


def test_fixed_policy_without_plan_exits_2(capsys: pytest.CaptureFixture[str], profile_path: Path) -> None:
    code, _, err = run_cli(capsys, "--profile", str(profile_path), "--cores", "2", "--batch", "1", "--policy", "fixed")
    assert code == 2
    assert "--plan" in err


def test_unknown_policy_exits_2_listing_the_choices(capsys: pytest.CaptureFixture[str], profile_path: Path) -> None:
    code, _, err = run_cli(capsys, "--profile", str(profile_path), "--batch", "1", "--policy", "fastest")
    assert code == 2
    assert "unknown policy 'fastest'" in err
    choices = err.split("choose one of:")[1].strip().split(", ")
    assert set(choices) >= {"fixed", "packrat", "paper-estimator", "single", "torchserve"}


@pytest.mark.parametrize("batch", ["0", "x", "4-"])
def test_bad_batch_option_is_a_usage_error(capsys: pytest.CaptureFixture[str], profile_path: Path, batch: str) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["solve", "--profile", str(profile_path), "--batch", batch])
    assert exited.value.code == 2
    assert "--batch" in capsys.readouterr().err


# -- as a real process ---------------------------------------------------------------------------
NO_TORCH_WRAPPER = textwrap.dedent(
    """
    import runpy, sys
    sys.argv = ["packrat", *sys.argv[1:]]
    try:
        runpy.run_module("packrat_daemon", run_name="__main__", alter_sys=True)
    except SystemExit as exited:
        code = exited.code
    else:
        code = 0
    heavy = [name for name in ("torch", "transformers") if name in sys.modules]
    if heavy:
        sys.exit(f"packrat solve imported {heavy}")
    sys.exit(code)
    """
)


def run_process(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", NO_TORCH_WRAPPER, *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.slow
def test_solve_process_never_imports_torch(profile_path: Path) -> None:
    done = run_process("solve", "--profile", str(profile_path), "--cores", "4", "--batch", "1,8", "--json")
    assert done.returncode == 0, done.stderr
    assert [plan["batch"] for plan in json.loads(done.stdout)["plans"]] == [1, 8]


@pytest.mark.slow
def test_solve_process_answers_batch_1024_on_64_cores(tmp_path: Path) -> None:
    # Without overhead one 1-thread instance does the most work per core (1 + 9/t per input is
    # cheapest per core at t = 1), so the exact optimum is 64 instances of 1 thread × 16 inputs:
    # 16 · 10 = 160 ms. Anything slower than 160 ms loses a whole input per core, so no mix ties it.
    path = amdahl_csv(tmp_path / "t64.csv", 64, range(1, 1025))
    done = run_process("solve", "--profile", str(path), "--cores", "64", "--batch", "1024", "--json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["cores"] == 64
    (plan,) = data["plans"]
    assert plan["batch"] == 1024
    assert plan["latency_ms"] == pytest.approx(160.0)
    assert plan["instances"] == [{"threads": 1, "batch": 16}] * 64


def test_min_split_gain_keeps_one_instance_on_a_near_tie(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    # Two cores at batch 16: two 1-thread instances of 8 are 3% faster than one 2-thread instance.
    profile = tmp_path / "tie.csv"
    profile.write_text("threads,batch,latency_ms\n1,8,970\n1,16,1940\n2,8,500\n2,16,1000\n")
    common = ["--profile", str(profile), "--cores", "2", "--batch", "16", "--json"]
    _, out, _ = run_cli(capsys, *common)
    assert json.loads(out)["plans"][0]["instances"] == [{"threads": 2, "batch": 16}]
    _, out, _ = run_cli(capsys, *common, "--min-split-gain", "0")
    assert json.loads(out)["plans"][0]["instances"] == [{"threads": 1, "batch": 8}, {"threads": 1, "batch": 8}]
