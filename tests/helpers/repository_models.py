"""A model repository of three tiny models, built in the test: an ONNX file (Triton's layout with a config.pbtxt),
a Hugging Face folder (Triton's layout, no config.pbtxt) and a .pt2 (listed in repository.toml), each served by
the runtime repository.toml gives it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from tests.helpers import onnx_models

ONNX_CONFIG = """
name: "linear"
platform: "onnxruntime_onnx"
max_batch_size: 4
input [ { name: "x" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [ { name: "scores" data_type: TYPE_FP32 dims: [ 4 ] } ]
instance_group [ { count: 2 kind: KIND_CPU } ]
"""

REPOSITORY_TOML = """
[defaults]
policy = "single"
max_batch = 4

[models.linear]
runtime = "onnxruntime"

[models.doubler]
model = "exported/doubler.pt2"
"""

NAMES = ("bert", "linear", "doubler")  # the repository's order: its folders by name, then repository.toml's


class Doubler(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2.0 + 1.0


def build(root: Path) -> Path:
    """The repository folder: linear/ (ONNX, config.pbtxt), bert/ (HF folder), exported/doubler.pt2 (TOML)."""
    import transformers

    (root / "linear" / "1").mkdir(parents=True)
    onnx_models.two_outputs(root / "linear" / "1" / "model.onnx")
    (root / "linear" / "config.pbtxt").write_text(ONNX_CONFIG)
    torch.manual_seed(1)
    config = transformers.BertConfig(vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=64, max_position_embeddings=32, num_labels=3)  # fmt: skip
    transformers.BertForSequenceClassification(config).save_pretrained(root / "bert" / "1")
    (root / "exported").mkdir()
    batch = torch.export.Dim("batch", min=1, max=64)
    exported = torch.export.export(Doubler(), (torch.randn(2, 8),), dynamic_shapes={"x": {0: batch}})
    torch.export.save(exported, str(root / "exported" / "doubler.pt2"))
    (root / "repository.toml").write_text(REPOSITORY_TOML)
    return root


def inputs(name: str, samples: int = 2) -> dict[str, np.ndarray]:
    """A request's inputs for each model of the repository, by name."""
    rng = np.random.default_rng(5)
    if name == "linear":
        return {"x": rng.standard_normal((samples, onnx_models.FEATURES), dtype=np.float32)}
    if name == "doubler":
        return {"input": rng.standard_normal((samples, 8), dtype=np.float32)}
    ids = rng.integers(1, 120, (samples, 16)).astype(np.int64)
    return {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}
