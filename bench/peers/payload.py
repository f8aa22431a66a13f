"""The one input every peer gets, and its bytes on each wire. numpy only: every environment imports it.

The tensor bytes are the same everywhere: TorchServe's REST body is the raw tensor; the Open Inference Protocol
(Triton, Packrat's gateway) sends the same raw tensor after a JSON header (the binary-data extension), and asks for
the output as binary data too; Packrat's ZeroMQ client sends the same raw tensor in a frame.
"""

from __future__ import annotations

import json

import numpy as np

# Packrat's built-in models (workers/models/loading.py): per-sample input, the OIP datatype, the output's width.
MODELS: dict[str, dict] = {
    "resnet50": {"spec": "builtin:resnet50", "dtype": "float32", "shape": (3, 224, 224), "high": None, "out": 1000},
    "bert-base": {"spec": "builtin:bert-base", "dtype": "int64", "shape": (128,), "high": 30522, "out": 768},
}
OIP_DATATYPE = {"float32": "FP32", "int64": "INT64"}
INPUT_NAME, OUTPUT_NAME = "input", "output"  # Packrat's gateway's names; the Triton model uses the same


def make_input(model: str, batch: int, seed: int = 0) -> np.ndarray:
    """`batch` samples of `model`'s input, the same for a given seed in every environment."""
    spec = MODELS[model]
    rng = np.random.default_rng(seed)
    if spec["high"] is None:
        return rng.random((batch, *spec["shape"]), dtype=np.float32)
    return rng.integers(0, spec["high"], size=(batch, *spec["shape"]), dtype=np.int64)


def oip_request(array: np.ndarray) -> tuple[bytes, dict[str, str]]:
    """The binary-data request body for `array` and its headers."""
    header = {
        "inputs": [
            {
                "name": INPUT_NAME,
                "shape": list(array.shape),
                "datatype": OIP_DATATYPE[str(array.dtype)],
                "parameters": {"binary_data_size": array.nbytes},
            }
        ],
        "outputs": [{"name": OUTPUT_NAME, "parameters": {"binary_data": True}}],
    }
    head = json.dumps(header, separators=(",", ":")).encode()
    headers = {"Inference-Header-Content-Length": str(len(head)), "Content-Type": "application/octet-stream"}
    return head + array.tobytes(), headers


def oip_output_bytes(body: bytes, header_length: str | None) -> int:
    """How many bytes of binary output an OIP reply carries (0 if it answered in JSON)."""
    if header_length is None:
        return 0
    return len(body) - int(header_length)


def expected_output_bytes(model: str, batch: int) -> int:
    return batch * MODELS[model]["out"] * 4
