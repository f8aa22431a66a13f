"""`measure.contention`: a measurement's on-CPU share from the kernel's schedstat, beside a real CPU hog, and the
record a crowded profile keeps (the start-up profile measured beside a hog: test_startup_beside_a_hog below)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from packrat_daemon.measure import contention
from packrat_daemon.measure.contention import MIN_READY_NS, QUIET_ON_CPU, Contention, Sampler, on_cpu_share
from packrat_daemon.ops.state_document import Entry
from packrat_daemon.ops.state_files import StateError
from policies.planning.profile import Profile
from tests.helpers.daemons import running_daemon

SPIN = "import os, sys, time\nos.sched_setaffinity(0, {int(sys.argv[1])})\nwhile True: pass\n"
HAS_SCHEDSTAT = os.path.exists("/proc/self/schedstat")


@contextmanager
def spinning(cpus: list[int]) -> Iterator[list[int]]:
    """A process spinning on each of `cpus`, pinned there: a real CPU hog. Yields their pids."""
    hogs = [subprocess.Popen([sys.executable, "-c", SPIN, str(cpu)]) for cpu in cpus]
    try:
        yield [hog.pid for hog in hogs]
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()


@pytest.mark.skipif(not HAS_SCHEDSTAT, reason="the kernel keeps no schedstat")
def test_a_process_beside_a_cpu_hog_on_its_core_is_seen_crowded() -> None:
    cpu = min(os.sched_getaffinity(0))
    with spinning([cpu]) as (measured,), spinning([cpu]):  # two spinners on one core: each runs about half the time
        time.sleep(0.2)  # both started
        sampler = Sampler([measured])
        time.sleep(0.5)
        share = sampler.share()
    assert share is not None and share < 0.75 < QUIET_ON_CPU


def test_the_share_is_of_the_ready_time_and_short_stretches_are_not_judged() -> None:
    before = {(1, 1): (100, 0), (1, 2): (0, 0)}
    after = {(1, 1): (100 + 60_000_000, 60_000_000), (1, 3): (20_000_000, 0)}  # 2 ended, 3 started
    assert on_cpu_share(before, after) == pytest.approx(80 / 140)
    assert on_cpu_share(before, {(1, 1): (100 + MIN_READY_NS // 2, 0)}) is None  # a tiny model's cell
    assert on_cpu_share(None, after) is None  # no schedstat


def test_a_profile_with_crowded_cells_is_marked_and_kept_so_in_the_state_file(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(contention, "load_now", lambda: (3.1, 2))
    crowded = Contention.of({(1, 1): 0.97, (2, 1): 0.48, (2, 4): 0.6})
    assert crowded is not None and crowded.contended and (crowded.crowded, crowded.on_cpu) == (2, 0.48)
    assert crowded.describe().startswith("measured while other work ran on its cores: 2 of 3 cell(s) had their "
                                         "workers on a CPU as little as 48% of the time they were ready to run "
                                         "(load 3.1 on 2 CPU(s))")  # fmt: skip
    quiet = Contention.of({(1, 1): 0.99})
    assert quiet is not None and not quiet.contended and Contention.of({}) is None
    profile = Profile.from_latencies({(1, 1): 2.0}, model="m", runtime="torch")
    ident = {"model": "m", "runtime": "torch", "precision": "fp32"}
    entry = Entry(ident, profile, contention=crowded, measured_while="onnxruntime")
    back = Entry.from_json(json.loads(json.dumps(entry.to_json())))
    assert back.contention == crowded and back.measured_while == "onnxruntime"
    assert Entry.from_json({**entry.to_json(), "contention": None}).contention is None  # an older file's entry
    with pytest.raises(StateError, match="contention record"):
        Entry.from_json({**entry.to_json(), "contention": {**crowded.to_json(), "on_cpu": 7}})


# A model whose every call takes tens of milliseconds of one core's time, so each profile cell's workers are ready
# to run for long enough to be judged (MIN_READY_NS).
BUSY = "tests.model_factories:busy_mlp"


@pytest.mark.slow
@pytest.mark.skipif(not HAS_SCHEDSTAT, reason="the kernel keeps no schedstat")
def test_startup_beside_a_hog_flags_the_profile_in_the_log_the_status_and_the_state_file(tmp_path: Path) -> None:
    """The done-when of issue 43: a start-up profile measured beside a real CPU hog (a process spinning on every
    core the daemon measures on) is measured again, then marked, and said so."""
    from packrat_daemon.wire.client import Client

    state = tmp_path / "state"
    cpus = sorted(os.sched_getaffinity(0))
    args = ["--model", BUSY, "--max-batch", "2", "--policy", "packrat", "--state-dir", str(state)]
    with spinning(cpus), running_daemon(tmp_path, *args, timeout=600) as (endpoint, _), Client(endpoint) as client:
        profile = client.status()["profile"]
    log = (tmp_path / "daemon.log").read_text()
    assert "measured while other work ran on its cores" in log, log[-3000:]
    assert profile["contention"]["contended"] and profile["contention"]["on_cpu"] < QUIET_ON_CPU
    saved = json.loads((state / "learned-profile.json").read_text())["entries"]["torch"]["contention"]
    assert saved["crowded"] > 0
