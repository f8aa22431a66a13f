"""Issue 27's attacks on the control parser, reload, signals, bad inputs, a hanging model and a client that leaves
(items 1, 3, 7, 8, 9, 12, 13): more scenarios of
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
from packrat_daemon.wire.client_side import encode_infer_request
from packrat_daemon.wire.codec import MAX_TIMEOUT_MS

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
    # Where the time goes: every batch that held a poisoned input failed, and each poisoned request ran once more
    # alone to be told from its neighbours; batches take the clients' requests in turn, so the innocent's wait for
    # about a batch of that, not for all of it.
    failed = [line for line in daemon.log_tail(400_000).splitlines() if "failed a batch" in line]
    stamps = [time.mktime(time.strptime(line[:19], "%Y-%m-%d %H:%M:%S")) + int(line[20:23]) / 1000 for line in failed]
    result["failed_runs"] = len(failed)  # batches and requests alone that raised
    result["failed_runs_span_s"] = round(stamps[-1] - stamps[0], 2) if stamps else 0.0
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


# -- item 9: a model that hangs on some inputs ---------------------------------------------------------------------
def hanging_model(folder: Path, marked: int = 4) -> dict[str, Any]:
    """A busy hang on marked inputs, `--policy fixed` without a profile (the slice deadline is the job timeout, set to
    1 s here): a second client sends `marked` hanging requests one after another while the innocent one serves."""
    model = "tests.model_factories:hangs_on_marked_inputs"
    daemon = Daemon("hang", folder, ["--model", model, "--policy", "fixed", "--plan", "2*1x2", "--max-batch", "4",
                                     "--max-delay-ms", "5", "--job-timeout-s", "1", "--no-adapt"])  # fmt: skip
    daemon.wait()
    innocent = Innocent(daemon, concurrency=2, predicted_s=0.02)
    outcomes: Counter[str] = Counter()
    answered_after: list[float] = []
    with Client(daemon.endpoint, timeout=60) as attacker:
        for _ in range(marked):
            sent = time.monotonic()
            try:
                attacker.infer(np.full((1, 16), -5000.0, np.float32))
                outcomes["result"] += 1
            except Exception as exc:  # the typed error it must get, or a client timeout (lost)
                outcomes["lost" if type(exc).__name__ == "ClientTimeout" else type(exc).__name__] += 1
            answered_after.append(round(time.monotonic() - sent, 2))
    time.sleep(1.0)
    result = {**innocent.finish(), "marked_requests": dict(outcomes), "marked_answered_after_s": answered_after,
              "alive": daemon.process.poll() is None}  # fmt: skip
    log = daemon.log_tail(200_000)
    result["log_hangs"] = log.count("the batch is given up")
    result["workers_started"] = log.count(" ready: ")
    daemon.close()
    result["checks"] = {"alive": result["alive"], "no_innocent_failed": not result["typed_errors"],
                        "none_lost": result["lost"] == 0 and outcomes["lost"] == 0,
                        "marked_answered_internal": outcomes["InternalError"] == marked}  # fmt: skip
    return result


# -- item 13: a client that disconnects with work queued -------------------------------------------------------------
def departed_client(folder: Path, requests: int = 64) -> dict[str, Any]:
    """`requests` requests of 16 inputs with the largest timeout_ms from one client, which disconnects once the
    daemon has queued them, while the innocent client serves; the innocent's longest stall after the disconnect."""
    daemon = Daemon("departed", folder, ["--model", "tests.model_factories:slow_mlp", "--policy", "fixed", "--plan",
                                         "1x16", "--max-batch", "16", "--no-adapt"])  # fmt: skip
    daemon.wait()
    innocent = Innocent(daemon, concurrency=2, predicted_s=0.3)
    time.sleep(1.0)
    context = zmq.Context()
    leaver = context.socket(zmq.DEALER)
    leaver.connect(daemon.endpoint)
    x = np.ones((16, 16), np.float32)
    for k in range(requests):
        leaver.send_multipart(encode_infer_request(k, x, timeout_ms=MAX_TIMEOUT_MS))
    deadline = time.monotonic() + 20
    while daemon.client.status()["queue"]["requests"] < requests // 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    queued = daemon.client.status()["queue"]["requests"]
    left = time.monotonic()
    leaver.close(linger=0)
    context.term()
    time.sleep(3.0)
    result = innocent.finish()
    result["longest_innocent_stall_after_disconnect_s"] = round(innocent.load.longest_stall(left, time.monotonic()), 3)
    result["stall_within_target"] = result["longest_innocent_stall_after_disconnect_s"] <= result["stall_target_s"]
    result["queued_when_it_left"] = queued
    log = daemon.log_tail(200_000).splitlines()
    dropped = [line.split(": ", 1)[-1] for line in log if "client(s) that disconnected" in line]
    result["log_dropped"] = dropped
    daemon.close()
    result["checks"] = {"none_lost": result["lost"] == 0, "dropped_logged": bool(dropped),
                        "stall_after_disconnect_within_target": result["stall_within_target"]}  # fmt: skip
    return result


SCENARIOS: dict[str, Callable[[Path], dict[str, Any]]] = {
    "control_nesting": control_nesting,
    "shrink_reload": shrink_reload,
    "poisoned_inputs": poisoned_inputs,
    "signals": signals,
    "status_flood": status_flood,
    "hanging_model": hanging_model,
    "departed_client": departed_client,
}
