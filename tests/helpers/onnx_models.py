"""Small ONNX files written with onnx.helper (no PyTorch export): a linear layer with two outputs, and variants
whose input a daemon must refuse or needs told."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

FEATURES, CLASSES = 16, 4
WEIGHT = np.random.default_rng(3).standard_normal((FEATURES, CLASSES)).astype(np.float32)
BIAS = np.random.default_rng(4).standard_normal(CLASSES).astype(np.float32)


def scores(x: np.ndarray) -> np.ndarray:
    """What the two-output model's first output is, in numpy."""
    return x @ WEIGHT + BIAS


def two_outputs(path: Path, batch: int | str = "batch", external_data: bool = False) -> Path:
    """x [batch, 16] float32 → scores = x·W + b, and probabilities = softmax(scores): two outputs."""
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "weight"], ["product"]),
            helper.make_node("Add", ["product", "bias"], ["scores"]),
            helper.make_node("Softmax", ["scores"], ["probabilities"], axis=-1),
        ],
        "two-outputs",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, FEATURES])],
        [
            helper.make_tensor_value_info("scores", TensorProto.FLOAT, [batch, CLASSES]),
            helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, [batch, CLASSES]),
        ],
        [numpy_helper.from_array(WEIGHT, "weight"), numpy_helper.from_array(BIAS, "bias")],
    )
    return _save(graph, path, external_data)


def token_embedding(path: Path, rows: int = 50, sequence: int | str = "sequence", axis: int = 0) -> Path:
    """ids [batch, sequence] int64 → the mean of their rows of a [rows, 8] table: [batch, 8]. With axis 1, the
    ids pick columns of an [8, rows] table instead (graph reading only: that output's first axis is not the batch)."""
    from onnx import TensorProto, helper, numpy_helper

    table = np.random.default_rng(5).standard_normal((rows, 8) if axis == 0 else (8, rows)).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("Gather", ["table", "ids"], ["rows"], axis=axis),
            helper.make_node("ReduceMean", ["rows", "axes"], ["pooled"], keepdims=0),
        ],
        "token-embedding",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", sequence])],
        [helper.make_tensor_value_info("pooled", TensorProto.FLOAT, ["batch", 8])],
        [numpy_helper.from_array(table, "table"), numpy_helper.from_array(np.array([1], np.int64), "axes")],
    )
    return _save(graph, path, False)


def two_inputs(path: Path) -> Path:
    """a, b [batch, 4] float32 → a + b: a model of two inputs."""
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Add", ["a", "b"], ["sum"])],
        "two-inputs",
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, ["batch", 4]) for name in ("a", "b")],
        [helper.make_tensor_value_info("sum", TensorProto.FLOAT, ["batch", 4])],
    )
    return _save(graph, path, False)


def batch_baked_in(path: Path) -> Path:
    """x [batch, 16] whose graph reshapes to [2, -1]: it declares a free batch but runs only at batch 2."""
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        [helper.make_node("Reshape", ["x", "shape"], ["y"])],
        "batch-baked-in",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", FEATURES])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, None])],
        [numpy_helper.from_array(np.array([2, -1], np.int64), "shape")],
    )
    return _save(graph, path, False)


def _save(graph: Any, path: Path, external_data: bool) -> Path:
    import onnx
    from onnx import helper

    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9  # what the installed runtimes all read
    onnx.checker.check_model(model)
    if external_data:
        onnx.save_model(model, str(path), save_as_external_data=True, location=path.name + ".weights",
                        size_threshold=0)  # fmt: skip
    else:
        onnx.save_model(model, str(path))
    return path
