"""The accuracy guard: what it measures, what it refuses, and how a refusal reaches the user."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from packrat_daemon.measure import accuracy
from packrat_daemon.measure.accuracy import AccuracyError, GuardResult, compare, compare_outputs, guard_inputs
from packrat_daemon.wire.codec import pack_records
from packrat_daemon.wire.errors import ConfigError
from tests.helpers.daemons import daemon_env, running_daemon
from workers.models.precision import cpu_units
from workers.models.spec import InputSpec, TensorSpec

NEEDS_BF16_UNITS = pytest.mark.skipif(
    not cpu_units("bf16"), reason="this CPU has no bf16 units (neither amx_bf16 nor avx512_bf16 in /proc/cpuinfo)"
)
LOSSY = "tests.model_factories:loses_precision_in_bf16"
REPO = Path(__file__).resolve().parents[3]


def test_identical_outputs_have_no_error_and_full_agreement() -> None:
    scores = np.array([[1.0, 3.0, 2.0], [0.5, -1.0, 0.0]], dtype=np.float32)
    assert compare(scores, scores.copy()) == (0.0, 1.0)


def test_every_output_of_several_is_compared_and_the_worst_decides() -> None:
    spec = InputSpec("float32", (2,)).with_outputs(
        [TensorSpec("scores", "float32", (3,)), TensorSpec("embedding", "float32", (2,))]
    )
    scores = np.array([[1.0, 3.0, 2.0], [0.5, -1.0, 0.0]], dtype=np.float32)
    embedding = np.array([[0.5, -0.5], [0.25, 0.75]], dtype=np.float32)
    reference = pack_records([scores, embedding])
    assert compare_outputs(spec, reference, reference.copy()) == (0.0, 1.0)
    drifted = embedding.copy()
    drifted[1, 1] = 0.675  # a tenth of that input's largest value off, in the second output only
    rel, agreement = compare_outputs(spec, reference, pack_records([scores, drifted]))
    assert rel == pytest.approx(0.1, rel=1e-5) and agreement == 1.0
    flipped = scores.copy()
    flipped[0] = [3.0, 1.0, 2.0]
    rel, agreement = compare_outputs(spec, reference, pack_records([flipped, embedding]))
    assert agreement == 0.5 and rel == pytest.approx(2 / 3, rel=1e-5)


def test_the_error_is_scaled_per_input_by_its_largest_output() -> None:
    reference = np.array([[100.0, 0.0], [1.0, 0.001]], dtype=np.float32)
    reduced = np.array([[100.0, 1.0], [1.0, 0.002]], dtype=np.float32)
    rel, top1 = compare(reference, reduced)
    assert rel == pytest.approx(0.01)  # 1/100 on the first input; the near-zero 0.001 → 0.002 costs only 0.1%
    assert top1 == 1.0


def test_a_flipped_top1_class_counts_against_agreement() -> None:
    reference = np.array([[2.0, 1.0], [0.0, 1.0]], dtype=np.float32)
    reduced = np.array([[1.0, 2.0], [0.0, 1.0]], dtype=np.float32)
    assert compare(reference, reduced)[1] == 0.5


def test_outputs_that_are_not_classifier_scores_have_no_top1() -> None:
    features = np.ones((2, 3, 4), dtype=np.float32)
    assert compare(features, features)[1] is None


def test_a_shape_mismatch_is_an_error() -> None:
    with pytest.raises(AccuracyError, match="shape"):
        compare(np.zeros((2, 3)), np.zeros((2, 4)))


@pytest.mark.parametrize(
    ("rel", "top1", "units", "passed"),
    [(0.01, 1.0, True, True), (0.2, 1.0, True, False), (0.01, 0.9, True, False), (0.01, None, False, False)],
)
def test_the_verdict_needs_the_tolerance_every_top1_and_no_denial_of_units(
    rel: float, top1: float | None, units: bool, passed: bool
) -> None:
    result = GuardResult("torch", "bf16", 8, rel, top1, 0.05, units)
    assert result.passed is passed
    assert result.to_json()["passed"] is passed
    assert ("passed" if passed else "failed") in result.describe()


def test_calibration_inputs_follow_the_samples(tmp_path: Path) -> None:
    spec = InputSpec("float32", (4,))
    path = tmp_path / "mine.npy"
    np.save(path, np.full((3, 4), 7.0))
    inputs = guard_inputs(spec, str(path))
    assert inputs.shape == (accuracy.SAMPLE_INPUTS + 3, 4) and inputs.dtype == np.float32
    assert (inputs[-3:] == 7.0).all()


def test_calibration_inputs_of_another_shape_are_refused_with_the_expected_one(tmp_path: Path) -> None:
    path = tmp_path / "wrong.npy"
    np.save(path, np.zeros((3, 5), dtype=np.float32))
    with pytest.raises(ConfigError, match="N x 4 inputs of float32"):
        guard_inputs(InputSpec("float32", (4,)), str(path))
    with pytest.raises(ConfigError, match="numpy.save"):
        guard_inputs(InputSpec("float32", (4,)), str(tmp_path / "missing.npy"))


@pytest.fixture
def factories_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    """The guard's subprocess imports tests/model_factories.py, as a daemon's template would."""
    monkeypatch.setenv("PYTHONPATH", daemon_env()["PYTHONPATH"])


@pytest.mark.slow
@pytest.mark.usefixtures("factories_importable")
def test_the_guard_refuses_a_model_that_loses_its_output_in_bf16() -> None:
    result = accuracy.check(LOSSY, InputSpec("float32", (16,)), "torch", "bf16")
    assert not result.passed
    assert result.max_rel_error > result.tolerance and result.top1_agreement is not None
    message = str(accuracy.refused(result))
    assert "--precision fp32" in message and "max relative error" in message


@pytest.mark.slow
@pytest.mark.usefixtures("factories_importable")
def test_the_guard_compares_both_outputs_of_a_dict_in_bf16() -> None:
    spec = InputSpec("float32", (16,)).with_outputs(
        [TensorSpec("scores", "float32", (4,)), TensorSpec("probabilities", "float32", (4,))]
    )
    result = accuracy.check("tests.model_factories:two_outputs", spec, "torch", "bf16")
    # bf16 keeps about 3 significant digits: each output's error is of that order, never the bytes' garbage.
    assert 0 < result.max_rel_error < 0.05, result.describe()


@pytest.mark.slow
@NEEDS_BF16_UNITS
def test_the_guard_passes_a_small_cnn_in_bf16_on_both_runtimes() -> None:
    pytest.importorskip("openvino")
    for runtime in ("torch", "openvino"):
        result = accuracy.check("builtin:tiny-cnn", InputSpec("float32", (3, 16, 16)), runtime, "bf16")
        assert result.passed, result.describe()
        assert 0 < result.max_rel_error < result.tolerance and result.runtime_has_units is True


@pytest.mark.slow
def test_a_pinned_bf16_that_fails_the_guard_stops_the_daemon_with_what_it_measured(tmp_path: Path) -> None:
    command = [
        sys.executable, "-m", "packrat_daemon", "serve", "--endpoint", f"ipc://{tmp_path}/front.ipc",
        "--model", LOSSY, "--runtime", "torch", "--precision", "bf16", "--policy", "single", "--max-batch", "2",
    ]  # fmt: skip
    done = subprocess.run(command, env=daemon_env(), capture_output=True, text=True, timeout=300, cwd=REPO)
    assert done.returncode == 2, done.stderr
    assert "accuracy guard" in done.stderr and "--precision fp32" in done.stderr


@NEEDS_BF16_UNITS
@pytest.mark.slow
def test_auto_says_what_it_serves_and_what_the_guard_measured(tmp_path: Path) -> None:
    from packrat_daemon.wire.client import Client

    args = ("--model", "builtin:tiny-cnn", "--precision", "auto", "--policy", "single", "--max-batch", "2")
    with running_daemon(tmp_path, *args, timeout=300) as (endpoint, _), Client(endpoint, timeout=60) as client:
        info = client.info()
        assert client.infer(np.zeros((2, 3, 16, 16), dtype=np.float32)).shape == (2, 10)
    log = (tmp_path / "daemon.log").read_text()
    assert f"serving torch at {info['precision']}" in log
    screened_out = re.search(r"candidate torch/bf16: slower[^\n]*: not profiled: ", log)
    if screened_out:  # over 1.5x torch fp32's time at screening: never guarded
        assert "on the screening cell" in log and "accuracy guard: torch bf16" not in log
        assert info["precision"] == "fp32"
    else:
        assert "accuracy guard: torch bf16 against fp32" in log and "passed" in log
    if info["precision"] == "bf16":
        assert info["accuracy_guard"]["passed"] and info["accuracy_guard"]["max_rel_error"] < 0.05
    else:
        assert info["precision"] == "fp32" and info["accuracy_guard"] is None


# -- --accuracy-top1: which outputs are held to top-1 agreement ---------------------------------------
EMBEDDING = np.array([[0.91, 0.90, -0.2], [0.1, 0.5, 0.49]], dtype=np.float32)  # tanh-bounded features
EMBEDDING_BF16 = np.array([[0.90, 0.91, -0.2], [0.1, 0.49, 0.5]], dtype=np.float32)  # close, largest moved


def test_auto_holds_logits_and_probabilities_to_top1_but_not_bounded_embeddings() -> None:
    assert accuracy.is_class_scores(np.array([[2.5, -1.0, 0.3]]))  # logits
    assert accuracy.is_class_scores(np.array([[0.7, 0.2, 0.1], [0.1, 0.1, 0.8]]))  # softmax rows
    assert not accuracy.is_class_scores(EMBEDDING)
    assert not accuracy.is_class_scores(np.ones((2, 1)) * 5)  # one column: nothing to rank
    assert not accuracy.is_class_scores(np.ones((2, 3, 4)) * 5)  # not one row per input


def test_the_switch_decides_whether_a_moved_largest_feature_counts() -> None:
    rel, top1 = compare(EMBEDDING, EMBEDDING_BF16)  # auto
    assert top1 is None and rel == pytest.approx(0.01 / 0.5, rel=1e-3)
    assert compare(EMBEDDING, EMBEDDING_BF16, "off")[1] is None
    assert compare(EMBEDDING, EMBEDDING_BF16, "on")[1] == 0.0  # what the shape-only rule measured before
    logits = EMBEDDING * 10
    assert compare(logits, EMBEDDING_BF16 * 10)[1] == 0.0  # auto: logits are held to it
    assert compare(logits, EMBEDDING_BF16 * 10, "off")[1] is None
    with pytest.raises(ConfigError, match="--accuracy-top1 off or auto"):
        compare(np.ones((2, 1)), np.ones((2, 1)), "on")
    with pytest.raises(ConfigError, match="choose one of auto, on, off"):
        compare(EMBEDDING, EMBEDDING, "maybe")


def test_a_top1_refusal_points_at_the_switch() -> None:
    flipped = GuardResult("torch", "bf16", 8, 0.01, 0.75, 0.05, True)
    assert "--accuracy-top1 off" in str(accuracy.refused(flipped))
    assert "--accuracy-top1" not in str(accuracy.refused(GuardResult("torch", "bf16", 8, 0.2, None, 0.05, True)))


# -- int8 -------------------------------------------------------------------------------------------------
NEEDS_NNCF = pytest.mark.skipif(
    importlib.util.find_spec("nncf") is None or importlib.util.find_spec("openvino") is None,
    reason="int8 needs OpenVINO and NNCF (pip install -e '.[openvino]')",
)
TINY_CNN_INPUT = InputSpec("float32", (3, 16, 16))


def calibration_file(folder: Path) -> Path:
    """A user's 10 calibration inputs, the same bytes in each test: the int8 model quantized on them in one test
    is found by its inputs' bytes in the next (the session's shared cache), which is told its own file's name."""
    mine = folder / "mine.npy"
    np.save(mine, np.random.default_rng(5).standard_normal((10, 3, 16, 16), dtype=np.float32))
    return mine


@NEEDS_NNCF
@pytest.mark.slow
def test_the_guard_measures_int8_on_the_calibration_it_was_quantized_on(tmp_path: Path) -> None:
    mine = calibration_file(tmp_path)
    result = accuracy.check("builtin:tiny-cnn", TINY_CNN_INPUT, "openvino", "int8", calibration=str(mine))
    assert result.inputs == accuracy.SAMPLE_INPUTS + 10
    assert result.max_rel_error > 0 and result.quantization is not None
    assert result.quantization["calibration"] == f"10 inputs of --calibration {mine.resolve()}"
    assert f"quantized on 10 inputs of --calibration {mine.resolve()}" in result.describe()
    strict = accuracy.check("builtin:tiny-cnn", TINY_CNN_INPUT, "openvino", "int8", calibration=str(mine),
                            tolerance=result.max_rel_error / 2)  # fmt: skip
    assert not strict.passed and "failed" in str(accuracy.refused(strict))


@NEEDS_NNCF
@pytest.mark.slow
def test_int8_serves_through_a_real_daemon_quantized_on_the_users_inputs(tmp_path: Path) -> None:
    from packrat_daemon.wire.client import Client

    mine = calibration_file(tmp_path)
    args = ("--model", "builtin:tiny-cnn", "--runtime", "openvino", "--precision", "int8", "--calibration", str(mine),
            "--max-rel-error", "0.5", "--policy", "single", "--max-batch", "2")  # fmt: skip
    with running_daemon(tmp_path, *args, timeout=300) as (endpoint, _), Client(endpoint, timeout=60) as client:
        info = client.info()
        out = client.infer(np.zeros((2, 3, 16, 16), dtype=np.float32))
    assert out.shape == (2, 10) and out.dtype == np.float32
    assert info["precision"] == "int8" and info["accuracy_guard"]["passed"]
    assert info["accuracy_guard"]["quantization"]["calibration"] == f"10 inputs of --calibration {mine.resolve()}"
    log = (tmp_path / "daemon.log").read_text()
    assert "accuracy guard: openvino int8, quantized on 10 inputs" in log and "serving openvino at int8" in log


@NEEDS_NNCF
@pytest.mark.slow
def test_a_pinned_int8_over_the_tolerance_stops_the_daemon_with_what_it_measured(tmp_path: Path) -> None:
    command = [
        sys.executable, "-m", "packrat_daemon", "serve", "--endpoint", f"ipc://{tmp_path}/front.ipc",
        "--model", "builtin:tiny-cnn", "--runtime", "openvino", "--precision", "int8", "--max-rel-error", "1e-6",
        "--policy", "single", "--max-batch", "2",
    ]  # fmt: skip
    done = subprocess.run(command, env=daemon_env(), capture_output=True, text=True, timeout=300, cwd=REPO)
    assert done.returncode == 2, done.stderr
    assert "accuracy guard: openvino int8" in done.stderr and "tolerance 1e-06" in done.stderr
    assert "no --calibration given" in done.stderr and "--precision fp32" in done.stderr
