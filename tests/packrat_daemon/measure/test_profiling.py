"""Start-up's measurements: the --save-profile file (one runtime's rows replaced at a time), and (real
workers, so `slow`) the start-up profile and the split check of the plan made on it."""

from __future__ import annotations

from pathlib import Path

import pytest

from packrat_daemon.config import ServeConfig
from packrat_daemon.measure.bench import model_session
from packrat_daemon.measure.profiling import ProfileFile, check_splits, measure_profile
from packrat_daemon.startup import read_profile
from policies.base import Plan
from policies.packrat import PackratPolicy
from policies.planning.distribution import BatchDistribution
from policies.planning.profile import Profile
from policies.planning.topology import Topology

ONLY_2 = BatchDistribution.single(2)
ONLY_4 = BatchDistribution.single(4)


# -- the --save-profile file ------------------------------------------------------------------------
def profile(runtime: str, ms: float) -> Profile:
    return Profile.from_latencies({(1, 1): ms, (2, 1): ms / 2}, model="m", runtime=runtime)


def test_saving_one_runtime_keeps_every_other_runtimes_rows(tmp_path: Path) -> None:
    path = tmp_path / "profiles.csv"
    profiles = ProfileFile(str(path))
    assert profiles.save(profile("torch", 4.0)) and profiles.save(profile("openvino", 3.0))
    # Later in the daemon's life (the production timings at the stop): the served runtime again.
    profiles.save(profile("torch", 2.0))
    saved = Profile.read_all(path)
    assert set(saved) == {"torch", "openvino"}
    assert saved["torch"].latency(1, 1) == 2.0 and saved["openvino"].latency(1, 1) == 3.0


def test_rows_read_from_the_profile_option_are_kept_in_later_writes_only(tmp_path: Path) -> None:
    path = tmp_path / "profiles.csv"
    profiles = ProfileFile(str(path))
    profiles.know(profile("onnxruntime", 5.0))
    assert not path.exists()
    profiles.save(profile("torch", 4.0))
    assert set(Profile.read_all(path)) == {"onnxruntime", "torch"}


def test_without_save_profile_nothing_is_written() -> None:
    assert ProfileFile(None).save(profile("torch", 4.0)) is False


def test_rows_at_another_precision_are_kept_apart_in_the_saved_file(tmp_path: Path) -> None:
    path = tmp_path / "profiles.csv"
    profiles = ProfileFile(str(path))
    bf16 = Profile.from_latencies({(1, 1): 1.0}, model="m", runtime="torch")
    profiles.save(profile("torch", 4.0))
    profiles.save(Profile(dict(bf16.items()), model="m", runtime="torch", precision="bf16"))
    saved = Profile.read_all(path)
    assert saved["torch"].latency(1, 1) == 4.0 and saved["torch/bf16"].latency(1, 1) == 1.0
    assert read_profile(str(path), "torch", "bf16").precision == "bf16"


# -- the split check, on real workers ------------------------------------------------------------
@pytest.mark.slow
def test_the_daemon_plans_again_on_what_its_check_measured() -> None:
    # A made-up 20× win for the split: the check replaces those cells with real tiny-mlp timings (a
    # fraction of a millisecond each) and plans again on them.
    profile = Profile.from_latencies({(1, 2): 1.0, (1, 4): 30.0, (2, 2): 10.0, (2, 4): 20.0})
    config = ServeConfig(model="builtin:tiny-mlp", max_batch=4, split_check_rounds=3)
    topology = Topology.synthetic(2)
    with model_session("builtin:tiny-mlp") as (backend, info):
        plan = PackratPolicy().plan(profile, topology, ONLY_4)
        assert plan.thread_counts == [1, 1]

        def replan(table: Profile) -> Plan:
            return PackratPolicy().plan(table, topology, ONLY_4)

        checked, checked_plan = check_splits(
            backend, info, profile, plan, config, topology, ONLY_4, replan, lambda: False
        )
    cells = dict(checked.items())
    assert cells[(2, 4)].samples == 3 and cells[(2, 4)].latency_ms < 5.0
    assert cells[(1, 2)].samples == 3 and cells[(1, 2)].latency_ms != 1.0
    assert checked_plan == PackratPolicy().plan(checked, topology, ONLY_4)


# -- on real workers --------------------------------------------------------------------------------
@pytest.mark.slow
def test_a_small_grid_is_measured_in_full_and_a_stop_signal_ends_it_between_cells() -> None:
    config = ServeConfig(model="builtin:tiny-mlp", max_batch=2)
    topology = Topology.synthetic(2)

    def plan_for(table: Profile) -> Plan:
        return PackratPolicy().plan(table, topology, ONLY_2)

    with model_session("builtin:tiny-mlp") as (backend, info):
        measured, estimated, _ = measure_profile(backend, info, config, topology, ONLY_2, plan_for, lambda: False)
        with pytest.raises(KeyboardInterrupt):
            measure_profile(backend, info, config, topology, ONLY_2, plan_for, lambda: True)
    assert sorted(key for key, _ in measured.items()) == [(1, 1), (1, 2), (2, 1), (2, 2)]  # threads 1..2 × 1, 2
    assert all(0 < cell.latency_ms < 1000 for _, cell in measured.items())
    assert (measured.model, measured.runtime, measured.precision) == ("builtin:tiny-mlp", "torch", "fp32")
    assert estimated == {}  # a full grid estimates nothing
