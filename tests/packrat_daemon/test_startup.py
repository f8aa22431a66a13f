"""Start-up: reading a runtime's rows, a reload's re-planning, the checks before the model loads, and (real
daemons) the adaptive search above the threshold.

The --save-profile file, the start-up profile and the split check on real workers are in
measure/test_profiling.py; the state file in ops/test_state.py.
"""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import pytest
import zmq

from packrat_daemon.config import ServeConfig
from packrat_daemon.reload import replan
from packrat_daemon.startup import read_profile
from packrat_daemon.wire.errors import PackratError
from policies.planning.profile import Profile
from policies.planning.topology import Topology
from tests.helpers.daemons import daemon_env


def test_an_unlabelled_profile_file_serves_the_runtime_that_reads_it(tmp_path: Path) -> None:
    path = tmp_path / "profile.csv"
    path.write_text("threads,batch,latency_ms\n1,1,2.0\n")
    read = read_profile(str(path), "openvino")
    assert read.runtime == "openvino" and read.latency(1, 1) == 2.0


def test_a_given_profile_narrows_auto_to_the_runtimes_it_has_rows_for(tmp_path: Path) -> None:
    # `packrat profile`'s file names its runtime: under --runtime auto, every other candidate failed the start.
    from packrat_daemon.startup import profiled_pairs

    everything = [("torch", "fp32"), ("onnxruntime", "fp32"), ("openvino", "fp32"), ("openvino", "bf16")]
    torch_only = tmp_path / "torch.csv"
    torch_only.write_text("# runtime: torch\nthreads,batch,latency_ms\n1,1,2.0\n")
    assert profiled_pairs(str(torch_only), everything) == [("torch", "fp32")]
    both = tmp_path / "both.csv"
    both.write_text("runtime,precision,threads,batch,latency_ms\ntorch,fp32,1,1,2.0\nopenvino,bf16,1,1,1.0\n")
    assert profiled_pairs(str(both), everything) == [("torch", "fp32"), ("openvino", "bf16")]
    unlabelled = tmp_path / "any.csv"
    unlabelled.write_text("threads,batch,latency_ms\n1,1,2.0\n")
    assert profiled_pairs(str(unlabelled), everything) == everything
    with pytest.raises(PackratError, match="give --runtime and --precision it was measured with"):
        profiled_pairs(str(torch_only), [("openvino", "fp32")])


def test_reload_keeps_what_takes_a_restart_and_never_grows_max_batch(caplog: pytest.LogCaptureFixture) -> None:
    running = ServeConfig(model="builtin:tiny-mlp", policy="fixed", plan="2*1x2", max_batch=4)
    fresh = ServeConfig(model="builtin:other", policy="fixed", plan="2x4", max_batch=8, max_delay_ms=3.0)
    with caplog.at_level(logging.WARNING, logger="packrat.daemon"):
        new = replan(running, fresh, "torch", None, Topology.synthetic(2))
    assert new.config.model == "builtin:tiny-mlp" and new.config.max_batch == 4 and new.config.max_delay_ms == 3.0
    assert new.plan.thread_counts == [2] and new.policy.name == "fixed"
    assert "reload: model changed; that takes a restart" in caplog.text
    assert "max_batch can only shrink without a restart; keeping 4" in caplog.text


def test_a_reload_that_cannot_be_planned_raises_for_the_daemon_to_keep_serving() -> None:
    running = ServeConfig(model="builtin:tiny-mlp", policy="fixed", plan="2x4", max_batch=4)
    fresh = ServeConfig(model="builtin:tiny-mlp", policy="fixed", plan="9x4", max_batch=4)
    with pytest.raises(PackratError, match="needs 9 cores"):
        replan(running, fresh, "torch", None, Topology.synthetic(2))


def test_auto_precision_adds_bf16_only_where_the_cpu_and_the_runtime_have_it() -> None:
    from packrat_daemon.startup import candidate_pairs

    with_units, without = frozenset({"avx512_bf16"}), frozenset({"avx2"})
    assert candidate_pairs("torch", "auto", with_units) == [("torch", "fp32"), ("torch", "bf16")]
    assert candidate_pairs("torch", "auto", without) == [("torch", "fp32")]
    assert candidate_pairs("onnxruntime", "auto", with_units) == [("onnxruntime", "fp32")]
    assert candidate_pairs("torch", "fp32", with_units) == [("torch", "fp32")]
    assert candidate_pairs("torch", "bf16", without) == [("torch", "bf16")]  # pinned: the guard still decides
    with pytest.raises(PackratError, match="cannot serve bf16"):
        candidate_pairs("onnxruntime", "bf16", with_units)


def test_auto_on_an_onnx_file_measures_only_the_runtimes_that_load_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from packrat_daemon.startup import checks

    monkeypatch.setattr(checks, "available_runtimes", lambda: ["torch", "onnxruntime", "openvino"])
    monkeypatch.setattr("workers.models.spec.available_runtimes", lambda: ["torch", "onnxruntime", "openvino"])
    with_units = frozenset({"amx_bf16"})
    assert checks.candidate_pairs("auto", "fp32", with_units, model="m.onnx") == [
        ("onnxruntime", "fp32"), ("openvino", "fp32")
    ]  # fmt: skip
    assert checks.candidate_pairs("auto", "auto", with_units, model="m.onnx") == [
        ("onnxruntime", "fp32"), ("openvino", "fp32"), ("openvino", "bf16")
    ]  # fmt: skip
    assert checks.candidate_pairs("auto", "fp32", with_units, model="builtin:tiny-mlp")[0] == ("torch", "fp32")
    with pytest.raises(PackratError, match="runtime torch cannot load m.onnx"):
        checks.candidate_pairs("torch", "fp32", with_units, model="m.onnx")


@pytest.mark.parametrize("max_rel_error", [0.001, 0.5])
def test_the_guard_decides_auto_leaves_a_failing_candidate_out_and_a_pinned_one_stops(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, max_rel_error: float
) -> None:
    from packrat_daemon.fleet.backend import ModelInfo
    from packrat_daemon.measure import accuracy
    from packrat_daemon.startup import run_guard

    def measured(*_: object, tolerance: float, **__: object) -> accuracy.GuardResult:
        return accuracy.GuardResult("torch", "bf16", 8, 0.01, 1.0, tolerance, True)

    monkeypatch.setattr(accuracy, "check", measured)
    info = ModelInfo("builtin:tiny-mlp", "torch", "float32", (16,), None, 1, "bf16")
    passes = max_rel_error > 0.01
    with caplog.at_level(logging.INFO, logger="packrat.daemon"):
        result = run_guard(ServeConfig(precision="auto", max_rel_error=max_rel_error), info, "bf16", None)
    assert (result is not None) is passes
    assert ("passed" if passes else "is not served at bf16") in caplog.text
    if not passes:
        with pytest.raises(accuracy.AccuracyError, match="--precision fp32"):
            run_guard(ServeConfig(precision="bf16", max_rel_error=max_rel_error), info, "bf16", None)


@pytest.mark.slow
@pytest.mark.parametrize("in_use", [True, False])
def test_an_unusable_endpoint_is_refused_before_the_model_loads(in_use: bool) -> None:
    context = zmq.Context()
    holder = context.socket(zmq.ROUTER)
    port = holder.bind_to_random_port("tcp://127.0.0.1")
    endpoint = f"tcp://127.0.0.1:{port}" if in_use else "tcp://127.0.0.1:noport"
    try:
        command = [
            sys.executable,
            "-m",
            "packrat_daemon",
            "serve",
            "--model",
            "builtin:tiny-mlp",
            "--endpoint",
            endpoint,
        ]
        done = subprocess.run(command, env=daemon_env(), capture_output=True, text=True, timeout=120)
    finally:
        holder.close(linger=0)
        context.term()
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    errors = [line for line in done.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and f"cannot serve on endpoint '{endpoint}'" in errors[0]
    assert "loading builtin:tiny-mlp" not in done.stderr


@pytest.mark.slow
def test_a_grid_above_the_threshold_is_measured_by_the_adaptive_search_at_start(tmp_path: Path) -> None:
    import re

    from tests.helpers.daemons import REPO, running_daemon

    # EMULATION: 16 made-up cores whose workers wait the Inception-v3 table, scaled to a hundredth so the
    # start-up takes seconds; --emulate-measure makes the daemon measure it as it would a model.
    table = Profile.read_csv(REPO / "bench" / "profiles" / "inception3-cloudlab16.csv")
    scaled = tmp_path / "scaled.csv"
    Profile.from_latencies({key: cell.latency_ms / 100 for key, cell in table.items()}).write_csv(scaled)
    args = ("--runtime", "emulated", "--emulate-cores", "16", "--emulate-measure", "--profile", str(scaled),
            "--model", "builtin:tiny-mlp", "--max-batch", "64", "--emulate-interference", "none")  # fmt: skip
    with running_daemon(tmp_path, *args):
        pass
    log = (tmp_path / "daemon.log").read_text()
    assert "profiling emulated adaptively (at most 28 of 112 cells)" in log
    found = re.search(r"adaptive: (\d+) of 112 cells measured", log)
    assert found is not None and int(found.group(1)) <= 28, log[-3000:]


@pytest.mark.slow
def test_serve_refuses_a_plan_beyond_the_usable_cores_before_the_model_loads(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "packrat_daemon", "serve", "--model", "builtin:tiny-mlp", "--policy", "fixed",
               "--plan", "4*1x8", "--endpoint", f"ipc://{tmp_path}/f.ipc"]  # fmt: skip
    done = subprocess.run(command, env=daemon_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    errors = [line for line in done.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and "needs 4 cores" in errors[0]
    assert "loading builtin:tiny-mlp" not in done.stderr


def test_the_profile_budget_is_a_toml_number_or_string_and_a_bad_one_fails_when_read() -> None:
    from packrat_daemon.config import BY_NAME
    from packrat_daemon.wire.errors import ConfigError

    kind = BY_NAME["profile_budget"].kind
    assert kind.parse_toml("profile_budget", 0.1, "serve.toml") == "0.1"
    assert kind.parse_toml("profile_budget", "300s", "serve.toml") == "300s"
    with pytest.raises(ConfigError, match="profile_budget = 2 is not allowed; expected a fraction"):
        kind.parse_toml("profile_budget", 2, "serve.toml")
    with pytest.raises(ValueError, match="got '-5s'"):
        kind.parse_text("-5s")


@pytest.mark.slow
def test_the_readme_s_config_example_fails_on_its_missing_profile_before_the_model_loads(tmp_path: Path) -> None:
    import re
    import tomllib

    from tests.helpers.daemons import REPO

    (example,) = re.findall(r"```toml\n(.*?)```", (REPO / "README.md").read_text(), re.DOTALL)
    settings = tomllib.loads(example)
    assert not Path(settings["profile"]).exists()  # as on a machine where nothing was measured yet
    config = tmp_path / "serve.toml"
    # Its own endpoint and no metrics port: the example's may be taken on this machine.
    config.write_text("\n".join(line for line in example.splitlines() if not line.startswith(("endpoint", "metrics"))))
    command = [sys.executable, "-m", "packrat_daemon", "serve", "--config", str(config), "--endpoint",
               f"ipc://{tmp_path}/f.ipc"]  # fmt: skip
    done = subprocess.run(command, env=daemon_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert f"profile file {settings['profile']} does not exist" in done.stderr
    assert "loading" not in done.stderr


def test_runtime_and_precision_default_to_auto_so_the_guard_decides_a_reduced_precision() -> None:
    from packrat_daemon.config import load_config

    config = load_config({}, None)
    assert (config.runtime, config.precision, config.state_dir) == ("auto", "auto", None)


@pytest.mark.slow
def test_a_first_start_keeps_its_choice_and_a_restart_serves_it_at_once(tmp_path: Path) -> None:
    """No flags but the model's size: every candidate is measured, each one's verdict is in `status`, and a restart
    on the default state folder starts the chosen one only, measuring and guarding nothing again."""
    import os

    from packrat_daemon.wire.client import Client
    from tests.helpers.daemons import running_daemon

    home = tmp_path / "home-state"
    small = ("--model", "builtin:tiny-mlp", "--max-batch", "4", "--batches", "1,4", "--split-check-rounds", "0")
    auto = ("--runtime", "auto", "--precision", "auto")  # running_daemon pins torch fp32 otherwise
    with (
        running_daemon(tmp_path, *small, *auto, timeout=400, state_home_dir=home) as (endpoint, _),
        Client(endpoint, timeout=30) as client,
    ):
        first = client.status()["runtime_choice"]
        info = client.info()
    log = (tmp_path / "daemon.log").read_text()
    assert "state: kept in " + str(home / "packrat") in log
    candidates = {c["candidate"]: c for c in first["candidates"]}
    assert {"torch", "onnxruntime", "openvino"} <= set(candidates) and first["decided_at_this_start"]
    served = [name for name, c in candidates.items() if c["verdict"] == "served"]
    assert served == [first["served"]] and info["runtime"] == first["served"].split("/")[0]
    assert all(c["verdict"] in ("slower", "refused") and c["why"] for n, c in candidates.items() if n not in served)
    for name in candidates:
        assert f"loading builtin:tiny-mlp in the {name} template process" in log
        assert f"candidate {name}: " in log
    os.rename(tmp_path / "daemon.log", tmp_path / "first.log")
    with (
        running_daemon(tmp_path, *small, *auto, timeout=120, state_home_dir=home) as (endpoint, _),
        Client(endpoint, timeout=30) as client,
    ):
        again = client.status()["runtime_choice"]
        assert client.info()["runtime"] == info["runtime"] and client.info()["precision"] == info["precision"]
    log = (tmp_path / "daemon.log").read_text()
    assert again["served"] == first["served"] and again["decided_at_this_start"] is False
    assert again["candidates"] == first["candidates"]
    assert [line for line in log.splitlines() if "template process" in line][0].endswith(
        f"in the {first['served']} template process"
    )
    assert len([line for line in log.splitlines() if "template process" in line]) == 1
    assert not any(f"profiling {name}" in log for name in candidates) and "accuracy guard: running" not in log
    assert "the other candidates are not started again" in log


def test_the_first_answer_comes_early_only_when_several_candidates_are_still_to_be_measured() -> None:
    from packrat_daemon.startup import first_answer
    from packrat_daemon.wire.errors import ConfigError

    two = [("torch", "fp32"), ("onnxruntime", "fp32")]
    tiny = {"model": "builtin:tiny-mlp"}
    assert first_answer(ServeConfig(**tiny), two, None) == ("torch", "fp32")
    assert first_answer(ServeConfig(**tiny), two[:1], None) is None  # one candidate: measured, then served
    assert first_answer(ServeConfig(**tiny), two, "onnxruntime") is None  # the state file's choice serves at once
    assert first_answer(ServeConfig(**tiny, first_answer="off"), two, None) is None
    assert first_answer(ServeConfig(**tiny, profile="given.csv"), two, None) is None  # nothing to measure
    # A named runtime answers first even when it is no candidate: the only candidate is then switched to.
    assert first_answer(ServeConfig(**tiny, first_answer="torch"), two[1:], None) == ("torch", "fp32")
    with pytest.raises(ConfigError, match="--first-answer tensorflow"):
        first_answer(ServeConfig(**tiny, first_answer="tensorflow"), two, None)


@pytest.mark.slow
def test_a_first_start_answers_at_once_then_switches_runtime_under_traffic_with_no_failed_request(
    tmp_path: Path,
) -> None:
    """torch answers first (--first-answer torch) while the only candidate, onnxruntime, is measured in the
    background; requests sent all along are each answered, right, and `info` and `status` follow the switch."""
    import time

    import numpy as np

    from packrat_daemon.wire.client import Client
    from tests.helpers.daemons import running_daemon
    from tests.packrat_daemon.test_daemon import direct

    pytest.importorskip("onnxruntime")
    small = ("--model", "builtin:tiny-mlp", "--max-batch", "4", "--batches", "1,4", "--split-check-rounds", "0")
    switch = ("--runtime", "onnxruntime", "--precision", "fp32", "--first-answer", "torch")
    x = np.random.default_rng(3).standard_normal((2, 16), dtype=np.float32)
    expected = direct("builtin:tiny-mlp", x)
    answered, failed = 0, []
    with (
        running_daemon(tmp_path, *small, *switch, timeout=300) as (endpoint, _),
        Client(endpoint, timeout=30) as client,
    ):
        first, before = client.info(), client.status()["runtime_choice"]
        deadline = time.monotonic() + 420
        while client.info()["runtime"] != "onnxruntime":
            assert time.monotonic() < deadline, (tmp_path / "daemon.log").read_text()
            try:
                np.testing.assert_allclose(client.infer(x), expected, rtol=1e-4, atol=1e-5)
                answered += 1
            except Exception as exc:  # noqa: BLE001 - counted: the test is that none comes
                failed.append(exc)
            time.sleep(0.02)  # steady traffic that leaves the measurement (at a lower priority) some CPU
        for _ in range(20):  # and the new runtime answers
            np.testing.assert_allclose(client.infer(x), expected, rtol=1e-4, atol=1e-5)
        after = client.status()["runtime_choice"]
        closed = "none of its workers is left"  # torch's template, closed once its last worker has exited
        while closed not in (tmp_path / "daemon.log").read_text():
            assert time.monotonic() < deadline, (tmp_path / "daemon.log").read_text()
            time.sleep(0.1)
    log = (tmp_path / "daemon.log").read_text()
    assert failed == [] and answered > 0
    assert first["runtime"] == "torch"
    if before["still_measuring"]:  # the usual case: asked before the measurement ended
        assert before["served"] == "torch" and before["still_measuring"] == ["onnxruntime"]
    assert after["served"] == "onnxruntime" and after["still_measuring"] == []
    assert [c["verdict"] for c in after["candidates"]] == ["served"]
    # The first answer came before the measurement: logged as still measuring, then serving, then the switch.
    still = log.index("still measuring onnxruntime in the background")
    assert still < log.index("serving on ") < log.index("switching to onnxruntime")
    assert log.index("switching to onnxruntime") < log.index(closed)


@pytest.mark.slow
def test_several_candidates_are_screened_at_one_cell_and_one_far_behind_is_never_profiled(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Real templates of two runtimes: each is timed at the screening cell; with a margin under 1 every candidate
    but the fastest is beyond it, so exactly one is profiled and the other says why it was not."""
    from packrat_daemon.measure import emulation
    from packrat_daemon.measure.profiling import ProfileFile
    from packrat_daemon.ops.state import StateKeeper
    from packrat_daemon.startup import StartContext, policy_for, prepare_candidates

    config = ServeConfig(model="builtin:tiny-mlp", max_batch=4, batches=[1, 4], split_check_rounds=0)
    topology = emulation.topology(config)
    refused: dict[str, str] = {}
    screened: dict[str, str] = {}
    decided: list[str] = []
    context = zmq.Context()
    try:
        with caplog.at_level(logging.INFO, logger="packrat.daemon"):
            ctx = StartContext(config, context, topology, policy_for(config), ProfileFile(None), StateKeeper(None),
                               lambda: False)  # fmt: skip
            candidates = prepare_candidates(
                ctx,
                [("torch", "fp32"), ("onnxruntime", "fp32")],
                True,
                refused,
                screened,
                decided=decided.append,
                margin=0.5,
            )
        try:
            (profiled,) = candidates
            (left,) = screened
            assert {profiled.key, left} == {"torch", "onnxruntime"} and not refused
            assert profiled.profile is not None and len(profiled.profile) > 0
            assert f"× {profiled.key}'s time" in screened[left]
            assert sorted(decided) == ["onnxruntime", "torch"]
            cores = topology.usable_cores
            assert f"screening torch: t={cores} b=4:" in caplog.text
            assert f"screening onnxruntime: t={cores} b=4:" in caplog.text
            assert f"profile {profiled.key}: " in caplog.text and f"profile {left}: " not in caplog.text
        finally:
            for candidate in candidates:
                candidate.backend.close()
    finally:
        context.term()
