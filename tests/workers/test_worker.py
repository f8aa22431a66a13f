"""A worker's job, in this process: what it answers when its own shared memory cannot be had."""

from __future__ import annotations

import errno
from typing import Any

import numpy as np
import pytest

from workers import messages
from workers.arena import SHARED_MIN_BYTES, Arena, Location
from workers.worker import SharedTensors, _run_job


class Doubler:
    def timed_run(self, batch: np.ndarray) -> tuple[np.ndarray, float]:
        return batch * 2, 1.0


def test_a_shared_job_whose_output_arena_cannot_grow_answers_with_a_frame(monkeypatch: pytest.MonkeyPatch) -> None:
    # Before: the OSError of a full descriptor table killed the worker, and the slice was re-sent.
    daemon_inputs, shared = Arena("test-daemon-in"), SharedTensors(99)
    try:
        x = np.ones((2, SHARED_MIN_BYTES // 4), dtype=np.float32)
        location = daemon_inputs.write([memoryview(x).cast("B")], x.nbytes)
        header: dict[str, Any] = {"job": 5, "dtype": "float32", "shape": list(x.shape), "offset": 0}
        header.update(zip(messages.ARENA_FIELDS, location, strict=True))

        def no_descriptors(frames: Any, nbytes: int) -> Location:
            raise OSError(errno.EMFILE, "Too many open files")

        monkeypatch.setattr(shared.output, "write", no_descriptors)
        reply = _run_job(Doubler(), messages.RUN_SHARED, header, [], 1, shared)  # type: ignore[arg-type]
        kind, answer, payload = messages.decode(reply)
        assert kind == messages.RESULT and answer["job"] == 5
        assert bytes(payload[0]) == (x * 2).tobytes()
    finally:
        shared.close()
        daemon_inputs.close()
