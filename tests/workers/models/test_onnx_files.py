"""ONNX files: the input and outputs read from the graph, what is refused (and what to do), and the file served
by ONNX Runtime and OpenVINO behind the runtime interface, through the conversion cache, with no PyTorch model.
The graphs are written with onnx.helper (tests/helpers/onnx_models.py)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from packrat_daemon.wire.codec import pack_records, unpack_records
from packrat_daemon.wire.errors import ModelSpecError
from tests.helpers import onnx_models
from workers.models.spec import InputSpec, TensorSpec, sample_input

pytest.importorskip("onnx")

from workers.models.cache import ConversionError, ensure_converted  # noqa: E402
from workers.models.onnx_files import graph_input, output_names, read_graph  # noqa: E402


def read_input(path: Path, override: str | None = None) -> tuple[str, InputSpec]:
    return graph_input(read_graph(path), str(path), InputSpec.parse(override) if override else None)


def one(name: str, dtype: str, shape: tuple[int, ...], high: int | None = None) -> InputSpec:
    return InputSpec.of([TensorSpec(name, dtype, shape, high)])


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    folder = tmp_path / "cache"
    monkeypatch.setenv("PACKRAT_CACHE_DIR", str(folder))  # the converter subprocesses inherit it
    yield folder


# -- the graph ------------------------------------------------------------------------------------
def test_the_input_and_outputs_are_read_from_the_graph(tmp_path: Path) -> None:
    path = onnx_models.two_outputs(tmp_path / "two.onnx")
    assert read_input(path) == ("x", one("x", "float32", (onnx_models.FEATURES,)))
    assert output_names(read_graph(path)) == ["scores", "probabilities"]


def test_token_ids_are_declared_below_the_table_they_index(tmp_path: Path) -> None:
    path = onnx_models.token_embedding(tmp_path / "ids.onnx", rows=50, sequence=12)
    assert read_input(path) == ("ids", one("ids", "int64", (12,), high=50))
    columns = onnx_models.token_embedding(tmp_path / "columns.onnx", rows=50, sequence=12, axis=1)
    assert read_input(columns) == ("ids", one("ids", "int64", (12,)))  # not a table's rows: no bound is known


def test_a_free_axis_besides_the_batch_takes_its_size_from_input(tmp_path: Path) -> None:
    path = onnx_models.token_embedding(tmp_path / "ids.onnx", rows=50)
    with pytest.raises(ModelSpecError, match=r"per-sample shape \[\?\]\) has free axes; pass --input int64:N"):
        read_input(path)
    assert read_input(path, "int64:9") == ("ids", one("ids", "int64", (9,), high=50))


@pytest.mark.parametrize("override", ["float32:8", "int64:16", "float32:16x2"])
def test_an_input_that_does_not_fit_the_graph_is_refused(tmp_path: Path, override: str) -> None:
    path = onnx_models.two_outputs(tmp_path / "two.onnx")
    with pytest.raises(ModelSpecError, match=rf"--input {override} does not fit .*'x', float32 of per-sample shape"):
        read_input(path, override)


def test_a_fixed_batch_is_refused_with_how_to_export_a_free_one(tmp_path: Path) -> None:
    path = onnx_models.two_outputs(tmp_path / "fixed.onnx", batch=1)
    with pytest.raises(ModelSpecError, match=r"has a fixed batch size 1; .* dynamic_axes=\{\"x\": \{0: \"batch\"\}\}"):
        read_input(path)


def test_several_inputs_are_read_each_by_name(tmp_path: Path) -> None:
    path = onnx_models.two_inputs(tmp_path / "two-inputs.onnx")
    name, spec = read_input(path)
    assert name == "a" and spec.inputs == (TensorSpec("a", "float32", (4,)), TensorSpec("b", "float32", (4,)))
    assert (spec.dtype, spec.shape) == ("uint8", (32,))  # the records of both


def test_a_file_that_is_not_onnx_or_is_missing_says_so(tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.onnx"
    garbage.write_bytes(b"\xff\xfe this is not a model")
    with pytest.raises(ModelSpecError, match="is not an ONNX model"):
        read_graph(garbage)
    with pytest.raises(ModelSpecError, match="does not exist"):
        read_graph(tmp_path / "absent.onnx")


@pytest.mark.slow
@pytest.mark.parametrize("runtime", ["onnxruntime", "openvino"])
def test_each_runtime_serves_a_file_of_two_inputs_fed_by_name(cache: Path, tmp_path: Path, runtime: str) -> None:
    path = onnx_models.two_inputs(tmp_path / "two-inputs.onnx")
    input_spec, instance = served(runtime, str(path))
    a, b = np.ones((3, 4), np.float32), np.arange(12, dtype=np.float32).reshape(3, 4)
    np.testing.assert_allclose(instance.run(pack_records([a, b])), a + b)  # type: ignore[attr-defined]
    assert input_spec.outputs == (TensorSpec("sum", "float32", (4,)),)


# -- served by each runtime -------------------------------------------------------------------------
def served(runtime: str, spec: str, override: str | None = None) -> tuple[InputSpec, object]:
    pytest.importorskip(runtime)
    from workers.runtimes import make_runtime

    instance = make_runtime(runtime)
    input_spec = instance.load(spec, override)
    instance.set_threads(1)
    return input_spec, instance


@pytest.mark.slow
@pytest.mark.parametrize("runtime", ["onnxruntime", "openvino"])
@pytest.mark.parametrize("external_data", [False, True])
def test_each_runtime_serves_both_of_the_file_s_outputs_by_name(
    cache: Path, tmp_path: Path, runtime: str, external_data: bool, capfd: pytest.CaptureFixture[str]
) -> None:
    path = onnx_models.two_outputs(tmp_path / "two.onnx", external_data=external_data)
    input_spec, instance = served(runtime, str(path))
    classes = (onnx_models.CLASSES,)
    assert [(t.name, t.shape) for t in input_spec.outputs] == [("scores", classes), ("probabilities", classes)]
    layout = [(t.dtype, t.shape) for t in input_spec.outputs]

    def scores(x: np.ndarray) -> np.ndarray:
        return unpack_records(instance.run(x), layout)[0]  # type: ignore[attr-defined]

    for batch in (1, 2, 7):
        x = sample_input(input_spec, batch, seed=batch)
        got, probabilities = unpack_records(instance.run(x), layout)  # type: ignore[attr-defined]
        np.testing.assert_allclose(got, onnx_models.scores(x), rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(probabilities.sum(axis=1), 1.0, rtol=1e-5)
    assert "left out" not in capfd.readouterr().err
    (entry,) = [folder for folder in cache.iterdir() if folder.is_dir()]
    meta = json.loads((entry / "meta.json").read_text())
    assert meta["outputs"] == ["scores", "probabilities"] and meta["input_name"] == "x"
    if runtime == "openvino":  # its IR is checked against ONNX Runtime on the file itself
        assert meta["checked_against"] == "onnxruntime on the ONNX file" and max(meta["max_abs_error"].values()) < 1e-5
    # The entry holds its own copy: a file rewritten while the daemon serves never reaches a worker.
    for written in tmp_path.glob("two.onnx*"):
        written.write_bytes(b"rewritten")
    assert scores(x).shape == (7, onnx_models.CLASSES)
    instance.set_threads(1)  # a new session, built from the entry's copy
    np.testing.assert_allclose(scores(x), onnx_models.scores(x), rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_token_ids_with_a_free_sequence_are_served_at_the_given_length(cache: Path, tmp_path: Path) -> None:
    path = onnx_models.token_embedding(tmp_path / "ids.onnx", rows=50)
    input_spec, instance = served("onnxruntime", str(path), "int64:9")
    assert (input_spec.dtype, input_spec.shape, input_spec.high) == ("int64", (9,), 50)
    assert instance.run(sample_input(input_spec, 3)).shape == (3, 8)  # type: ignore[attr-defined]


@pytest.mark.slow
def test_a_graph_that_runs_at_one_batch_size_only_is_refused_and_leaves_no_entry(cache: Path, tmp_path: Path) -> None:
    pytest.importorskip("onnxruntime")
    path = onnx_models.batch_baked_in(tmp_path / "baked.onnx")
    refusal = r"preparing .*baked\.onnx for onnxruntime: onnxruntime (cannot run|gives)"
    with pytest.raises(ConversionError, match=refusal):
        ensure_converted(str(path), None, "onnxruntime")
    assert not [folder for folder in cache.iterdir() if folder.is_dir()]


@pytest.mark.slow
def test_the_refusal_reaches_the_user_without_an_internal_command(cache: Path, tmp_path: Path) -> None:
    pytest.importorskip("onnxruntime")
    path = onnx_models.two_outputs(tmp_path / "fixed.onnx", batch=1)
    with pytest.raises(ConversionError) as refused:
        ensure_converted(str(path), None, "onnxruntime")
    message = str(refused.value)
    assert message.startswith(f"preparing {path} for onnxruntime: {path}'s input 'x' has a fixed batch size 1")
    assert "packrat convert" not in message and "Traceback" not in message and "\n" not in message


@pytest.mark.slow
def test_the_emulated_runtime_learns_an_onnx_file_s_shapes(cache: Path, tmp_path: Path) -> None:
    pytest.importorskip("onnxruntime")
    from workers.runtimes.emulated import learn_shapes

    path = onnx_models.two_outputs(tmp_path / "two.onnx")
    shapes = learn_shapes(str(path), None)
    assert shapes["input"]["inputs"] == [TensorSpec("x", "float32", (onnx_models.FEATURES,)).to_json()]
    assert shapes["output"]["shape"] == [2 * onnx_models.CLASSES * 4]  # the records of both float32 outputs
