"""The finding end to end: a real daemon restarted on a state file whose production estimates were unseen for a
week (a weight underflowed to a denormal, ages of a week and of years, saved a week ago) starts, serves from the
file without measuring, and says nothing of an error. Before the fix its restore raised OverflowError and it hung.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest

from packrat_daemon.ops.state import STATE_FILE
from packrat_daemon.wire.client import Client
from tests.helpers.daemons import running_daemon

DAY = 86400.0


@pytest.mark.slow
def test_a_daemon_whose_state_aged_a_week_starts_and_serves_from_it(tmp_path: Path) -> None:
    state = tmp_path / "state"
    args = ("--model", "builtin:tiny-mlp", "--max-batch", "4", "--state-dir", str(state))
    with running_daemon(tmp_path, *args) as (endpoint, _), Client(endpoint, timeout=30) as client:
        client.infer(np.zeros((2, 16), dtype=np.float32))
    document = json.loads((state / STATE_FILE).read_text())
    document["saved_unix"] = time.time() - 8 * DAY
    document["served"]["production"] = [[1, 1, 0.2, 5e-324, 8 * DAY], [1, 2, 0.3, 1e300, 30 * 366 * DAY],
                                        [1, 4, 0.4, 12.0, -DAY]]  # fmt: skip
    (state / STATE_FILE).write_text(json.dumps(document))
    (tmp_path / "daemon.log").rename(tmp_path / "first.log")
    with running_daemon(tmp_path, *args, timeout=60) as (endpoint, _), Client(endpoint, timeout=30) as client:
        assert client.infer(np.zeros((3, 16), dtype=np.float32)).shape[0] == 3
    log = (tmp_path / "daemon.log").read_text()
    assert "not measured again" in log and "aside" not in log and "Traceback" not in log
