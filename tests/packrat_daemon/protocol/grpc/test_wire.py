"""`packrat_daemon.protocol.grpc.wire`, the hand parser of ModelInferRequest's framing and the encoder of
ModelInferResponse, checked against the generated protobuf classes (property-based, wire_properties.py) in a
subprocess of its own: its stubs and tritonclient's cannot share one process's protobuf pool."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.helpers.daemons import REPO


@pytest.mark.slow  # 5-7 s: every property of the parser in a process of its own
def test_the_hand_parser_agrees_with_protobuf_and_refuses_what_it_refuses() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tests.packrat_daemon.protocol.grpc.wire_properties"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("ok ") == 8, done.stdout
