"""The template watched on its own: its exit is seen at once (a pidfd a poll reports), the reconciler's every
step checks it, TemplateLost is a fleet failure (not a configuration one), and no worker outlives it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import zmq

from packrat_daemon.fleet import backend as backend_module
from packrat_daemon.fleet.backend import Backend, TemplateError, TemplateLost
from packrat_daemon.fleet.exits import exit_description
from packrat_daemon.fleet.pool import Pool
from packrat_daemon.fleet.reconciler import Reconciler
from packrat_daemon.wire.errors import ConfigError, PackratError
from policies.base import InstancePlan, Plan
from policies.planning.topology import Topology

REAL_POPEN = subprocess.Popen


@pytest.fixture
def backend(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Backend]:
    """A Backend whose "template" is a process that only sleeps (no torch, no model)."""

    def stand_in(command: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        return REAL_POPEN([sys.executable, "-c", "import time; time.sleep(60)"])

    monkeypatch.setattr(backend_module.subprocess, "Popen", stand_in)
    context = zmq.Context()
    made = Backend(context, str(tmp_path / "run"))
    made.start_template("builtin:tiny-mlp")
    yield made
    if made.template is not None and made.template.poll() is None:
        made.template.kill()
    made.close()
    context.term()


def _killed(backend: Backend) -> None:
    assert backend.template is not None
    os.kill(backend.template.pid, signal.SIGKILL)


def test_the_template_fd_is_readable_the_moment_the_template_dies(backend: Backend) -> None:
    fd = backend.template_fd
    assert fd is not None
    assert zmq.zmq_poll([(fd, zmq.POLLIN)], 50) == []  # alive: nothing to report
    backend.check_template()
    _killed(backend)
    assert zmq.zmq_poll([(fd, zmq.POLLIN)], 5000) == [(fd, zmq.POLLIN)]
    with pytest.raises(TemplateLost, match=r"template process \(pid \d+\) was killed by SIGKILL.*the daemon stops"):
        backend.check_template()


def test_template_lost_is_a_fleet_failure_not_a_configuration_error() -> None:
    assert issubclass(TemplateLost, TemplateError) and issubclass(TemplateLost, PackratError)
    assert not issubclass(TemplateLost, ConfigError)  # the configuration was fine; a process died
    assert TemplateLost("gone").exit_status == 1  # a restart repairs it: not 2, which systemd does not restart


def test_the_reconciler_stops_at_its_next_step_once_the_template_is_gone(backend: Backend) -> None:
    reconciler = Reconciler(Pool(backend), Topology.synthetic(2))
    reconciler.set_plan(Plan((InstancePlan(1, 1),), "fixed", "one instance"))
    reconciler.step()  # the template lives: a worker is asked for
    _killed(backend)
    assert backend.template is not None
    backend.template.wait(5)
    with pytest.raises(TemplateLost):
        reconciler.step()  # no message will ever come from a dead template and its dead workers


@pytest.mark.parametrize(
    ("code", "said"), [(-9, "was killed by SIGKILL"), (1, "exited with status 1"), (-200, "was killed by signal 200")]
)
def test_an_exit_is_described_by_its_signal_or_status(code: int, said: str) -> None:
    assert exit_description(code) == said


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _wait_for(condition: Any, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return False


@pytest.mark.slow
def test_a_template_killed_takes_its_stopped_workers_with_it_and_the_daemon_stops_saying_why(tmp_path: Path) -> None:
    from tests.helpers.daemons import running_daemon

    args = ("--model", "builtin:tiny-mlp", "--policy", "fixed", "--plan", "2*1x2", "--max-batch", "4")
    with running_daemon(tmp_path, *args) as (_, process):
        template = next(
            p for p in psutil.Process(process.pid).children() if "workers.template" in " ".join(p.cmdline())
        )
        workers = template.children()
        assert len(workers) == 2
        os.kill(workers[0].pid, signal.SIGSTOP)  # a stopped worker receives no SIGTERM: it would be left an orphan
        os.kill(template.pid, signal.SIGKILL)
        assert _wait_for(lambda: all(_gone(w.pid) for w in workers), 10), "a worker outlived its template"
        process.wait(30)
    assert process.returncode == 1  # as a crash: systemd's Restart=on-failure starts it afresh (2 would not)
    log = (tmp_path / "daemon.log").read_text()
    assert "killed by SIGKILL" in log and "template process" in log
