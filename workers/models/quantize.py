"""int8 by post-training quantization: NNCF on the model's OpenVINO IR, calibrated on given inputs.

Run as ``python -m workers.models.quantize`` by `workers.models.cache.ensure_quantized`, which caches the result:
quantizing runs the model many times (statistics, then bias correction), and the template process that
asks for it must never start a thread pool before it forks.

NNCF places int8 fake-quantize operations on the inputs of convolutions and matrix products; OpenVINO then
runs those in int8 (VNNI or AMX where the CPU has them) and the rest of the graph at the inference precision
hint, which Packrat sets to f32 for an int8 model (`workers.runtimes.openvino_runtime.OPENVINO_PRECISIONS`).
A graph with a Softmax (attention) is quantized with NNCF's transformer scheme, which keeps the attention's
sensitive operations out of int8; other graphs get NNCF's default.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np


def is_transformer(model: Any) -> bool:
    """Whether the OpenVINO model has attention (a Softmax): NNCF quantizes those with its transformer scheme."""
    return any(op.get_type_name() == "Softmax" for op in model.get_ops())


def quantize(source: Path, inputs: np.ndarray, out: Path) -> dict[str, Any]:
    """Quantize the IR at `source` on `inputs` (one calibration item per input) and save it at `out`."""
    import nncf
    import openvino as ov

    model = ov.Core().read_model(str(source))
    transformer = is_transformer(model)
    dataset = nncf.Dataset([inputs[k : k + 1] for k in range(len(inputs))])
    quantized = nncf.quantize(
        model,
        dataset,
        subset_size=len(inputs),
        model_type=nncf.ModelType.TRANSFORMER if transformer else None,
    )
    # compress_to_fp16 would store the remaining float weights in fp16: the guard measures what is served,
    # and fp32 weights keep the error the quantization's alone.
    ov.save_model(quantized, str(out), compress_to_fp16=False)
    return {"scheme": "transformer" if transformer else "default", "nncf": nncf.__version__}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m workers.models.quantize")
    parser.add_argument("--source", required=True, help="the fp32 OpenVINO IR (model.xml)")
    parser.add_argument("--inputs", required=True, help=".npy file of the calibration inputs")
    parser.add_argument("--out", required=True, help="where the int8 model.xml goes")
    parser.add_argument("--report", required=True, help="JSON file for what was done")
    args = parser.parse_args(argv)
    done = quantize(Path(args.source), np.load(args.inputs), Path(args.out))
    Path(args.report).write_text(json.dumps(done))
    return 0


if __name__ == "__main__":
    sys.exit(main())
