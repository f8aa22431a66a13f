"""OpenVINO's session settings: one unpinned stream of the asked threads, at an explicit precision."""

from __future__ import annotations

import pytest

from workers.runtimes.openvino_runtime import openvino_config


def test_one_unpinned_stream_of_the_asked_threads() -> None:
    config = openvino_config(3)
    assert (config["INFERENCE_NUM_THREADS"], config["NUM_STREAMS"], config["ENABLE_CPU_PINNING"]) == (3, 1, False)


@pytest.mark.parametrize(
    ("precision", "hint"),
    [
        ("fp32", "f32"),  # never OpenVINO's own bf16 default
        ("bf16", "bf16"),
        ("int8", "f32"),  # the operations NNCF left in float run in f32: int8's error is the quantization's alone
    ],
)
def test_openvino_is_told_its_precision_explicitly(precision: str, hint: str) -> None:
    assert openvino_config(2, precision)["INFERENCE_PRECISION_HINT"] == hint
