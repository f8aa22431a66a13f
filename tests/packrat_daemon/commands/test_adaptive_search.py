"""`packrat profile --adaptive --replay`: the search against a table, printed as `packrat solve` prints plans."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from packrat_daemon.cli import main
from packrat_daemon.commands.adaptive_search import table_confirmation, write_profile
from policies.planning.profile import Profile
from policies.solver import Solver
from tests.helpers.replay_tables import amdahl, cache_cliff, full_table, replay, smt_knee

MAX_GAP = 0.03


def test_table_confirmation_is_the_slowest_instance():
    profile = Profile.from_latencies({(1, 4): 10.0, (1, 8): 18.0, (2, 8): 11.0})
    assert table_confirmation(profile.lhat, [(1, 5), (2, 8)]) == 18.0
    assert table_confirmation(profile.lhat, [(1, 2), (2, 8)], interference=1.1) == pytest.approx(12.1)


def write_table(path: Path, table: dict[tuple[int, int], float]) -> str:
    Profile.from_latencies(table).write_csv(path)
    return str(path)


def test_cli_replay_prints_measured_cells_and_solve_style_plans(tmp_path, capsys):
    table = full_table(amdahl, seed=19)
    path = write_table(tmp_path / "full.csv", table)
    argv = ["profile", "--adaptive", "--replay", path, "--cores", "16", "--batches", "1,8,64,256",
            "--budget", "0.25", "--seed", "3", "--json"]  # fmt: skip
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert 0 < len(out["measured"]) <= 0.25 * 176
    assert all(type(v) is int and len(cell) == 2 for cell in out["measured"] for v in cell)
    assert [plan["batch"] for plan in out["plans"]] == [1, 8, 64, 256]
    truth = Profile.read_csv(path)
    solver = Solver(truth, 16)
    for plan, confirmed in zip(out["plans"], out["confirmed"], strict=True):
        assert set(plan) == {"batch", "latency_ms", "instances"}
        assert all(set(i) == {"threads", "batch"} for i in plan["instances"])
        assert sum(i["batch"] for i in plan["instances"]) == plan["batch"]
        assert sum(i["threads"] for i in plan["instances"]) <= 16
        assert confirmed["latency_ms"] <= solver.solve(plan["batch"]).latency_ms * (1 + MAX_GAP)

    assert main(argv) == 0  # the same seed answers the same
    assert json.loads(capsys.readouterr().out) == out


def test_cli_replay_is_the_library_search_plus_packrat_solve(tmp_path, capsys):
    from packrat_daemon.commands.solve import solve_plans
    from policies.planning.topology import Topology

    table = full_table(smt_knee, seed=20)
    path = write_table(tmp_path / "full.csv", table)
    assert main(["profile", "--adaptive", "--replay", path, "--cores", "12", "--batches", "4,48",
                 "--seed", "5", "--json"]) == 0  # fmt: skip
    out = json.loads(capsys.readouterr().out)
    # The CSV rounds latencies to 4 decimals: search the table as the command read it.
    result = replay({key: cell.latency_ms for key, cell in Profile.read_csv(path).items()}, [4, 48], 12, seed=5)
    assert out["measured"] == result.measured_cells()
    # Solved by `packrat solve`'s own code path: identical plan objects.
    assert out["plans"] == solve_plans(result.profile, Topology.synthetic(12), [4, 48], "packrat")


@pytest.mark.slow
def test_cli_replay_noise_is_seeded(tmp_path, capsys):
    path = write_table(tmp_path / "full.csv", full_table(cache_cliff, seed=22))
    argv = ["profile", "--adaptive", "--replay", path, "--batches", "8,100", "--noise", "0.02", "--json"]
    outputs = []
    for seed in ("1", "1", "2"):
        assert main([*argv, "--seed", seed]) == 0
        outputs.append(json.loads(capsys.readouterr().out))
    assert outputs[0] == outputs[1]
    assert outputs[0]["cores"] == 16  # a replayed table plans for the cores it covers by default
    assert outputs[0]["measurements"] <= 44 and outputs[2]["measurements"] <= 44


def test_cli_replay_errors_are_clear(tmp_path, capsys):
    path = write_table(tmp_path / "full.csv", {(1, 1): 5.0, (1, 2): 9.0})
    assert main(["profile", "--adaptive", "--replay", path, "--batches", "2", "--budget", "lots"]) == 2
    assert "--budget must be" in capsys.readouterr().err
    assert main(["profile", "--adaptive", "--replay", str(tmp_path / "missing.csv"), "--batches", "2"]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_written_profile_round_trips_and_marks_estimates(tmp_path):
    table = full_table(amdahl, seed=21)
    result = replay(table, [8, 64], 16, seed=21)
    from policies.planning.profile import Cell

    cells = {cell: Cell(value, 3, value * 1.05) for cell, value in result.measured.items()}
    path = tmp_path / "adaptive.csv"
    write_profile(result, cells, path, model="builtin:resnet50", runtime="torch")
    again = Profile.read_csv(path)
    assert again.model == "builtin:resnet50"
    assert set(again) == set(result.profile)
    for cell, _ in result.profile.items():
        assert again.latency(*cell) == pytest.approx(result.profile.latency(*cell), abs=1e-4)
    rows = path.read_text().splitlines()
    assert sum(row.endswith(",measured") for row in rows) == len(result.measured)
    assert sum(row.endswith(",surrogate") for row in rows) == 176 - len(result.measured)
