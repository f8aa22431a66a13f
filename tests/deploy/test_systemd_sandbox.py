"""The shipped unit's sandbox around a real daemon, under a real systemd.

Without systemd as PID 1, root's user manager does the job: it runs in a private mount namespace (where a
tmpfs over /run/systemd tells it the machine booted with systemd), so nothing outside the test sees it.
It applies the unit's seccomp filter, capability bounds, address families and namespaces as the system
manager does. What it cannot do here is changed by a drop-in, each for a stated reason; the settings that
could stop a daemon serving (the system call filter, W^X, the address families) are all applied.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from packrat_daemon.wire.client import Client
from packrat_daemon.wire.errors import InternalError
from tests.helpers.daemons import stop_process
from workers.models.loading import load_model

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root: only root's user manager may sandbox a service"),
    pytest.mark.skipif(not Path("/lib/systemd/systemd").exists(), reason="systemd is not installed"),
    pytest.mark.skipif(shutil.which("unshare") is None or shutil.which("nsenter") is None, reason="needs util-linux"),
    pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="the reload moves to a 2-thread worker"),
]

UNIT = Path(__file__).resolve().parents[2] / "systemd" / "packrat@.service"
SHIPPED_EXEC = "/opt/packrat/.venv/bin/packrat"

# What a user manager in this test cannot do as the system manager would, and why; all else is as shipped.
DROP_IN = """[Service]
# A user manager has no dynamic users, and would put StateDirectory= in root's home.
DynamicUser=no
StateDirectory=
# These mounts fail with 226/NAMESPACE inside a container whatever the service; they only hide /home and
# make /proc/sys, /sys and the kernel log read-only, which the daemon only reads.
ProtectHome=no
ProtectKernelTunables=no
ProtectKernelLogs=no
# The user manager's notify socket lives in its runtime dir under /tmp here, where a private /tmp would
# hide it (the system manager's is /run/systemd/notify).
PrivateTmp=no
# Pings every second, so the test sees them.
WatchdogSec=2
StandardOutput=append:{logs}/%i.log
StandardError=inherit
"""

Systemctl = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture
def manager(tmp_path: Path) -> Iterator[tuple[Systemctl, Path]]:
    """systemctl for a private user manager, and its runtime dir (where RuntimeDirectory= lands)."""
    packrat = Path(sys.executable).parent / "packrat"
    if not packrat.exists():
        pytest.skip(f"{packrat} is missing: install the checkout into its venv (pip install -e .)")
    runtime = tmp_path / "xdg"
    units = runtime / "systemd" / "user"
    (units / "packrat@.service.d").mkdir(parents=True)
    runtime.chmod(0o700)
    # ExecStart runs this venv's packrat on the configs the test writes (write_config).
    unit = UNIT.read_text().replace(SHIPPED_EXEC, str(packrat)).replace("/etc/packrat/", f"{tmp_path}/")
    (units / "packrat@.service").write_text(unit)
    (units / "packrat@.service.d" / "test.conf").write_text(DROP_IN.format(logs=tmp_path))
    (units / "packrat@wx.service.d").mkdir()
    (units / "packrat@wx.service.d" / "wx.conf").write_text("[Service]\nMemoryDenyWriteExecute=yes\n")
    env = {**os.environ, "XDG_RUNTIME_DIR": str(runtime)}
    # /run/systemd/system is how systemd tells it booted the machine; the tmpfs keeps it in this namespace.
    boot = 'mkdir -p /run/systemd && mount -t tmpfs tmpfs /run/systemd && mkdir /run/systemd/system && exec "$0" --user'
    log = open(tmp_path / "manager.log", "wb")  # noqa: SIM115 - closed below
    process = subprocess.Popen(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", boot, "/lib/systemd/systemd"],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )

    def systemctl(*args: str) -> subprocess.CompletedProcess[str]:
        command = ["nsenter", "-t", str(process.pid), "-m", "systemctl", "--user", "--no-pager", *args]
        return subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)

    try:
        deadline = time.monotonic() + 20
        while systemctl("is-system-running").stdout.strip() not in ("running", "degraded"):
            if process.poll() is not None or time.monotonic() > deadline:
                pytest.skip(f"no user manager could start here: {(tmp_path / 'manager.log').read_text()[-500:]}")
            time.sleep(0.2)
        yield systemctl, runtime
    finally:
        stop_process(process, 60)  # the manager stops its services first
        log.close()


def write_config(tmp_path: Path, runtime: Path, name: str, plan: str) -> str:
    """packrat@NAME's config (ExecStart reads /etc/packrat/NAME.toml, pointed here); its endpoint."""
    endpoint = f"ipc://{runtime}/packrat/{name}/front.ipc"
    (tmp_path / f"{name}.toml").write_text(
        f'model = "builtin:tiny-cnn"\nendpoint = "{endpoint}"\npolicy = "fixed"\nplan = "{plan}"\nmax_batch = 4\n'
        f'run_dir = "{runtime}/packrat/{name}/run"\n'
    )
    return endpoint


def show(systemctl: Systemctl, name: str) -> dict[str, str]:
    output = systemctl("show", f"packrat@{name}", "-p", "ActiveState,SubState,Result,StatusText,MainPID,"
                       "ExecMainStatus,NRestarts,WatchdogTimestampMonotonic").stdout  # fmt: skip
    return dict(line.split("=", 1) for line in output.splitlines())


def wait_until(systemctl: Systemctl, name: str, check: Callable[[dict[str, str]], bool], log: Path) -> dict[str, str]:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        state = show(systemctl, name)
        if check(state):
            return state
        if state["ActiveState"] == "failed":
            break
        time.sleep(0.2)
    raise AssertionError(f"packrat@{name}: {state}\n{log.read_text() if log.exists() else 'no log'}")


def test_the_sandboxed_unit_serves_reloads_pings_and_stops(manager: tuple[Systemctl, Path], tmp_path: Path) -> None:
    systemctl, runtime = manager
    endpoints = {name: write_config(tmp_path, runtime, name, "1x4") for name in ("cnn", "wx")}
    systemctl("daemon-reload")
    assert systemctl("start", "--no-block", "packrat@cnn", "packrat@wx").returncode == 0

    def serving(threads: str) -> Callable[[dict[str, str]], bool]:
        # READY=1 makes it "running"; the reconciler's next step (within 100 ms) says what it serves.
        status = f"serving fixed: 1×⟨{threads}, batch 4⟩ with 1 worker(s)"
        return lambda state: state["SubState"] == "running" and state["StatusText"] == status

    state = {name: wait_until(systemctl, name, serving("1 thread"), tmp_path / f"{name}.log") for name in endpoints}
    # The sandbox is on: a system call filter, no new privileges, no capabilities.
    status = Path(f"/proc/{state['cnn']['MainPID']}/status").read_text()
    assert "\nSeccomp:\t2\n" in status and "\nNoNewPrivs:\t1\n" in status and "\nCapEff:\t0000000000000000\n" in status

    x = np.random.default_rng(0).standard_normal((4, 3, 16, 16)).astype(np.float32)
    with torch.inference_mode():
        expected = load_model("builtin:tiny-cnn").module(torch.from_numpy(x)).numpy()
    with Client(endpoints["cnn"], timeout=60) as client:
        np.testing.assert_allclose(client.infer(x), expected, rtol=1e-5, atol=1e-6)
    # With W^X memory denied, oneDNN cannot compile its convolution kernels: every batch fails.
    with Client(endpoints["wx"], timeout=60) as client, pytest.raises(InternalError, match="the model failed"):
        client.infer(x)
    systemctl("stop", "packrat@wx")

    before = int(show(systemctl, "cnn")["WatchdogTimestampMonotonic"])
    write_config(tmp_path, runtime, "cnn", "2x4")
    assert systemctl("reload", "packrat@cnn").returncode == 0
    after = wait_until(systemctl, "cnn", serving("2 threads"), tmp_path / "cnn.log")
    time.sleep(2.5)  # a ping is due every second
    assert int(show(systemctl, "cnn")["WatchdogTimestampMonotonic"]) > before
    assert after["NRestarts"] == "0"

    # A main loop that stops turning stops the pings: systemd kills the daemon and starts it again.
    os.kill(int(after["MainPID"]), signal.SIGSTOP)
    restarted = serving("2 threads")
    again = wait_until(systemctl, "cnn", lambda s: s["NRestarts"] == "1" and restarted(s), tmp_path / "cnn.log")
    assert again["MainPID"] != after["MainPID"]

    systemctl("stop", "packrat@cnn")
    stopped = show(systemctl, "cnn")
    assert (stopped["ActiveState"], stopped["Result"], stopped["ExecMainStatus"]) == ("inactive", "success", "0")
