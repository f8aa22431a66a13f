"""The internal message codec: binary headers for the per-request messages, JSON for the rest."""

from __future__ import annotations

import numpy as np
import pytest

from workers import messages


def test_run_header_round_trips_in_binary() -> None:
    header = {"job": 2**40 + 7, "dtype": "float32", "shape": [3, 224, 224]}
    frames = messages.encode(messages.RUN, header, [b"payload"])
    assert frames[0].startswith(b"run\0")
    assert messages.decode(frames) == (messages.RUN, header, [b"payload"])


def test_result_header_round_trips_in_binary() -> None:
    header = {"job": 9, "dtype": "int64", "shape": [4, 1000], "compute_ms": 12.5, "threads": 2, "batch": 4}
    frames = messages.encode(messages.RESULT, header)
    assert frames[0].startswith(b"result\0")
    kind, decoded, payload = messages.decode(frames)
    assert (kind, decoded, payload) == (messages.RESULT, header, [])


def test_shared_headers_round_trip_in_binary_with_the_arenas_location() -> None:
    where = {"pid": 4_000_000, "fd": 17, "serial": 3, "size": 1 << 33}
    run = {"job": 5, "dtype": "float32", "shape": [16, 3, 224, 224], **where, "offset": 1 << 32}
    result = {"job": 5, "dtype": "float32", "shape": [16, 1000], "compute_ms": 1.5, "threads": 2, "batch": 16, **where}
    for kind, header in ((messages.RUN_SHARED, run), (messages.RESULT_SHARED, result)):
        frames = messages.encode(kind, header)
        assert len(frames) == 1 and frames[0].startswith(kind + b"\0")
        assert messages.decode(frames) == (kind, header, [])


def test_zero_dimensional_and_unusual_shapes_survive() -> None:
    for shape in ([], [1], [2, 0, 5]):
        header = {"job": 1, "dtype": "bool", "shape": shape}
        assert messages.decode(messages.encode(messages.RUN, header))[1] == header


@pytest.mark.parametrize(
    ("kind", "header"),
    [
        (messages.READY, {"worker": 3, "pid": 41, "threads": 2, "cores": [0, 1]}),
        (messages.STOP, {}),
        (messages.FAILED, {"job": 5, "message": "ValueError: a space and a \\u0000 escape"}),
        # A RUN header with other keys than the packed ones falls back to JSON, keeping every key.
        (messages.RUN, {"job": 1, "dtype": "float32", "shape": [1], "note": "extra"}),
    ],
)
def test_other_headers_stay_json(kind: bytes, header: dict) -> None:
    frames = messages.encode(kind, header)
    assert frames[0].startswith(kind + b" ")
    assert messages.decode(frames)[:2] == (kind, header)


def test_numpy_name_matches_dtype_name() -> None:
    for dtype in (np.dtype("float32"), np.dtype(">f4"), np.dtype("uint16"), np.dtype(bool)):
        assert messages.numpy_name(dtype) == dtype.name
        assert messages.numpy_name(dtype) == dtype.name  # remembered the second time
