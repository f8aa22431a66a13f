"""Issue 27's attacks on the control parser, reload, signals and bad inputs (items 1, 3, 7, 8, 12): more scenarios of
bench/faults.py's `--attack NAME`, reported as bench/attacks.py's are (requests, answered, lost, the innocent
client's longest stall, peak RSS, and `checks`: each true when the daemon held)."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import zmq
from attacks import Daemon, Innocent

from packrat_daemon.wire.client import AsyncClient, Client

SLOW = ["--model", "tests.model_factories:slow_mlp", "--policy", "fixed", "--plan", "1x8", "--max-batch", "8"]


def _outcomes(endpoint: str, inputs: list[np.ndarray], timeout_s: float = 30.0) -> Counter[str]:
    """Send every input at once from one client; count the outcomes by kind (`lost`: no reply in time)."""

    async def send() -> list[object]:
        async with AsyncClient(endpoint, timeout=timeout_s) as client:
            return await asyncio.gather(*(client.infer(x) for x in inputs), return_exceptions=True)

    kinds = ["result" if isinstance(o, np.ndarray) else type(o).__name__ for o in asyncio.run(send())]
    return Counter("lost" if kind == "ClientTimeout" else kind for kind in kinds)


# -- item 1: the control parser ---------------------------------------------------------------------------------
def control_nesting(folder: Path) -> dict[str, Any]:
    run_dir = folder / "run"
    run_dir.mkdir(mode=0o700)
    daemon = Daemon("control", folder, ["--model", "builtin:tiny-mlp", "--policy", "fixed", "--plan", "1x4",
                                        "--max-batch", "4", "--run-dir", str(run_dir)])  # fmt: skip
    daemon.wait()
    innocent = Innocent(daemon)
    replies = {}
    socket = zmq.Context.instance().socket(zmq.DEALER)
    socket.setsockopt(zmq.LINGER, 0)
    socket.connect(f"ipc://{run_dir}/control.ipc")
    for name, body in (("4000 [", b"[" * 4000), ("4000 {", b"{" * 4000)):
        socket.send(body)
        replies[name] = socket.recv().decode()[:160] if socket.poll(5000) else None
    socket.close()
    time.sleep(0.5)
    result = {**innocent.finish(), "replies": replies, "alive": daemon.process.poll() is None}
    daemon.close()
    tcp = Daemon("control-tcp", folder, ["--model", "builtin:tiny-mlp", "--control", "tcp://127.0.0.1:7123"])
    result["tcp_control"] = tcp.exited()
    result["checks"] = {"alive": result["alive"], "refused": all(r and '"ok": false' in r for r in replies.values()),
                        "tcp_control_refused": result["tcp_control"]["exit_code"] == 2}  # fmt: skip
    return result


# -- item 3: a reload shrinking max_batch under queued requests ------------------------------------------------------
def shrink_reload(folder: Path) -> dict[str, Any]:
    config = folder / "serve.toml"
    settings = 'model = "tests.model_factories:slow_mlp"\npolicy = "fixed"\nsplit_check_rounds = 0\n'
    config.write_text(settings + 'plan = "1x8"\nmax_batch = 8\n')
    daemon = Daemon("shrink", folder, ["--config", str(config)])
    daemon.wait()
    innocent = Innocent(daemon)

    def reload_soon() -> None:
        time.sleep(0.5)  # the 8-input requests are queued behind the batch in flight
        config.write_text(settings + 'plan = "1x2"\nmax_batch = 2\n')
        daemon.process.send_signal(signal.SIGHUP)

    threading.Thread(target=reload_soon, daemon=True).start()
    outcomes = _outcomes(daemon.endpoint, [np.ones((8, 16), np.float32)] * 12)
    time.sleep(0.5)
    result = {**innocent.finish(), "large_requests": dict(outcomes), "alive": daemon.process.poll() is None}
    daemon.close()
    result["checks"] = {"alive": result["alive"], "none_lost": outcomes["lost"] == 0,
                        "too_large_answered": outcomes["TooLarge"] > 0}  # fmt: skip
    return result


# -- item 7: one bad input -----------------------------------------------------------------------------------------
def poisoned_inputs(folder: Path) -> dict[str, Any]:
    model = "tests.model_factories:poisoned_by_large_values"
    daemon = Daemon("poison", folder, ["--model", model, *SLOW[2:], "--max-delay-ms", "20"])
    daemon.wait()
    innocent = Innocent(daemon, concurrency=4, predicted_s=0.02)
    poisoned = _outcomes(daemon.endpoint, [np.full((1, 16), 5000.0, np.float32)] * 100)
    result = {**innocent.finish(), "poisoned_requests": dict(poisoned)}
    daemon.close()
    result["checks"] = {"no_innocent_failed": not result["typed_errors"], "none_lost": result["lost"] == 0,
                        "poisoned_answered_internal": poisoned["InternalError"] == 100}  # fmt: skip
    return result


# -- item 8: signals ---------------------------------------------------------------------------------------------
def signals(folder: Path) -> dict[str, Any]:
    daemon = Daemon("signals", folder, SLOW)
    daemon.wait()
    innocent = Innocent(daemon, predicted_s=0.3)
    time.sleep(1.0)
    survived = {}
    for signum in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGALRM, signal.SIGRTMIN, signal.SIGPIPE):
        daemon.process.send_signal(signum)
        time.sleep(0.5)
        survived[signal.Signals(signum).name] = daemon.process.poll() is None
    sent_quit = time.monotonic()
    daemon.process.send_signal(signal.SIGQUIT)
    with contextlib.suppress(subprocess.TimeoutExpired):
        daemon.process.wait(60)
    result = {**innocent.finish(until=sent_quit), "survived": survived, "sigquit_exit_code": daemon.process.returncode}
    daemon.close()
    result["checks"] = {"survived_all": all(survived.values()), "sigquit_drained": daemon.process.returncode == 0,
                        "none_lost": result["lost"] == 0}  # fmt: skip
    return result


# -- item 12: a status flood on one connection ------------------------------------------------------------------------
def status_flood(folder: Path, seconds: float = 8.0) -> dict[str, Any]:
    daemon = Daemon("status", folder, ["--model", "builtin:tiny-mlp", "--policy", "fixed", "--plan", "1x4",
                                       "--max-batch", "4"])  # fmt: skip
    daemon.wait()
    quiet = Innocent(daemon)
    time.sleep(seconds)
    baseline = quiet.finish()
    innocent, flooded, stop = Innocent(daemon), [0], threading.Event()

    def flood() -> None:
        with Client(daemon.endpoint, timeout=5.0) as client:
            while not stop.is_set():
                client.status()
                flooded[0] += 1

    thread = threading.Thread(target=flood, daemon=True)
    thread.start()
    time.sleep(seconds)
    stop.set()
    result = {**innocent.finish(), "status_replies": flooded[0], "innocent_without_flood": baseline["requests_sent"]}
    thread.join(10)
    daemon.close()
    kept = result["requests_sent"] / max(1, baseline["requests_sent"])
    result["checks"] = {"none_lost": result["lost"] == 0, "kept_half_the_throughput": kept >= 0.5}
    return result


SCENARIOS: dict[str, Callable[[Path], dict[str, Any]]] = {
    "control_nesting": control_nesting,
    "shrink_reload": shrink_reload,
    "poisoned_inputs": poisoned_inputs,
    "signals": signals,
    "status_flood": status_flood,
}
