"""The model-level checks of a parsed infer request (the server's side): its dtype, per-sample shape, sample count
and integer range against the model's inputs, each failure a `ProtocolError` that says what was expected.
`server_side` parses a message into a request first; the frontend then asks these.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from packrat_daemon.wire.codec import (
    ErrorCode,
    ProtocolError,
    short_repr,
)
from packrat_daemon.wire.server_side import InferRequest, ModelTensor, bad_request


def check_against_model(
    req: InferRequest,
    input_dtype: str,
    sample_shape: tuple[int, ...],
    max_samples: int,
    high: int | None = None,
    what: str = "",
    free_axis: int | None = None,
    min_length: int = 1,
) -> None:
    """Raise BAD_REQUEST unless ``req`` fits the model's input (a -1 in ``sample_shape`` matches any size; along a
    free axis any size from ``min_length`` to the shape's; an integer input's values lie in [0, ``high``) where the
    model declares it: token ids), and TOO_LARGE for more samples than ``max_samples``: the same code as a message
    over the byte limit, so a client gets one answer to "too many samples" whatever the model's sample size."""
    if free_axis is not None:
        sample_shape = _at_request_length(req, sample_shape, free_axis, min_length, what)
    if req.dtype == input_dtype and req.shape[1:] == sample_shape and req.shape[0] <= max_samples:
        if high is not None:
            _check_range(req, high, f"{what[:-2]}'s" if what else "the input's")
        return  # the common case, checked with three comparisons
    if req.dtype != input_dtype:
        raise bad_request(
            f"{what}dtype is {req.dtype}, but the model takes {input_dtype}; cast the input", req.request_id
        )
    got = req.shape[1:]
    if len(got) != len(sample_shape) or any(
        want != -1 and want != size for want, size in zip(sample_shape, got, strict=True)
    ):
        raise bad_request(
            f"{what}each sample has shape {list(got)}, but the model takes {list(sample_shape)} "
            f"(send shape [samples, {', '.join(map(str, sample_shape))}])",
            req.request_id,
        )
    if req.shape[0] > max_samples:
        raise ProtocolError(
            ErrorCode.TOO_LARGE,
            f"{req.shape[0]} samples in one request; this server takes at most {max_samples}: split the request",
            req.request_id,
        )


def _at_request_length(
    req: InferRequest, sample_shape: tuple[int, ...], axis: int, min_length: int, what: str
) -> tuple[int, ...]:
    """The model's per-sample shape at the request's length along the free `axis`; BAD_REQUEST for a length
    outside [min_length, the longest]."""
    got = req.shape[1:]
    if len(got) != len(sample_shape):
        return sample_shape  # the shape check that follows names the rank
    longest, length = sample_shape[axis], got[axis]
    if not min_length <= length <= longest:
        raise bad_request(
            f"{what}axis {axis + 1} is {length} long; the model takes {min_length} to {longest} there (send a longer "
            "sequence as several requests, or serve a longer --input)",
            req.request_id,
        )
    return (*sample_shape[:axis], length, *sample_shape[axis + 1 :])


def request_length(req: InferRequest, free_axis: int | None) -> int:
    """A checked request's length along its model's free axis (0: the model has none)."""
    return 0 if free_axis is None else int(req.shape[1 + free_axis])


def check_tensors_against_model(
    req: InferRequest, inputs: Sequence[ModelTensor], max_samples: int
) -> list[memoryview | bytes]:
    """The payloads of a request for a model of several named `inputs`, in the model's order; BAD_REQUEST,
    naming what to fix, for a version-1 request, a name the model does not take, an input missing or one that
    does not fit, and TOO_LARGE for more samples than ``max_samples``."""
    names = ", ".join(tensor.name for tensor in inputs)
    if req.tensors is None:
        example = ", ".join(f'"{tensor.name}": ...' for tensor in inputs)
        raise bad_request(
            f"the model takes {len(inputs)} inputs ({names}), and one array was sent: pass a dict of arrays, one "
            f"per input: {names} (in Python, client.infer({{{example}}})); a protocol client must send a "
            "version-2 request (\"v\": 2) naming each in 'inputs', one payload frame per input (docs/protocol.md)",
            req.request_id,
        )
    given = {tensor.name: tensor for tensor in req.tensors}
    unknown = [name for name in given if name not in {tensor.name for tensor in inputs}]
    if unknown:
        raise bad_request(f"unknown input {short_repr(unknown[0])}; the model takes {names}", req.request_id)
    missing = [tensor.name for tensor in inputs if tensor.name not in given]
    if missing:
        raise bad_request(f"input {missing[0]!r} is missing; the model takes {names}, all of them", req.request_id)
    payloads = []
    lengths: dict[str, int] = {}
    for model_tensor in inputs:
        tensor = given[model_tensor.name]
        one = InferRequest(req.request_id, tensor.dtype, tensor.shape, tensor.payload)
        what = f"input {model_tensor.name!r}: "
        check_against_model(one, model_tensor.dtype, model_tensor.shape, max_samples, model_tensor.high, what,
                            model_tensor.free_axis, model_tensor.min_length)  # fmt: skip
        if model_tensor.free_axis is not None:
            lengths[model_tensor.name] = request_length(one, model_tensor.free_axis)
        payloads.append(tensor.payload)
    if len(set(lengths.values())) > 1:
        told = ", ".join(f"{name} {length}" for name, length in lengths.items())
        raise bad_request(f"the inputs' sequences must be of one length; got {told}", req.request_id)
    return payloads


def check_named_input(req: InferRequest, name: str) -> None:
    """BAD_REQUEST unless a version-2 request to a model of one input names it (a version-1 request names none)."""
    if req.tensors is None:
        return
    if len(req.tensors) != 1 or req.tensors[0].name != name:
        listed = ", ".join(short_repr(tensor.name) for tensor in req.tensors)
        raise bad_request(f"the model takes one input, {name!r}; got {listed}", req.request_id)


def _check_range(req: InferRequest, high: int, what: str = "the input's") -> None:
    """BAD_REQUEST for a value outside [0, high): a token id past the vocabulary raised IndexError in the model,
    which failed every other request batched with it (issue 27, 7). One pass over a (small) integer input."""
    values = np.frombuffer(req.payload, dtype=req.dtype)
    if values.size and (int(values.min()) < 0 or int(values.max()) >= high):
        raise bad_request(
            f"{what} values must lie in [0, {high}) (the model's input.high: token ids in its vocabulary); "
            f"got {int(values.min())} to {int(values.max())}",
            req.request_id,
        )
