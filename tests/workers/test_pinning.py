"""pin_process pins every thread of the process, in a child process so this one stays unpinned."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(
    not Path("/proc/self/task").is_dir() or 0 not in os.sched_getaffinity(0),
    reason="needs Linux /proc and CPU 0 in this process's affinity mask",
)

# Prints {task id: Cpus_allowed_list} for every thread, read after pinning.
CHILD_TEMPLATE = textwrap.dedent(
    """
    import glob, json, threading
    from workers.pinning import pin_process

    {setup}
    stop = threading.Event()
    early = [threading.Thread(target=stop.wait) for _ in range(3)]
    for thread in early:
        thread.start()
    pin_process({{0}})
    late = threading.Thread(target=stop.wait)  # created after pinning: must inherit the mask
    late.start()
    masks = {{}}
    for status in glob.glob("/proc/self/task/*/status"):
        with open(status) as lines:
            for line in lines:
                if line.startswith("Cpus_allowed_list:"):
                    masks[status.split("/")[4]] = line.split(":", 1)[1].strip()
    stop.set()
    for thread in [*early, late]:
        thread.join()
    print(json.dumps(masks))
    """
)


def masks_after_pinning(setup: str = "") -> dict[str, str]:
    code = CHILD_TEMPLATE.format(setup=setup)
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_pin_process_pins_every_python_thread() -> None:
    masks = masks_after_pinning()
    assert len(masks) >= 5, masks  # main + 3 early + 1 late
    assert set(masks.values()) == {"0"}, masks


@pytest.mark.slow
def test_pin_process_pins_the_openmp_pool_threads() -> None:
    # The case that matters: torch's intra-op pool exists before a reconfiguration re-pins the worker.
    setup = "import torch\ntorch.set_num_threads(2)\ntorch.randn(256, 256) @ torch.randn(256, 256)"
    masks = masks_after_pinning(setup)
    assert len(masks) >= 6, masks  # main + at least one pool thread + 4 Python threads
    assert set(masks.values()) == {"0"}, masks


# A parent that forks a child; the child asks to die with it, then stops itself (as `kill -STOP` would).
ORPHAN_TEMPLATE = textwrap.dedent(
    """
    import os, signal, sys, time
    from workers.pinning import die_with_parent

    parent = os.getpid()
    child = os.fork()
    if child == 0:
        die_with_parent(parent)
        os.kill(os.getpid(), signal.SIGSTOP)
        time.sleep(60)
        os._exit(0)
    print(child, flush=True)
    time.sleep(60)
    """
)


def _state(pid: int) -> str | None:
    """The process's state letter from /proc (R, S, T, Z...), None once it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return None


def _wait_state(pid: int, wanted: set[str | None], timeout_s: float) -> str | None:
    deadline = time.monotonic() + timeout_s
    while (state := _state(pid)) not in wanted and time.monotonic() < deadline:
        time.sleep(0.02)
    return state


def test_a_stopped_child_dies_with_its_parent() -> None:
    # Before: PR_SET_PDEATHSIG with SIGTERM, which a stopped process holds pending: it was left an orphan.
    parent = subprocess.Popen([sys.executable, "-c", ORPHAN_TEMPLATE], cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        assert _wait_state(child, {"T", "t"}, 10) in {"T", "t"}
        parent.kill()
        parent.wait(10)
        assert _wait_state(child, {"Z", None}, 5) in {"Z", None}, "the stopped child outlived its parent"
    finally:
        parent.kill()
        parent.wait()
