"""A reload's settings: the diff, what a reload keeps until a restart, each live setting handed to its owner
(the real owners, in-process), and a real daemon that takes every live setting through SIGHUP (`slow`)."""

from __future__ import annotations

import json
import logging
import math
import os
import signal
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from packrat_daemon import reload
from packrat_daemon.config import RESTART_ONLY, SETTINGS, ServeConfig
from packrat_daemon.measure.profiling import ProfileFile
from packrat_daemon.ops.logs import JsonFormatter
from packrat_daemon.ops.metrics import Metrics
from packrat_daemon.ops.notify import Watchdog
from packrat_daemon.requests.batcher import Batcher
from packrat_daemon.requests.dispatcher import Dispatcher
from packrat_daemon.wire.client import Client
from tests.helpers.daemons import running_daemon
from tests.packrat_daemon.test_config import SAMPLE, as_toml

LIVE = {setting.name for setting in SETTINGS if setting.reload == "live"}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def answers(address: str, port: int) -> bool:
    try:
        return urllib.request.urlopen(f"http://{address}:{port}/metrics", timeout=10).status == 200
    except (urllib.error.URLError, ConnectionError):
        return False


def until(check: Callable[[], Any], what: str, timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"not within {timeout:.0f} s: {what}")


@pytest.fixture
def root_logging() -> Iterator[None]:
    """The root logger as it was (pytest's capture handlers included): a reload replaces its handler."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def test_changes_are_the_settings_that_differ_in_the_tables_order() -> None:
    old, new = ServeConfig(), ServeConfig(max_queue=8, model="builtin:tiny-mlp", batches=[1, 4])
    assert [(c.name, c.old, c.new) for c in reload.changes(old, new)] == [
        ("model", "builtin:resnet50", "builtin:tiny-mlp"),
        ("max_queue", 1024, 8),
        ("batches", [], [1, 4]),
    ]
    assert str(reload.changes(old, new)[0]) == 'model "builtin:resnet50" → "builtin:tiny-mlp"'
    assert reload.changes(old, ServeConfig()) == []


def test_every_restart_only_setting_keeps_its_running_value_and_says_it_waits(caplog: pytest.LogCaptureFixture) -> None:
    running, fresh = ServeConfig(), ServeConfig(**SAMPLE)  # every setting changed
    with caplog.at_level(logging.WARNING, logger="packrat.daemon"):
        kept = reload.accept(running, fresh, "torch")
    assert [change.name for change in kept] == list(RESTART_ONLY)
    assert all(getattr(fresh, name) == getattr(running, name) for name in RESTART_ONLY)
    assert all(getattr(fresh, name) == SAMPLE[name] for name in LIVE)  # SAMPLE's max_batch shrinks: taken
    for name in RESTART_ONLY:
        assert f"reload: {name} changed; that takes a restart, the running value" in caplog.text


def test_max_batch_never_grows_and_an_emulated_daemon_keeps_its_profile(caplog: pytest.LogCaptureFixture) -> None:
    running = ServeConfig(max_batch=4, profile="a.csv")
    fresh = ServeConfig(max_batch=8, profile="b.csv")
    with caplog.at_level(logging.WARNING, logger="packrat.daemon"):
        kept = reload.accept(running, fresh, "emulated")
    assert (fresh.max_batch, fresh.profile) == (4, "a.csv") and [c.name for c in kept] == ["max_batch", "profile"]
    assert "max_batch can only shrink without a restart; keeping 4" in caplog.text
    assert "the emulated workers wait the profile they started with" in caplog.text
    other = ServeConfig(max_batch=2, profile="b.csv")
    assert reload.accept(running, other, "torch") == [] and (other.max_batch, other.profile) == (2, "b.csv")


def test_every_live_setting_has_exactly_one_owner_and_no_restart_only_one_has_any() -> None:
    owned = [name for _, names in reload.OWNERS.values() for name in names]
    assert sorted(owned) == sorted(LIVE)


@pytest.fixture
def owners() -> Iterator[reload.Owners]:
    dispatcher = Dispatcher(lambda *_: True, None, 120.0, 3.0, 1.0, 1.5, 0.1)  # type: ignore[arg-type]
    metrics = Metrics("builtin:tiny-mlp")
    yield reload.Owners(Batcher(16, 0.001, 1024), dispatcher, Watchdog(None, 600.0), metrics, ProfileFile(None))
    metrics.close()


def test_a_reload_hands_every_live_setting_to_the_object_that_uses_it(
    owners: reload.Owners, root_logging: None, caplog: pytest.LogCaptureFixture
) -> None:
    before, after = free_port(), free_port()
    old = ServeConfig(metrics_port=before)
    owners.metrics.serve(before, "127.0.0.1")
    new = ServeConfig(**{name: SAMPLE[name] for name in LIVE} | {"metrics_port": after, "metrics_address": "127.0.0.2"})
    with caplog.at_level(logging.INFO, logger="packrat.daemon"):
        applied = reload.apply(old, new, owners)
    assert {change.name for change in applied} == LIVE
    batcher, dispatcher = owners.batcher, owners.dispatcher
    assert (batcher.max_batch, batcher.max_delay_s, batcher.max_queued_inputs) == (8, 0.0025, 64)
    assert (dispatcher.job_timeout_s, dispatcher.deadline_margin, dispatcher.deadline_floor_s) == (9.0, 2.5, 0.05)
    assert dispatcher.spin_floor_s == 0.04
    assert (dispatcher.hedge_margin, dispatcher.hedge_floor_s) == (2.0, 0.02)
    assert owners.watchdog.off_plan_bound_s == 60.0 and owners.profiles.path == "saved.csv"
    assert answers("127.0.0.2", after) and not answers("127.0.0.1", after)
    until(lambda: not answers("127.0.0.1", before), "the old metrics endpoint closed")
    root = logging.getLogger()
    assert root.level == logging.DEBUG and isinstance(root.handlers[-1].formatter, JsonFormatter)
    assert "reload: job_timeout_s 120.0 → 9.0" in caplog.text and "(dispatcher)" in caplog.text
    assert "reload: drain_timeout_s 30.0 → 4.0 (stop)" in caplog.text  # read from the configuration at stop


def test_a_metrics_port_in_use_keeps_the_old_endpoint_and_the_other_settings_still_apply(
    owners: reload.Owners, caplog: pytest.LogCaptureFixture
) -> None:
    before = free_port()
    owners.metrics.serve(before, "127.0.0.1")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        old, new = ServeConfig(metrics_port=before), ServeConfig(metrics_port=taken.getsockname()[1], max_queue=8)
        with caplog.at_level(logging.INFO, logger="packrat.daemon"):
            applied = reload.apply(old, new, owners)
    assert [change.name for change in applied] == ["max_queue"] and owners.batcher.max_queued_inputs == 8
    assert new.metrics_port == before and answers("127.0.0.1", before)  # the configuration says what is in force
    assert "not applied (metrics keeps its old values): cannot serve metrics" in caplog.text


@pytest.mark.slow
def test_metrics_move_to_another_address_on_the_same_port_and_stop_at_port_0(owners: reload.Owners) -> None:
    port = free_port()
    owners.metrics.serve(port, "127.0.0.1")
    owners.metrics.rebind(port, "127.0.0.2")  # the old endpoint lets go of the port first
    assert answers("127.0.0.2", port) and not answers("127.0.0.1", port)
    owners.metrics.rebind(0, "127.0.0.2")
    assert owners.metrics.server is None and not answers("127.0.0.2", port)


# -- a real daemon --------------------------------------------------------------------------------------------------

# For batches of 2 on 2 cores: two 1-thread instances (1.0 ms) beat one 2-thread instance (1.2 ms) by 17%, which
# a 5% min_split_gain takes and a 30% one refuses.
PROFILE = "threads,batch,latency_ms\n1,1,1.0\n1,2,1.9\n2,1,0.7\n2,2,1.2\n"


def messages(path: Path) -> list[str]:
    """The log's messages, text lines as they are and JSON lines by their message."""
    lines = path.read_text().splitlines()
    return [json.loads(line)["message"] if line.startswith("{") else line for line in lines]


@pytest.mark.slow
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="plans for two cores")
def test_every_live_setting_changed_through_a_real_sighup_takes_effect(tmp_path: Path) -> None:
    port, moved = free_port(), free_port()
    config, profile, saved = tmp_path / "serve.toml", tmp_path / "profile.csv", tmp_path / "saved.csv"
    profile.write_text(PROFILE)
    settings: dict[str, Any] = {"model": "builtin:tiny-mlp", "policy": "fixed", "plan": "2*1x2", "max_batch": 8}
    settings |= {"split_check_rounds": 0, "metrics_port": port}
    config.write_text(as_toml(settings))
    # The first reload changes all but the settings a plan on a profile shows; the second those.
    first = {
        "plan": "2x4", "max_batch": 4, "max_delay_ms": 3.0, "max_queue": 32, "save_profile": str(saved),
        "adapt": False, "adapt_interval_s": 2.0, "adapt_min_batches": 7, "adapt_cooldown_s": 1.0, "adapt_min_gain": 0.2,
        "job_timeout_s": 9.0, "slice_deadline_margin": 2.5, "slice_deadline_floor_ms": 50.0, "slice_hedge_margin": 2.0,
        "slice_hedge_floor_ms": 20.0, "slice_spin_floor_ms": 40.0, "drain_timeout_s": 12.0,
        "startup_timeout_s": 60.0, "metrics_port": moved, "metrics_address": "127.0.0.2", "log_level": "debug",
        "log_format": "json",
    }  # fmt: skip
    second = {"policy": "packrat", "profile": str(profile), "batches": [2], "min_split_gain": 0.3}
    assert set(first) | set(second) == LIVE  # a new live setting needs its check here
    log = tmp_path / "daemon.log"
    with (
        running_daemon(tmp_path, "--config", str(config)) as (endpoint, process),
        Client(endpoint, timeout=30) as client,
    ):

        def threads() -> list[int]:
            return [worker["threads"] for worker in client.info()["workers"]]

        assert answers("127.0.0.1", port) and threads() == [1, 1]
        config.write_text(as_toml(settings | first | {"split_check_rounds": 3}))  # and one restart-only change
        process.send_signal(signal.SIGHUP)
        until(lambda: client.info()["max_batch"] == 4 and threads() == [2], "the first reload's limit and plan")
        status = client.status()
        assert status["queue"]["max_inputs"] == 32 and status["planning"]["adapt_interval_s"] == 2.0
        assert answers("127.0.0.2", moved) and not answers("127.0.0.1", moved)
        until(lambda: not answers("127.0.0.1", port), "the old metrics endpoint closed")
        x = np.ones((2, 16), dtype=np.float32)
        for _ in range(20):
            client.infer(x)
        config.write_text(as_toml(settings | first | second))
        process.send_signal(signal.SIGHUP)
        until(lambda: client.info()["plan"]["policy"] == "packrat", "the second reload")
        plan = client.info()["plan"]  # planned on the new profile, for batches [2] (not max_batch 4), at 30%
        assert plan["instances"] == [{"threads": 2, "batch": 2}] and math.isclose(plan["predicted_latency_ms"], 1.2)
        assert "under the 30% a split must gain" in plan["reason"]
        status = client.status()
        assert status["planning"]["policy"] == "packrat" and status["planning"]["adapting"] is False  # adapt = false
        for _ in range(30):
            client.infer(x)
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0
    said = "\n".join(messages(log))
    assert "reload: split_check_rounds changed; that takes a restart, the running value 0 stays until then" in said
    # Each change's own line; the checks above show the effect of those a client can see.
    start, between = ServeConfig(**settings), ServeConfig(**settings | first)
    expected = [reload.Change(name, getattr(start, name), value) for name, value in first.items()]
    expected += [reload.Change(name, getattr(between, name), value) for name, value in second.items()]
    assert [str(change) for change in expected if str(change) not in said] == []
    assert "draining: finishing queued requests (up to 12 s)" in said
    assert f"profile with production timings saved to {saved}" in said and saved.exists()
    records = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
    assert any(record["level"] == "debug" and record["logger"] == "packrat.requests" for record in records)
