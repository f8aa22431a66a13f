"""The served model's description, learned from the daemon: from its `info` (or `status`) and, for the outputs'
datatypes and shapes, one single-sample inference of zeros when it starts serving; then followed while it serves.

A model of one input and one output is served as `input` and `output`, over the daemon's protocol version 1. A
model of several inputs or outputs is served under their own names (the daemon's `info` lists them), over its
protocol version 2.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import numpy as np

from packrat_daemon.protocol.model import ModelSpec, TensorSpec, default_model_name
from packrat_daemon.protocol.tensors import OIP_DATATYPE, PACKRAT_DTYPE
from packrat_daemon.protocol.upstream import Upstream, UpstreamTimeout

log = logging.getLogger("packrat.oip")

INPUT_NAME, OUTPUT_NAME = "input", "output"
PROBE_TIMEOUT_S = 1.0  # a kubelet probe's default timeout: an answer later than that counts as a failure anyway


def described_differently(spec: ModelSpec, status: dict[str, Any]) -> bool:
    """Whether the daemon's `status` describes another model than `spec` (restarted with another model, or reloaded
    to another max_batch): its description is to be learned again."""
    given = (status["model"], status["input"]["dtype"], tuple(status["input"]["shape"]), status["max_batch"])
    return given != (spec.model, PACKRAT_DTYPE[spec.input.datatype], spec.input.longest(), spec.max_batch)


def followed(spec: ModelSpec, status: dict[str, Any]) -> ModelSpec:
    """`spec` with what the daemon changes while it serves the same tensors: its runtime (a switch to OpenVINO or
    ONNX Runtime measured faster), its plan's instances, its batching delay (a reload). None changes an output."""
    runtime = status.get("runtime", spec.runtime)
    instances = len(status.get("plan", {}).get("instances", [])) or spec.instances
    delay = status.get("max_delay_ms", spec.max_delay_ms)
    if (runtime, instances, delay) == (spec.runtime, spec.instances, spec.max_delay_ms):
        return spec
    if runtime != spec.runtime:
        log.info("model %r is now served by %s (was %s)", spec.name, runtime, spec.runtime)
    return dataclasses.replace(spec, runtime=runtime, instances=instances, max_delay_ms=delay)


async def discover(upstream: Upstream, info: dict[str, Any], model_name: str | None) -> ModelSpec | None:
    """The model's description: `info`, and the outputs from a single-sample inference of zeros; named
    `model_name`, else after the daemon's model spec. None when the probe fails or times out (asked again later)."""
    named_inputs = info.get("inputs") or [{"name": INPUT_NAME, **info["input"]}]
    named = len(named_inputs) > 1 or len(info.get("outputs") or ()) > 1
    zeros = {  # a free axis (-1) at its least length
        tensor["name"]: np.zeros((1, *[tensor.get("min_length", 1) if d == -1 else d for d in tensor["shape"]]),
                                 dtype=np.uint16 if tensor["dtype"] == "bfloat16" else tensor["dtype"])
        for tensor in named_inputs
    }  # fmt: skip
    dtype = info["input"]["dtype"]
    probe: np.ndarray | dict[str, np.ndarray] = zeros if named else next(iter(zeros.values()))
    try:
        header, output = await upstream.infer(probe, PROBE_TIMEOUT_S * 5, dtype=dtype)
    except UpstreamTimeout:
        return None
    if not header.get("ok") or output is None:
        log.warning("the probe for the model's output failed (%s); trying again later", header.get("error"))
        return None
    # A per-token output's free axis is -1, as the daemon declares it (the probe answers at its own length).
    declared = {o["name"]: tuple(o["shape"]) for o in info.get("outputs") or () if -1 in (o.get("shape") or ())}
    inputs = tuple(TensorSpec(t["name"], OIP_DATATYPE[t["dtype"]], tuple(t["shape"]), int(t.get("max_length", 0)))
                   for t in named_inputs)  # fmt: skip
    if named:
        assert isinstance(output, dict)  # a version-2 reply names its outputs
        dtypes = {entry["name"]: entry["dtype"] for entry in header["outputs"]}
        outputs = tuple(TensorSpec(key, OIP_DATATYPE[dtypes[key]], declared.get(key, tuple(a.shape[1:])))
                        for key, a in output.items())  # fmt: skip
    else:
        assert isinstance(output, np.ndarray)
        if not info.get("inputs"):  # an older daemon's info: its one input under `input`
            inputs = (TensorSpec(INPUT_NAME, OIP_DATATYPE[dtype], tuple(info["input"]["shape"])),)
        else:
            inputs = (dataclasses.replace(inputs[0], name=INPUT_NAME),)
        first = next(iter(declared.values()), tuple(output.shape[1:]))
        outputs = (TensorSpec(OUTPUT_NAME, OIP_DATATYPE[header["dtype"]], first),)
    name = model_name or default_model_name(info["model"])
    spec = ModelSpec(
        name=name,
        model=info["model"],
        runtime=info.get("runtime", "torch"),
        inputs=inputs,
        outputs=outputs,
        max_batch=int(info["max_batch"]),
        max_message_bytes=int(info["limits"]["max_message_bytes"]),
        instances=len(info.get("plan", {}).get("instances", [])) or 1,
        named=named,
        max_delay_ms=info.get("max_delay_ms"),
    )
    log.info("serving model %r (%s) over the Open Inference Protocol", name, spec.model)
    return spec
