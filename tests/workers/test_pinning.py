"""pin_process pins every thread of the process, in a child process so this one stays unpinned."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
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


def test_pin_process_pins_the_openmp_pool_threads() -> None:
    # The case that matters: torch's intra-op pool exists before a reconfiguration re-pins the worker.
    setup = "import torch\ntorch.set_num_threads(2)\ntorch.randn(256, 256) @ torch.randn(256, 256)"
    masks = masks_after_pinning(setup)
    assert len(masks) >= 6, masks  # main + at least one pool thread + 4 Python threads
    assert set(masks.values()) == {"0"}, masks
