"""The repository on disk, read without starting anything: config.pbtxt in protobuf's text format, Triton's
folders (the newest version, what config.pbtxt gives, what is left out and why), repository.toml's models and
settings checked against `packrat serve`'s table, each source's precedence, and typed errors saying what to do."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from packrat_daemon.repository import pbtxt
from packrat_daemon.repository.daemons import toml_text
from packrat_daemon.repository.errors import RepositoryError
from packrat_daemon.repository.joint import JointPlan
from packrat_daemon.repository.layout import read_repository
from packrat_daemon.wire.errors import ConfigError
from policies.planning.topology import Topology


def model_file(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"")  # its name is what the layout reads; no daemon loads it here
    return path


def hf_folder(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"model_type": "bert"}))
    return path


def test_pbtxt_reads_protobufs_text_format() -> None:
    message = pbtxt.parse("""
        name: "resnet"  # a comment
        max_batch_size : 8
        input [ { name: "x", data_type: TYPE_FP32, dims: [ 3, 224, 224 ] } ]
        output { name: 'y' dims: [-1] };
        dynamic_batching { max_queue_delay_microseconds: 100 preferred_batch_size: [ 4, 8 ] }
        parameters: { key: "a" value: { string_value: "b" } }
        optimization < cpu_execution_accelerator: true >
    """)
    assert pbtxt.first(message, "name") == "resnet" and pbtxt.first(message, "max_batch_size") == 8
    assert message["input"] == [{"name": ["x"], "data_type": ["TYPE_FP32"], "dims": [3, 224, 224]}]
    assert message["output"] == [{"name": ["y"], "dims": [-1]}]
    assert pbtxt.first(message, "dynamic_batching")["preferred_batch_size"] == [4, 8]
    assert message["optimization"] == [{"cpu_execution_accelerator": [True]}]
    with pytest.raises(RepositoryError, match="a message is not closed"):
        pbtxt.parse("input { name: 'x'", "m/config.pbtxt")
    with pytest.raises(RepositoryError, match="m/config.pbtxt, line 2: cannot read"):
        pbtxt.parse('name: "a"\n  $oops', "m/config.pbtxt")


def test_a_triton_folder_serves_its_newest_version_with_config_pbtxt_read(tmp_path: Path) -> None:
    model_file(tmp_path / "resnet" / "1" / "model.onnx")
    model_file(tmp_path / "resnet" / "3" / "model.onnx")
    (tmp_path / "resnet" / "config.pbtxt").write_text("""
        name: "resnet50" platform: "onnxruntime_onnx" max_batch_size: 8
        instance_group [ { count: 4 kind: KIND_CPU } ]
        dynamic_batching { max_queue_delay_microseconds: 2000 preferred_batch_size: [ 8 ] }
        input [ { name: "x" data_type: TYPE_FP32 dims: [ 3, 224, 224 ] } ]
    """)
    model_file(tmp_path / "scripted" / "1" / "weights.pt")
    (tmp_path / "scripted" / "config.pbtxt").write_text(
        'max_batch_size: 0 input [ { name: "in" data_type: TYPE_FP32 dims: [ 16 ] } ]'
    )
    hf_folder(tmp_path / "bert" / "1")
    (tmp_path / "notes").mkdir()  # not a model folder: passed over
    repository = read_repository(str(tmp_path))
    assert list(repository.models) == ["bert", "resnet50", "scripted"]
    resnet = repository.models["resnet50"]
    assert (resnet.model, resnet.version) == (str(tmp_path / "resnet" / "3" / "model.onnx"), "3")
    assert resnet.given == {"max_batch": 8, "max_delay_ms": 2.0}
    notes = "\n".join(resnet.notes)
    assert "served as 'resnet50', config.pbtxt's name (its folder is 'resnet')" in notes
    assert "version 3 served; versions 1 left out" in notes
    assert "instance_group left out: Packrat plans its instances and their threads itself" in notes
    assert "preferred_batch_size left out: Packrat plans its batch sizes from the live traffic" in notes
    assert "platform left out: the model file's kind decides the runtime" in notes
    # A TorchScript file does not declare its input: config.pbtxt's gives it; max_batch_size 0 is no batching.
    assert repository.models["scripted"].given == {"max_batch": 1, "input": "float32:16"}
    assert repository.models["bert"].model == str(tmp_path / "bert" / "1")


def test_repository_toml_lists_models_and_settings_each_source_winning_over_the_last(tmp_path: Path) -> None:
    model_file(tmp_path / "linear" / "1" / "model.onnx")
    (tmp_path / "linear" / "config.pbtxt").write_text("max_batch_size: 8")
    model_file(tmp_path / "exported" / "doubler.pt2")
    (tmp_path / "repository.toml").write_text("""
        [defaults]
        runtime = "torch"
        max_delay_ms = 3.0
        [models.linear]
        runtime = "onnxruntime"
        [models.doubler]
        model = "exported/doubler.pt2"
        max_batch = 2
        load = false
    """)
    repository = read_repository(str(tmp_path))
    assert list(repository.models) == ["linear", "doubler"]
    assert repository.models["doubler"].model == str((tmp_path / "exported" / "doubler.pt2").resolve())
    assert not repository.models["doubler"].load
    flags = {"max_delay_ms": 1.5, "max_batch": 16, "http_port": 8000, "repository": str(tmp_path)}
    linear = repository.settings("linear", flags)
    assert linear == {"runtime": "onnxruntime", "max_delay_ms": 1.5, "max_batch": 8,
                      "model": str(tmp_path / "linear" / "1" / "model.onnx")}  # fmt: skip
    assert repository.settings("doubler", flags)["max_batch"] == 2
    # The TOML file named itself: the same repository.
    assert read_repository(str(tmp_path / "repository.toml")) == repository


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        ("[models.a]\nmodel = 'a.onnx'\nmax_bach = 4", r"unknown option 'max_bach'; did you mean 'max_batch'"),
        ("[models.a]\nmodel = 'a.onnx'\nmax_batch = 'four'", r"max_batch = \"four\" is not allowed; expected a pos"),
        ("[models.a]\nmodel = 'a.onnx'\ncpus = '0-3'", r"sets cpus, which a model of a repository does not set: the "),
        ("[defaults]\nhttp_port = 8000", r"sets http_port, .*one gateway serves every model"),
        ("[models.a]\nmax_batch = 4", r"\[models.a\] has no `model` and .* has no folder a/"),
        ("[model.a]\nmodel = 'a.onnx'", r"unknown table\(s\) model; a repository file has \[defaults\]"),
        ("[models.a]\nmodel = 'a.onnx'\nload = 'yes'", r"load = 'yes'; write true or false"),
    ],
)
def test_a_repository_toml_that_cannot_work_is_refused_saying_what_to_write(
    tmp_path: Path, toml: str, message: str
) -> None:
    (tmp_path / "repository.toml").write_text(toml)
    with pytest.raises(ConfigError, match=message):  # RepositoryError, or the settings table's own ConfigError
        read_repository(str(tmp_path))


def test_a_repository_that_cannot_be_served_is_refused_saying_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(RepositoryError, match="no such folder or file; give a folder of models"):
        read_repository(str(tmp_path / "missing"))
    with pytest.raises(RepositoryError, match="holds no model; put each in a folder of its own"):
        read_repository(str(tmp_path))
    (tmp_path / "empty" / "1").mkdir(parents=True)
    with pytest.raises(RepositoryError, match="empty: .*holds no model"):
        read_repository(str(tmp_path))
    (tmp_path / "empty" / "1").rmdir()
    (tmp_path / "empty" / "config.pbtxt").write_text("name: 'empty'")
    with pytest.raises(RepositoryError, match="has no version folder; put the model in .*/empty/1/"):
        read_repository(str(tmp_path))
    (tmp_path / "empty" / "config.pbtxt").write_text("ensemble_scheduling { step [ ] }")
    with pytest.raises(RepositoryError, match="ensemble_scheduling is not served: an ensemble chains models"):
        read_repository(str(tmp_path))
    (tmp_path / "empty" / "config.pbtxt").unlink()
    model_file(tmp_path / "a" / "1" / "model.onnx")
    model_file(tmp_path / "b" / "1" / "model.onnx")
    (tmp_path / "b" / "config.pbtxt").write_text("name: 'a'")
    with pytest.raises(RepositoryError, match="two models are named 'a'"):
        read_repository(str(tmp_path))


def test_a_model_daemons_settings_file_is_toml_serve_reads(tmp_path: Path) -> None:
    from packrat_daemon.config import load_config

    path = tmp_path / "serve.toml"
    path.write_text(toml_text({"model": 'a "b".onnx', "max_batch": 4, "max_delay_ms": 1.5, "adapt": False,
                               "batches": [1, 2], "input": None}))  # fmt: skip
    config = load_config({}, str(path))
    assert (config.model, config.max_batch, config.max_delay_ms, config.adapt, config.batches) == (
        'a "b".onnx', 4, 1.5, False, [1, 2])  # fmt: skip


def test_each_model_starts_on_its_share_of_the_even_division_or_every_cpu(tmp_path: Path) -> None:
    joint = JointPlan(Topology.synthetic(4), tmp_path / "coordinator.json")
    assert joint.first_cpus(["a", "b", "c"]) == {"a": "0-1", "b": "2", "c": "3"}
    assert joint.first_cpus(["a"]) == {"a": "0-3"}
    assert joint.first_cpus(list("abcde")) == dict.fromkeys("abcde")  # more models than cores: they time-share


def test_what_each_model_needs_its_own_of_is_refused_for_all_and_a_shared_state_dir_is_split(tmp_path: Path) -> None:
    model_file(tmp_path / "a" / "1" / "model.onnx")
    (tmp_path / "repository.toml").write_text("[defaults]\nmetrics_port = 9464")
    with pytest.raises(RepositoryError, match="would give metrics_port to every model: each model's daemon would"):
        read_repository(str(tmp_path))
    (tmp_path / "repository.toml").write_text("[models.a]\nmetrics_port = 9464")
    repository = read_repository(str(tmp_path))
    with pytest.raises(RepositoryError, match="give endpoint to every model: each model's daemon binds its own"):
        repository.settings("a", {"endpoint": "tcp://127.0.0.1:5555"})
    settings = repository.settings("a", {"state_dir": "/var/lib/packrat"})
    assert settings["state_dir"] == "/var/lib/packrat/a" and settings["metrics_port"] == 9464


def test_the_repositorys_gateway_settings_are_checked_before_anything_starts() -> None:
    from packrat_daemon.config import ServeConfig
    from packrat_daemon.repository.server import gateway_options

    with pytest.raises(ConfigError, match="give --http-port or --grpc-port .*e.g. --http-port 8000 --grpc-port 8001"):
        gateway_options(ServeConfig(repository="/srv/models"))
    with pytest.raises(ConfigError, match="--oip-model-name names a lone daemon's model"):
        gateway_options(ServeConfig(repository="/srv/models", http_port=8000, oip_model_name="a"))
    options = gateway_options(ServeConfig(repository="/srv/models", http_port=8000, grpc_port=8001))
    assert (options.http_port, options.grpc_port, options.grpc_server) == (8000, 8001, "aio")
