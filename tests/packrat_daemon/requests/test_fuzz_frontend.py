"""A live daemon under generated and mutated messages: it stays up, answers each exactly once with a typed
reply, is still correct on a reference input, and its memory stays within the frontend's documented bound
(docs/protocol.md, section 10). bench/faults.py runs the same generator for 10 000 messages."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import numpy as np
import pytest
import torch

from packrat_daemon.requests.frontend import RECEIVE_HWM
from packrat_daemon.wire.client import Client
from tests.helpers.daemons import running_daemon
from tests.helpers.fuzz_frontend import Model, PeakRss, fuzz
from workers.models.loading import load_model

MODEL = "builtin:tiny-mlp"
CI_EXAMPLES = 600


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, subprocess.Popen]]:
    tmp = tmp_path_factory.mktemp("fuzz")
    args = ["--model", MODEL, "--policy", "fixed", "--plan", "1x4", "--max-batch", "4", "--max-delay-ms", "1"]
    with running_daemon(tmp, *args) as served:
        yield served


@pytest.mark.slow
def test_generated_messages_leave_the_daemon_up_correct_and_within_its_memory_bound(
    daemon: tuple[str, subprocess.Popen],
) -> None:
    endpoint, process = daemon
    with Client(endpoint, timeout=30) as client:
        info = client.info()
    limits = info["limits"]
    model = Model(info["input"]["dtype"], tuple(info["input"]["shape"]), info["max_batch"], limits["max_message_bytes"])
    x = np.random.default_rng(12).standard_normal((3, *model.sample_shape), dtype=np.float32)
    with Client(endpoint, timeout=30) as client:
        client.infer(x)  # warm: the first batch's allocations are not the fuzz's
    rss = PeakRss(process.pid)
    before = rss.peak
    stats = fuzz(endpoint, model, CI_EXAMPLES)
    peak = rss.stop()
    assert process.poll() is None, "the daemon exited"
    assert stats.sent == stats.replies == CI_EXAMPLES
    assert stats.ok and stats.codes["BAD_REQUEST"] and stats.codes["TOO_LARGE"]  # the generator reaches them
    # The documented bound for one client: RECEIVE_HWM + 1 messages of at most 3 frames of max_frame_bytes.
    bound = (RECEIVE_HWM + 1) * 3 * limits["max_frame_bytes"]
    assert peak - before <= bound, f"RSS grew by {peak - before} bytes; the bound is {bound}"
    with Client(endpoint, timeout=30) as client:
        served = client.infer(x)
    with torch.inference_mode():
        expected = load_model(MODEL).module(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(served, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_the_generator_reaches_every_kind_of_message() -> None:
    # Without a daemon: the strategies themselves draw good, mutated, REQ-style and many-frame messages.
    from hypothesis import given, settings

    from tests.helpers.fuzz_frontend import messages

    model = Model("float32", (16,), 4, 70_000)
    seen: set[str] = set()

    @settings(max_examples=300, derandomize=True, database=None, deadline=None)
    @given(messages(model))
    def draw(frames: list[bytes]) -> None:
        if frames[0] == b"":
            seen.add("delimiter")
        if len(frames) > 3:
            seen.add("many frames")
        if any(len(f) > model.max_message_bytes for f in frames):
            seen.add("over the limit")
        if frames[0].startswith(b'{"v": 1') and len(frames) == 2 and len(frames[1]) == 64:
            seen.add("well formed")

    draw()
    assert seen == {"delimiter", "many frames", "over the limit", "well formed"}
