"""`reload.reload`, in-process: re-read, re-check, re-plan, apply, hand over; or, on a configuration that cannot
be planned, nothing changed and nothing handed over. (A real daemon's SIGHUP: test_reload.py.)"""

from __future__ import annotations

import logging
from typing import Any, cast

import pytest

from packrat_daemon import reload
from packrat_daemon.config import ServeConfig
from packrat_daemon.measure.profiling import ProfileFile
from packrat_daemon.ops.notify import Watchdog
from packrat_daemon.requests.batcher import Batcher
from policies.planning.topology import Topology


def owners() -> reload.Owners:
    # Only the batcher's settings change below: the other owners are never called.
    unused = cast(Any, None)
    return reload.Owners(Batcher(4, 0.001, 1024), unused, Watchdog(None, 600.0), unused, ProfileFile(None))


def serving(fresh: ServeConfig, handed: list[reload.Replanned]) -> reload.Serving:
    running = ServeConfig(model="builtin:tiny-mlp", policy="fixed", plan="2*1x2", max_batch=4)
    return reload.Serving(running, "torch", None, Topology.synthetic(2), lambda: fresh, handed.append)


def test_a_reload_re_reads_re_checks_re_plans_applies_and_hands_the_plan_over(caplog: pytest.LogCaptureFixture) -> None:
    fresh = ServeConfig(model="builtin:other", policy="fixed", plan="2x4", max_batch=4, max_queue=8)
    handed: list[reload.Replanned] = []
    parts = owners()
    with caplog.at_level(logging.INFO, logger="packrat.daemon"):
        new = reload.reload(serving(fresh, handed), parts)
    assert new is not None and handed == [new] and new.config is fresh
    assert fresh.model == "builtin:tiny-mlp"  # restart-only: kept back (accept)
    assert parts.batcher.max_queued_inputs == 8 and new.plan.thread_counts == [2]
    said = caplog.text
    assert said.index("reload: model changed") < said.index("reload: max_queue") < said.index("reload: plan ")


def test_a_reload_that_cannot_be_planned_changes_nothing_and_hands_nothing_over(
    caplog: pytest.LogCaptureFixture,
) -> None:
    fresh = ServeConfig(model="builtin:tiny-mlp", policy="fixed", plan="9x4", max_batch=4, max_queue=8)
    handed: list[reload.Replanned] = []
    parts = owners()
    with caplog.at_level(logging.INFO, logger="packrat.daemon"):
        assert reload.reload(serving(fresh, handed), parts) is None
    assert handed == [] and parts.batcher.max_queued_inputs == 1024
    assert "reload failed, still serving the current plan: " in caplog.text and "needs 9 cores" in caplog.text
