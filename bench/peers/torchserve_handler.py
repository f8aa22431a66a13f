"""TorchServe handler for Packrat's built-in models: runs inside a TorchServe worker (bench/peers/.venv-torchserve).

The model is Packrat's own (`workers.models.loading.load_model`: the same random weights, eval mode, no autograd,
channels_last where Packrat uses it), imported from the repository named in the archive's `peer.json`. A request's
body is the raw little-endian tensor of one or more samples (the same bytes as the Open Inference Protocol's binary
data); the reply is the raw float32 output of those samples. TorchServe's batching hands over several requests at
once: they run as one batch and are split again. No thread setting is made here: TorchServe's defaults (torch's own
threads) or its CPU launcher (OMP_NUM_THREADS and taskset per worker) decide.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

_state: dict[str, Any] = {}


def _initialize(context: Any) -> None:
    model_dir = context.system_properties.get("model_dir")
    with open(os.path.join(model_dir, "peer.json")) as file:
        config = json.load(file)
    if config["repo"] not in sys.path:
        sys.path.insert(0, config["repo"])
    import numpy as np
    import torch

    from workers.models.loading import load_model

    loaded = load_model(config["model"])
    _state.update(
        torch=torch,
        np=np,
        module=loaded.module,
        dtype=np.dtype(loaded.input.dtype),
        shape=tuple(loaded.input.shape),
        channels_last=loaded.channels_last,
        threads=torch.get_num_threads(),
    )


def handle(data: list[dict[str, Any]] | None, context: Any) -> list[bytes] | None:
    if data is None:  # TorchServe's call at start-up for a function entry point
        _initialize(context)
        return None
    torch, np = _state["torch"], _state["np"]
    arrays = []
    for request in data:
        body = request.get("data") or request.get("body")  # octet-stream bodies come as "data" or "body"
        arrays.append(np.frombuffer(bytes(body), dtype=_state["dtype"]).reshape(-1, *_state["shape"]))
    counts = [len(array) for array in arrays]
    batch = torch.from_numpy(np.concatenate(arrays))
    if _state["channels_last"] and batch.dim() == 4:
        batch = batch.contiguous(memory_format=torch.channels_last)
    with torch.inference_mode():
        out = _state["module"](batch).float().numpy()
    replies, start = [], 0
    for count in counts:
        replies.append(np.ascontiguousarray(out[start : start + count]).tobytes())
        start += count
    return replies
