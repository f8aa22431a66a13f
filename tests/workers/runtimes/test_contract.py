"""Every registered runtime against the runtime contract (workers.runtimes.testing), and the registry's tables.

A new runtime adds its class here, as each one below: the first test fails until it does."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from workers.runtimes import make_runtime
from workers.runtimes.base import Runtime
from workers.runtimes.registry import BY_NAME, EMULATED, RECORDS, computing, either
from workers.runtimes.testing import RuntimeContract


class TestTorch(RuntimeContract):
    name = "torch"


class TestOnnxRuntime(RuntimeContract):
    name = "onnxruntime"


class TestOpenVino(RuntimeContract):
    name = "openvino"


class TestEmulated(RuntimeContract):
    name = EMULATED

    @pytest.fixture
    def made(self, tmp_path: Path) -> Runtime:
        # What the daemon hands an emulated template (packrat_daemon.measure.emulation): L̂(t, b) for t 1-2, b 1-3.
        numbers = {"latency_ms": {"1": [0.2, 0.3, 0.4], "2": [0.1, 0.2, 0.3]}, "cores": 2, "contention": [1.0, 1.0],
                   "label": "contract"}  # fmt: skip
        (tmp_path / "numbers.json").write_text(json.dumps(numbers))
        return make_runtime(f"{EMULATED}:{tmp_path / 'numbers.json'}")


def test_every_registered_runtime_has_its_contract_test() -> None:
    tested = {contract.name for contract in RuntimeContract.__subclasses__()}
    assert tested == set(BY_NAME), f"add a RuntimeContract subclass for {sorted(set(BY_NAME) - tested)}"


def test_the_registry_names_each_runtime_once_torch_first() -> None:
    assert [record.name for record in RECORDS] == list(BY_NAME) and RECORDS[0].name == "torch"
    assert len({record.runtime for record in RECORDS}) == len(RECORDS), "one class per runtime"
    assert computing() == ("torch", "onnxruntime", "openvino")
    assert either(computing()) == "torch, onnxruntime or openvino"  # as the runtime setting's help says it


def test_a_saved_profile_holds_for_its_runtimes_library_versions() -> None:
    from packrat_daemon.config import ServeConfig
    from packrat_daemon.ops.state_identity import LIBRARIES, identity
    from policies.planning.topology import Topology

    assert {record.name: record.libraries for record in RECORDS} == LIBRARIES
    config, topology = ServeConfig(model="builtin:tiny-mlp"), Topology.synthetic(2)
    for record in RECORDS:
        versions = identity(config, record.name, "fp32", topology)["versions"]
        assert list(versions) == list(record.libraries), record.name
