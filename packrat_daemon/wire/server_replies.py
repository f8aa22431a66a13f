"""The server's replies on the wire: a result (one tensor, or named tensors), `info` and `status`, an error. The
daemon's frontend encodes one per request, so they stay small and allocation-light (docs/protocol.md).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from packrat_daemon.wire.codec import (
    DTYPES,
    PROTOCOL_VERSION,
    SUPPORTED_VERSIONS,
    TENSORS_VERSION,
    Buffer,
    ErrorCode,
    RequestId,
    dump_header,
)
from packrat_daemon.wire.server_side import Tensor


def encode_result(
    request_id: RequestId,
    dtype: str,
    shape: Sequence[int],
    payload: Buffer | np.ndarray,
    timing: Mapping[str, float],
) -> list[bytes | memoryview | np.ndarray]:
    """The reply to an infer request: ``[header, payload]``; the payload is passed through uncopied."""
    header = {
        "v": PROTOCOL_VERSION,
        "id": request_id,
        "ok": True,
        "dtype": dtype,
        "shape": list(map(int, shape)),
        "timing": timing,
    }
    return [dump_header(header), payload]


def encode_timed_result(
    request_id: RequestId,
    dtype: str,
    shape: Sequence[int],
    payload: Buffer | np.ndarray,
    queue_ms: float,
    compute_ms: float,
    total_ms: float,
    instances: int,
) -> list[bytes | memoryview | np.ndarray]:
    """:func:`encode_result` with the daemon's own timing fields, formatted in one step (once per reply).

    Milliseconds are written with three decimals; a value that is not a finite number goes through
    :func:`encode_result`, which refuses it.
    """
    if type(request_id) is int and dtype in DTYPES and math.isfinite(queue_ms + compute_ms + total_ms):
        dims = ",".join(map(str, map(int, shape)))
        text = _TIMED_RESULT % (request_id, dtype, dims, queue_ms, compute_ms, total_ms, instances)
        return [text.encode(), payload]
    timing = {"queue_ms": round(queue_ms, 3), "compute_ms": round(compute_ms, 3), "total_ms": round(total_ms, 3)}
    return encode_result(request_id, dtype, shape, payload, {**timing, "instances": instances})


_TIMED_RESULT = (
    f'{{"v":{PROTOCOL_VERSION},"id":%d,"ok":true,"dtype":"%s","shape":[%s],'
    '"timing":{"queue_ms":%.3f,"compute_ms":%.3f,"total_ms":%.3f,"instances":%d}}'
)


def encode_tensors_result(
    request_id: RequestId,
    outputs: Sequence[Tensor],
    queue_ms: float,
    compute_ms: float,
    total_ms: float,
    instances: int,
) -> list[bytes | memoryview]:
    """The version-2 reply to an infer request: ``[header, payload, ...]``, one frame per named output, in the
    order the header's ``outputs`` lists them; the payloads are passed through uncopied."""
    timing = {"queue_ms": round(queue_ms, 3), "compute_ms": round(compute_ms, 3), "total_ms": round(total_ms, 3)}
    header = {
        "v": TENSORS_VERSION,
        "id": request_id,
        "ok": True,
        "outputs": [{"name": out.name, "dtype": out.dtype, "shape": list(map(int, out.shape))} for out in outputs],
        "timing": {**timing, "instances": instances},
    }
    return [dump_header(header), *[out.payload for out in outputs]]


def encode_info(request_id: RequestId, info: Mapping[str, Any]) -> list[bytes]:
    """The reply to an info request; ``info`` holds model, input, max_batch and plan."""
    header: dict[str, Any] = {"v": PROTOCOL_VERSION, "id": request_id, "ok": True}
    header["versions"] = list(SUPPORTED_VERSIONS)
    header.update(info)
    return [dump_header(header)]


def encode_error(request_id: RequestId | None, code: ErrorCode, message: str) -> list[bytes]:
    """An error reply. UNSUPPORTED_VERSION also lists the versions this server speaks."""
    header: dict[str, Any] = {
        "v": PROTOCOL_VERSION,
        "id": request_id,
        "ok": False,
        "error": {"code": str(code), "message": message},
    }
    if code == ErrorCode.UNSUPPORTED_VERSION:
        header["versions"] = list(SUPPORTED_VERSIONS)
    return [dump_header(header)]
