"""`packrat load` against real daemons of the models users bring: an ONNX file of two inputs and a Hugging Face
folder (three token inputs, built here, never downloaded), each sent its inputs by name and every request answered;
lengths sent to the folder's fixed-length daemon padded, and to its free sequence axis each at its own; and a run
in which every request fails exits 1 with the server's own message."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from packrat_daemon.cli import main
from packrat_daemon.wire.client import Client
from tests.helpers import onnx_models
from tests.helpers.daemons import running_daemon
from tests.packrat_daemon.test_models_served import tiny_bert_folder

QUICK = ("--policy", "single", "--max-batch", "4")


def load(capsys: pytest.CaptureFixture[str], *args: str, status: int = 0) -> dict[str, Any]:
    assert main(["load", "--json", "--quiet", "--warmup", "0", *args]) == status, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


@pytest.fixture(scope="module")
def bert(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A tiny BERT folder's daemon (vocabulary 120) at one fixed length, 32 tokens, whose queue holds 2 inputs: a
    request of 4 is refused OVERLOADED, whatever else happens."""
    folder = tiny_bert_folder(tmp_path_factory.mktemp("bert") / "tiny-bert")
    with running_daemon(tmp_path_factory.mktemp("bert-daemon"), "--model", str(folder), "--input", "int64:32", *QUICK,
                        "--max-queue", "2", timeout=300) as (endpoint, _):  # fmt: skip
        yield endpoint


@pytest.mark.slow
def test_a_model_of_two_inputs_is_driven_by_name(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("onnxruntime")
    path = onnx_models.two_inputs(tmp_path / "two-inputs.onnx")
    with running_daemon(tmp_path, "--model", str(path), "--runtime", "onnxruntime", *QUICK, timeout=300) as (
        endpoint,
        _,
    ):
        report = load(capsys, "--endpoint", endpoint, "--concurrency", "2", "--requests", "40", "--batches", "1:1,4:1")
    assert report["sent"] == report["ok"] == 40 and report["errors"] == {}
    assert report["inputs"] == ["a", "b"] and "error_messages" not in report
    assert set(report["latency_ms_by_samples"]) == {"1", "4"}


@pytest.mark.slow
def test_a_hugging_face_folder_is_driven_with_its_three_token_inputs(bert: str, capsys) -> None:
    report = load(capsys, "--endpoint", bert, "--concurrency", "1", "--requests", "30", "--batch", "2")
    assert report["sent"] == report["ok"] == 30 and report["errors"] == {}
    assert report["inputs"] == ["input_ids", "attention_mask", "token_type_ids"]
    assert report["server"]["model"].endswith("tiny-bert")


@pytest.mark.slow
def test_lengths_sent_to_a_fixed_length_folder_are_padded_to_it(bert: str, capsys) -> None:
    report = load(capsys, "--endpoint", bert, "--requests", "30", "--lengths", "uniform:2..32")
    assert report["sent"] == report["ok"] == 30
    assert report["lengths"] == "uniform:2..32" and report["padded_to"] == 32
    assert 0 < report["tokens_per_s"] < 32 * report["throughput_rps"]  # each request's own tokens, not the padding
    assert main(["load", "--endpoint", bert, "--requests", "1", "--lengths", "fixed:33"]) == 2
    assert "up to 33 tokens, but the model takes 32, fixed" in capsys.readouterr().err


@pytest.mark.slow
def test_a_run_in_which_every_request_failed_exits_1_with_the_server_s_message(bert: str, capsys) -> None:
    assert main(["load", "--endpoint", bert, "--requests", "5", "--batch", "4", "--warmup", "0", "--quiet"]) == 1
    captured = capsys.readouterr()
    assert "OVERLOADED" in captured.out and "no request succeeded: 5 of 5 failed (OVERLOADED 5)" in captured.err
    report = load(capsys, "--endpoint", bert, "--requests", "5", "--batch", "4", status=1)
    assert report["ok"] == 0 and report["errors"] == {"OVERLOADED": 5}
    message = report["error_messages"]["OVERLOADED"]
    assert message and message in captured.err and message in captured.out  # the server's words, in both


@pytest.mark.slow
def test_lengths_sent_to_a_folder_of_a_free_sequence_axis_each_go_at_their_own(tmp_path: Path, capsys) -> None:
    folder = tiny_bert_folder(tmp_path / "tiny-bert")
    with running_daemon(tmp_path, "--model", str(folder), *QUICK, timeout=300) as (endpoint, _):
        with Client(endpoint, timeout=30) as client:
            declared = client.info()["inputs"]
        # The folder's sequence axis is free (issue 40): up to its 32 positions, each request its own length.
        assert [(t["shape"], t["max_length"]) for t in declared] == [([-1], 32)] * 3
        report = load(capsys, "--endpoint", endpoint, "--concurrency", "2", "--requests", "40", "--batches",
                      "1:1,3:1", "--lengths", "lognormal:median=6,p99=24,max=32")  # fmt: skip
    assert report["sent"] == report["ok"] == 40 and report["errors"] == {}
    assert report["lengths"] == "lognormal:median=6,p99=24,max=32" and report["padded_to"] is None
    assert 0 < report["tokens_per_s"] < 32 * report["samples_per_s"]
    assert sum(one["ok"] for one in report["latency_ms_by_length"].values()) == 40
