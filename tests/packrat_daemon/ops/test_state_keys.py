"""The state is keyed by everything that changes a measurement: one test per key part, each changing that part
alone and checking that the saved entry is not served again (and that the log line names the part).

The finding: two daemons of built-in BERT-base, at `--input int64:128` and `--input int64:32`, shared one
entry, so the 32-token daemon served the 128-token daemon's runtime choice, profile and plan.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import pytest

from packrat_daemon.config import ServeConfig
from packrat_daemon.ops import state_identity
from packrat_daemon.ops.state import STATE_FILE, Entry, StateKeeper
from policies.planning.profile import Profile
from policies.planning.topology import Topology

BERT = ServeConfig(model="builtin:bert-base", input="int64:128", max_batch=4)
TOPOLOGY = Topology.synthetic(4)  # CPUs 0-3
PROFILE = Profile.from_latencies({(1, 4): 3.0, (2, 4): 2.0}, model="builtin:bert-base", runtime="torch")

Start = tuple[ServeConfig, Topology]


def saved(folder: Path, config: ServeConfig, topology: Topology) -> None:
    """A daemon that measured torch for `config` on `topology`, and stopped."""
    keeper = StateKeeper(str(folder))
    keeper.record("torch", Entry(keeper.identity(config, "torch", "fp32", topology), PROFILE))
    keeper.served_key = "torch"
    from tests.packrat_daemon.ops.test_state import Serving

    keeper.save(Serving(), "stop")


def served_again(folder: Path, config: ServeConfig, topology: Topology) -> bool:
    keeper = StateKeeper(str(folder))
    return keeper.restore("torch", keeper.identity(config, "torch", "fp32", topology)) is not None


def test_the_same_start_serves_what_it_saved(tmp_path: Path) -> None:
    saved(tmp_path, BERT, TOPOLOGY)
    assert served_again(tmp_path, BERT, TOPOLOGY)


def _model_file(tmp_path: Path) -> Start:
    model = tmp_path / "model.pt2"
    model.write_bytes(b"weights")
    return ServeConfig(model=str(model), max_batch=4), TOPOLOGY


def _hf_folder(tmp_path: Path) -> Start:
    folder = tmp_path / "bert"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(b"weights")
    return ServeConfig(model=f"hf:{folder}", max_batch=4), TOPOLOGY


def _rewrite(tmp_path: Path) -> None:
    for path in (tmp_path / "model.pt2", tmp_path / "bert" / "model.safetensors"):
        if path.exists():
            path.write_bytes(b"other weights")


@pytest.mark.parametrize(
    ("part", "before", "change", "said"),
    [
        ("input", lambda _: (BERT, TOPOLOGY), None, "--input 'int64:128' → 'int64:32'"),
        ("model file", _model_file, _rewrite, "the model file changed"),
        ("Hugging Face folder", _hf_folder, _rewrite, "the model file changed"),
        ("CPU set", lambda _: (BERT, TOPOLOGY), None, "the CPU set '0-3' → '4-7'"),
    ],
)
def test_a_start_that_differs_in_one_key_part_measures_its_own(
    tmp_path: Path,
    part: str,
    before: Callable[[Path], Start],
    change: Callable[[Path], None] | None,
    said: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    config, topology = before(tmp_path)
    folder = tmp_path / "state"
    saved(folder, config, topology)
    if part == "input":
        config = ServeConfig(model="builtin:bert-base", input="int64:32", max_batch=4)
    elif part == "CPU set":  # as many cores, other ones: another socket, other caches
        topology = Topology.synthetic(8).restricted(range(4, 8))
        assert topology.usable_cores == TOPOLOGY.usable_cores
    elif change is not None:
        change(tmp_path)
    with caplog.at_level(logging.WARNING, logger="packrat.daemon"):
        assert not served_again(folder, config, topology)
    assert said in caplog.text and "measured for another setting" in caplog.text
    assert not (folder / STATE_FILE).exists()  # set aside


def test_a_runtime_upgrade_measures_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    saved(tmp_path, BERT, TOPOLOGY)
    monkeypatch.setattr(state_identity, "_version", lambda name: f"{name}-99.0")
    assert not served_again(tmp_path, BERT, TOPOLOGY)


@pytest.mark.parametrize("runtime", ["onnxruntime", "openvino"])
def test_each_runtime_is_keyed_by_its_own_library_and_torchs(runtime: str, monkeypatch: pytest.MonkeyPatch) -> None:
    versions = {"torch": "2.0", "onnxruntime": "1.0", "openvino": "2024.0"}
    monkeypatch.setattr(state_identity, "_version", versions.get)
    before = state_identity.identity(BERT, runtime, "fp32", TOPOLOGY)
    assert before["versions"] == {"torch": "2.0", runtime: versions[runtime]}
    versions[runtime] = "0.1"
    assert state_identity.mismatch(before, state_identity.identity(BERT, runtime, "fp32", TOPOLOGY)) == (
        f"{runtime} {before['versions'][runtime]} → 0.1"
    )


def test_a_choice_between_runtimes_is_not_served_to_another_input(tmp_path: Path) -> None:
    """The finding's other half: the warm choice (no other candidate started) is keyed the same way."""
    from packrat_daemon.measure.runtime_choice import SERVED, SLOWER, Verdict
    from packrat_daemon.ops.state import Choice
    from tests.packrat_daemon.ops.test_state import Serving

    keeper = StateKeeper(str(tmp_path))
    identities = {r: keeper.identity(BERT, r, "fp32", TOPOLOGY) for r in ("torch", "onnxruntime")}
    keeper.record("torch", Entry(identities["torch"], PROFILE))
    keeper.served_key = "torch"
    keeper.choice = Choice([Verdict("torch", SERVED, 1.0, "fastest"), Verdict("onnxruntime", SLOWER, 2.0, "")],
                           identities, {"policy": "packrat"})  # fmt: skip
    keeper.save(Serving(), "stop")
    again = StateKeeper(str(tmp_path))
    assert again.warm_choice(identities, {"policy": "packrat"}) == "torch"
    shorter = ServeConfig(model="builtin:bert-base", input="int64:32", max_batch=4)
    now = {r: again.identity(shorter, r, "fp32", TOPOLOGY) for r in identities}
    assert StateKeeper(str(tmp_path)).warm_choice(now, {"policy": "packrat"}) is None
