"""Issue 27's attacks on plans, the state folder, the template, descriptors, CURVE keys and IPv6, as scenarios
of bench/faults.py (`--attack NAME`, every one by default; `--skip attacks` leaves them out).

Each scenario runs real daemons and reports what the issue asks of every one: requests an innocent client
sent meanwhile, answered, lost (no reply within its timeout), the longest stall of that client (the longest
time with a request waiting and no reply) against its target (3x the predicted latency, at least 1 s), the
daemon's peak RSS, and what the attack itself found (`checks`: each true when the daemon held).

    .venv/bin/python bench/faults.py --skip workers --skip drains --skip hostile > bench/results/attacks.json
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import zmq
from harness import REPO, DaemonProcess, free_port, private_state
from innocent import Load

from packrat_daemon.control.server import request as control_request
from packrat_daemon.ops.state import STATE_FILE
from packrat_daemon.wire.client import Client, ClientTimeout
from packrat_daemon.wire.curve import write_key_pair
from packrat_daemon.wire.errors import PackratError
from tests.helpers.fuzz_frontend import PeakRss, rss_bytes

TINY = ["--model", "builtin:tiny-mlp", "--policy", "fixed", "--plan", "1x4", "--max-batch", "4"]
MIB = 1 << 20
# serve's runtime and precision default to auto (measured at start): the scenarios pin what they were written for,
# the eager model, whose Python (a hang, a raise on some inputs) runs as written.
PINNED = ["--runtime", "torch", "--precision", "fp32"]
STALL_FLOOR_S = 1.0  # the innocent client's stall target: 3x its predicted latency, at least this


class Daemon(DaemonProcess):
    """DaemonProcess on any endpoint, optionally under `prlimit` (an open-file limit for the whole tree)."""

    def __init__(self, name: str, folder: Path, args: list[str], endpoint: str | None = None,
                 nofile: str | None = None) -> None:  # fmt: skip
        self.endpoint = endpoint or f"ipc://{folder}/{name}.ipc"
        self.log_path = folder / f"{name}.log"
        prefix = ["prlimit", f"--nofile={nofile}", "--"] if nofile else []
        if "--runtime" not in args and "--config" not in args:
            args = [*args, *PINNED]
        args = private_state(name, folder, args)
        command = [*prefix, sys.executable, "-m", "packrat_daemon", "serve", "--endpoint", self.endpoint, *args]
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
        self.client = Client(self.endpoint, timeout=5.0)

    def exited(self, timeout_s: float = 120.0) -> dict[str, Any]:
        """For a daemon that must refuse to start: its exit code and the error it printed."""
        try:
            self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.close()
        self.client.close()
        errors = [line for line in self.log_tail().splitlines() if "error:" in line]
        return {"exit_code": self.process.returncode, "error": errors[-1][-300:] if errors else None}


class Rss(PeakRss):
    """PeakRss that stops quietly when its process exits (the template scenario's daemon does)."""

    def _run(self) -> None:
        while not self._stop.wait(0.01):
            try:
                self.peak = max(self.peak, rss_bytes(self.pid))
            except (RuntimeError, OSError):
                return


class Innocent:
    """A client serving on while a scenario attacks, and the daemon's peak RSS meanwhile."""

    def __init__(self, daemon: DaemonProcess, concurrency: int = 2, predicted_s: float = 0.01) -> None:
        self.load = Load(daemon.endpoint, concurrency, timeout_s=10.0).start()
        self.rss = Rss(daemon.process.pid)
        self.predicted_s, self.start = predicted_s, time.monotonic()

    def finish(self, until: float | None = None) -> dict[str, Any]:
        """The figures of the requests sent from the start `until` (now): later ones may find no daemon."""
        end = until or time.monotonic()
        self.load.stop()
        summary = self.load.summary(self.start, end)
        target = max(STALL_FLOOR_S, 3 * self.predicted_s)
        return {
            "requests_sent": summary["requests"],
            "answered": summary["answered_ok"] + sum(summary["typed_errors"].values()),
            "lost": summary["lost"],
            "typed_errors": summary["typed_errors"],
            "longest_innocent_stall_s": summary["longest_stall_s"],
            "stall_target_s": target,
            "stall_within_target": summary["longest_stall_s"] <= target,
            "peak_rss_mib": round(self.rss.stop() / MIB, 1),
        }


def _last_call(daemon: DaemonProcess) -> float | None:
    """The daemon's last call, as it logs it on the machine's monotonic clock: it answers every request sent before
    it; what reaches the socket after it may find the socket closed."""
    closing = [line for line in daemon.log_tail(20_000).splitlines() if "last call at monotonic" in line]
    return float(closing[-1].split("monotonic ")[1].split()[0]) if closing else None


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


# -- item 2: plans bounded before they are built ------------------------------------------------------------
def plan_bombs(folder: Path) -> dict[str, Any]:
    control = f"ipc://{folder}/plans-control.ipc"
    daemon = Daemon("plans", folder, [*TINY, "--control", control])
    daemon.wait()
    innocent = Innocent(daemon)
    time.sleep(1.0)
    answers: dict[str, Any] = {}
    for plan in ("1000000000*1x1", "10000000*1x1", "1x100000", "9" * 3000 + "x1"):
        asked = time.monotonic()
        try:
            reply = control_request(control, {"op": "reconfigure", "plan": plan}, 30.0)
            answer: dict[str, Any] = {"refused": None, "done": str(reply.get("done"))[:160]}
        except PackratError as exc:
            answer = {"refused": type(exc).__name__, "message": str(exc)[:160]}
        answer["answered_after_s"] = round(time.monotonic() - asked, 3)
        answers[plan if len(plan) < 40 else f"{plan[:12]}... ({len(plan)} chars)"] = answer
        time.sleep(0.5)
    result = {**innocent.finish(), "plans": answers, "alive": daemon.process.poll() is None}
    result["checks"] = {"every_plan_refused": all(a["refused"] for a in answers.values()), "alive": result["alive"]}
    daemon.close()
    return result


# -- item 6: the state folder held to the run dir's rules -----------------------------------------------------
def _state_start(folder: Path, name: str, state: Path, extra: list[str] | None = None) -> dict[str, Any]:
    daemon = Daemon(name, folder, [*(extra or TINY), "--state-dir", str(state)])
    rss = Rss(daemon.process.pid)
    try:
        info = daemon.wait(600)
    except RuntimeError:
        rss.stop()
        return {"started": False, **daemon.exited(10)}
    deadline = time.monotonic() + 30
    while not (state / STATE_FILE).exists() and time.monotonic() < deadline:
        time.sleep(0.1)  # the first save, once serving
    daemon.close()
    log = daemon.log_path.read_text(errors="replace")
    return {
        "started": True,
        "workers": len(info["workers"]),
        "set_aside": sorted(p.name for p in state.iterdir() if ".set-aside-" in p.name),
        "log": [line.split(": ", 1)[-1][:200] for line in log.splitlines() if "state:" in line],
        "peak_rss_mib": round(rss.stop() / MIB, 1),
        "exit_code": daemon.process.returncode,
    }


def state_folder(folder: Path) -> dict[str, Any]:
    cases: dict[str, Any] = {}
    open_dir = folder / "state-open"
    open_dir.mkdir()
    os.chmod(open_dir, 0o777)
    cases["world_writable_folder"] = _state_start(folder, "state-open", open_dir)
    planted = folder / "state-planted"
    planted.mkdir(mode=0o700)
    victim = folder / "root-only-file"
    victim.write_bytes(b"precious")
    (planted / f".{STATE_FILE}.tmp").symlink_to(victim)
    cases["planted_tmp_link"] = {**_state_start(folder, "state-planted", planted),
                                 "victim_unchanged": victim.read_bytes() == b"precious"}  # fmt: skip
    for name, make in (("deep_json", lambda p: p.write_bytes(b"[" * 100_000)),
                       ("dev_zero_link", lambda p: p.symlink_to("/dev/zero"))):  # fmt: skip
        state = folder / f"state-{name}"
        state.mkdir(mode=0o700)
        make(state / STATE_FILE)
        cases[name] = _state_start(folder, f"state-{name}", state)
    # A plan learned by the packrat policy, then crafted to 1 000 oversubscribed instances.
    crafted = folder / "state-crafted"
    packrat = ["--model", "builtin:tiny-mlp", "--max-batch", "4", "--split-check-rounds", "0"]
    first = _state_start(folder, "state-learn", crafted, packrat)
    path = crafted / STATE_FILE
    if first["started"] and path.exists():
        document = json.loads(path.read_text())
        document["served"]["plan"].update(instances=[{"threads": 1, "batch": 1}] * 1000, oversubscribed=True)
        path.write_text(json.dumps(document))
        cases["crafted_plan_1000_instances"] = _state_start(folder, "state-crafted", crafted, packrat)
    cores = len(os.sched_getaffinity(0))
    return {
        "cases": cases,
        "checks": {
            "world_writable_refused": cases["world_writable_folder"].get("exit_code") == 2,
            "victim_unchanged": cases["planted_tmp_link"]["victim_unchanged"],
            "deep_json_set_aside": cases["deep_json"]["started"] and bool(cases["deep_json"]["set_aside"]),
            "dev_zero_set_aside": cases["dev_zero_link"]["started"] and bool(cases["dev_zero_link"]["set_aside"]),
            "crafted_plan_refused": cases.get("crafted_plan_1000_instances", {}).get("workers", 10**6) <= cores,
        },
    }


# -- item 4: the template killed -------------------------------------------------------------------------------
def template_kill(folder: Path) -> dict[str, Any]:
    daemon = Daemon("template", folder, ["--model", "builtin:tiny-mlp", "--policy", "fixed", "--plan", "2*1x2",
                                         "--max-batch", "4"])  # fmt: skip
    info = daemon.wait()
    workers = [w["pid"] for w in info["workers"]]
    innocent = Innocent(daemon)
    time.sleep(1.0)
    os.kill(workers[0], signal.SIGSTOP)  # a stopped worker ignores every signal but SIGKILL: no orphan allowed
    killed = time.monotonic()
    os.kill(info["template_pid"], signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        daemon.process.wait(60)
    exited_after = time.monotonic() - killed
    time.sleep(1.0)
    # Counted: what was sent before the daemon's last call, which it promises to answer (as the drains count).
    # After it (and a grace of 50 ms) it saves its state and stops its workers before it exits, a few
    # hundred ms with the socket closed: a request sent then is never read (the 2 "lost" of an earlier count,
    # whose cutoff was 0.1 s before the exit, were sent 52 ms after the last call).
    last_call = _last_call(daemon)
    until = killed + exited_after - 0.1 if last_call is None else last_call
    after = [outcome for sent, _, outcome in innocent.load.outcomes if sent > until]
    result = innocent.finish(until=until)
    orphans = [pid for pid in workers if _alive(pid)]
    for pid in orphans:
        os.kill(pid, signal.SIGKILL)
    errors = [line for line in daemon.log_tail().splitlines() if "error:" in line]
    daemon.close()
    result.update(
        sent_after_the_last_call={"requests": len(after), "lost": after.count("lost")},
        exit_code=daemon.process.returncode, exited_after_s=round(exited_after, 2), orphans=len(orphans),
        error=errors[-1][-300:] if errors else None,
    )  # fmt: skip
    result["checks"] = {"exited_non_zero": daemon.process.returncode not in (0, None), "no_orphans": not orphans,
                        "exited_within_5_s": exited_after < 5.0}  # fmt: skip
    return result


# -- item 11: one message of very many frames ------------------------------------------------------------------
_FRAME_BOMB = """
import sys, zmq
socket = zmq.Context().socket(zmq.DEALER)
socket.connect(sys.argv[1])
for _ in range(int(sys.argv[2])):
    socket.send(b"", zmq.SNDMORE)
socket.send(b"")
print("sent", flush=True)
print("answered" if socket.poll(600_000) else "no answer", socket.recv()[:120] if socket.poll(0) else b"", flush=True)
sys.stdin.read()  # hold the connection until told
"""


def frame_bomb(folder: Path, frames: int = 10_000_000) -> dict[str, Any]:
    """One message of `frames` empty frames (a few bytes each on the wire) from another process while the innocent
    client serves: the innocent's longest stall, the daemon's peak RSS, and its RSS after."""
    daemon = Daemon("frames", folder, TINY)
    daemon.wait()
    innocent = Innocent(daemon)
    time.sleep(1.0)
    before = rss_bytes(daemon.process.pid)
    started = time.monotonic()
    attacker = subprocess.Popen([sys.executable, "-c", _FRAME_BOMB, daemon.endpoint, str(frames)],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)  # fmt: skip
    assert attacker.stdout is not None
    attacker.stdout.readline()
    sent_after = time.monotonic() - started
    answer = attacker.stdout.readline().strip()  # the daemon's reply to the message, once it has read it all
    answered_after = time.monotonic() - started
    time.sleep(3.0)
    after = rss_bytes(daemon.process.pid)
    result = {**innocent.finish(), "frames": frames + 1, "attacker_sent_after_s": round(sent_after, 1),
              "answered_after_s": round(answered_after, 1), "answer": answer[:200],
              "rss_before_mib": round(before / MIB, 1), "rss_after_mib": round(after / MIB, 1),
              "alive": daemon.process.poll() is None}  # fmt: skip
    attacker.communicate("", timeout=30)
    daemon.close()
    result["checks"] = {"alive": result["alive"], "none_lost": result["lost"] == 0,
                        "stall_within_target": result["stall_within_target"]}  # fmt: skip
    return result


_FLOOD = """
import sys, zmq
context = zmq.Context()
sockets = []
for _ in range(int(sys.argv[2])):
    socket = context.socket(zmq.DEALER)
    socket.setsockopt(zmq.LINGER, 0)
    socket.connect(sys.argv[1])
    sockets.append(socket)
head = b'{"v":1,"id":"flood","op":"infer","dtype":"float32","shape":[1,16]}'
frame = bytes(int(sys.argv[3]))
print("flooding", flush=True)
sent = turns = 0
while True:
    for socket in sockets:  # never reads a reply; a full queue drops the message here
        try:
            socket.send_multipart([head, frame, frame], zmq.NOBLOCK)
            sent += 1
        except zmq.Again:
            pass
    turns += 1
    if turns % 16 == 0 and __import__("select").select([sys.stdin], [], [], 0)[0]:
        break
print("sent", sent, flush=True)
"""


def frame_bomb_flood(
    folder: Path, frames: int = 10_000_000, flooders: int = 8, frame_bytes: int = 64 * 1024
) -> dict[str, Any]:
    """The frame bomb while `flooders` clients send 3-frame messages as fast as they can and read no reply: while
    the frontend discards the bomb the receive queues have no 64-message mark, so what the flood adds then is
    bounded only by DISCARD_UNBOUNDED_MAX_BYTES over the peak. The check: the peak over the flood's own steady
    RSS stays under the bomb's memory (64 bytes a frame), the flood's 64-message bound and that allowance."""
    from packrat_daemon.requests.frontend import DISCARD_UNBOUNDED_MAX_BYTES, RECEIVE_HWM

    daemon = Daemon("bomb-flood", folder, TINY)
    daemon.wait()
    innocent = Innocent(daemon)
    flood = subprocess.Popen([sys.executable, "-c", _FLOOD, daemon.endpoint, str(flooders), str(frame_bytes)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)  # fmt: skip
    assert flood.stdout is not None and flood.stdin is not None
    flood.stdout.readline()
    time.sleep(3.0)  # the flood's queues full: its steady memory
    steady = rss_bytes(daemon.process.pid)
    innocent.rss.peak = steady  # the peak from here on
    attacker = subprocess.Popen([sys.executable, "-c", _FRAME_BOMB, daemon.endpoint, str(frames)],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)  # fmt: skip
    assert attacker.stdout is not None
    attacker.stdout.readline()
    answer = attacker.stdout.readline().strip()
    time.sleep(2.0)
    flood.stdin.write("stop\n")
    flood.stdin.flush()
    sent = flood.communicate(timeout=60)[0].split()[-1]
    result = innocent.finish()
    attacker.communicate("", timeout=30)
    alive = daemon.process.poll() is None
    daemon.close()
    flood_bound = flooders * (RECEIVE_HWM + 1) * (2 * frame_bytes + 100)
    bound = 64 * frames + flood_bound + DISCARD_UNBOUNDED_MAX_BYTES
    grown = result["peak_rss_mib"] * MIB - steady
    result.update(frames=frames + 1, flood_clients=flooders, flood_message_bytes=2 * frame_bytes,
                  flood_messages_sent=int(sent), answer=answer[:200], flood_steady_rss_mib=round(steady / MIB, 1),
                  grown_over_steady_mib=round(grown / MIB, 1), bound_over_steady_mib=round(bound / MIB, 1),
                  alive=alive)  # fmt: skip
    result["checks"] = {"alive": alive, "none_lost": result["lost"] == 0, "within_bound": grown <= bound}
    return result


# -- item 10: descriptors ------------------------------------------------------------------------------------
def descriptors(folder: Path) -> dict[str, Any]:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]  # what this machine allows: the daemon takes it all
    raised = Daemon("fds-raised", folder, TINY, nofile=f"1024:{hard}")
    raised.wait()
    limits = Path(f"/proc/{raised.process.pid}/limits").read_text().splitlines()
    soft = next(line.split()[3] for line in limits if line.startswith("Max open files"))
    raised.close()
    result: dict[str, Any] = {
        "soft_limit_raised_to": soft,
        "raise_logged": "soft limit raised from 1024" in raised.log_path.read_text(errors="replace"),
    }
    # A hard limit of 128, idle connections taking what is left, then requests big enough for shared memory;
    # on tcp:// (libzmq refuses a connection it has no descriptor for) and on ipc:// (libzmq 4.3's ipc accept
    # asserts on EMFILE and aborts the process: nothing the daemon can catch, only a high limit avoids it).
    for transport in ("tcp", "ipc"):
        endpoint = f"tcp://127.0.0.1:{free_port()}" if transport == "tcp" else None
        result[f"low_limit_{transport}"] = _starved(folder, transport, endpoint)
    result["checks"] = {"raised": soft == str(hard), "tcp_served": result["low_limit_tcp"]["lost"] == 0,
                        "tcp_no_tracebacks": result["low_limit_tcp"]["tracebacks"] == 0}  # fmt: skip
    return result


def _starved(folder: Path, name: str, endpoint: str | None, idle: int = 150, requests: int = 20) -> dict[str, Any]:
    args = ["--model", "tests.model_factories:doubler", "--policy", "fixed", "--plan", "1x4", "--max-batch", "4"]
    daemon = Daemon(f"fds-{name}", folder, args, endpoint=endpoint, nofile="128:128")
    daemon.wait()
    rss = Rss(daemon.process.pid)
    x = np.ones((2, 32768), dtype=np.float32)  # 256 KiB: through the inbox's shared memory
    outcomes: dict[str, int] = {}
    with Client(daemon.endpoint, timeout=2.0) as client:
        client.infer(x)  # connected before the descriptors run out
        context = zmq.Context.instance()
        sockets = []
        for _ in range(idle):
            s = context.socket(zmq.DEALER)
            s.setsockopt(zmq.LINGER, 0)
            s.connect(daemon.endpoint)
            sockets.append(s)
        time.sleep(1.0)
        for k in range(requests):
            try:
                outcome = "ok" if np.array_equal(client.infer(x * k), x * k * 2) else "wrong"
            except ClientTimeout:
                outcome = "lost"
            except PackratError as exc:
                outcome = type(exc).__name__
            outcomes[outcome] = outcomes.get(outcome, 0) + 1
        for s in sockets:
            s.close()
    log = daemon.log_path.read_text(errors="replace")
    alive = daemon.process.poll() is None
    daemon.close()
    return {
        "requests_sent": requests, "answered": requests - outcomes.get("lost", 0), "lost": outcomes.get("lost", 0),
        "outcomes": outcomes, "idle_connections": idle, "alive": alive, "exit_code": daemon.process.returncode,
        "tracebacks": log.count("Traceback"), "no_shared_memory_warnings": log.count("no shared memory"),
        "libzmq_abort": next((line for line in log.splitlines() if "Too many open files (" in line), None),
        "peak_rss_mib": round(rss.stop() / MIB, 1),
    }  # fmt: skip


# -- item 14: CURVE's allowed clients by content, failing closed ----------------------------------------------------
def curve_keys(folder: Path) -> dict[str, Any]:
    keys = folder / "keys"
    for name in ("server", "alice", "mallory"):
        write_key_pair(keys, name)
    allowed = keys / "allowed"
    allowed.mkdir(mode=0o755)
    shutil.copy(keys / "alice.key", allowed / "alice.key")
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    args = [*TINY, "--server-key", str(keys / "server.key_secret"), "--allowed-clients", str(allowed)]
    daemon = Daemon("curve", folder, args, endpoint=endpoint)
    daemon.client.close()
    daemon.client = Client(endpoint, timeout=5.0, key=keys / "alice.key_secret", server_key=keys / "server.key")
    daemon.wait()
    daemon.client.close()

    def admitted(who: str) -> bool:
        with Client(endpoint, timeout=1.5, key=keys / f"{who}.key_secret", server_key=keys / "server.key") as c:
            try:
                c.info()
                return True
            except ClientTimeout:
                return False

    steps: dict[str, dict[str, bool]] = {"start": {w: admitted(w) for w in ("alice", "mallory")}}
    (allowed / "alice.key").write_bytes((keys / "mallory.key").read_bytes())  # overwritten in place
    steps["alice_key_overwritten_with_mallorys"] = {w: admitted(w) for w in ("alice", "mallory")}
    (allowed / "broken.key").write_text("not a key\n")
    steps["a_malformed_key_added"] = {w: admitted(w) for w in ("alice", "mallory") for _ in range(3)}
    (allowed / "broken.key").unlink()
    (allowed / "alice.key").unlink()
    steps["every_key_deleted"] = {w: admitted(w) for w in ("alice", "mallory")}
    log = daemon.log_path.read_text(errors="replace")
    daemon.close()
    errors = sum(1 for line in log.splitlines() if " ERROR " in line and "allowed clients" in line)
    expect = {"start": (True, False), "alice_key_overwritten_with_mallorys": (False, True),
              "a_malformed_key_added": (False, False), "every_key_deleted": (False, False)}  # fmt: skip
    return {
        "steps": steps,
        "allowed_clients_errors_logged": errors,
        "checks": {
            "as_expected": all((steps[s]["alice"], steps[s]["mallory"]) == want for s, want in expect.items()),
            "one_error_per_change": errors == 1,
        },
    }


# -- item 15: IPv6 loopback, and a worker killed named as such ------------------------------------------------------
def ipv6_and_kill(folder: Path) -> dict[str, Any]:
    result: dict[str, Any] = {}
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
            port = probe.getsockname()[1]
    except OSError as exc:
        result["ipv6"] = {"skipped": f"no IPv6 loopback here ({exc})"}
    else:
        daemon = Daemon("ipv6", folder, TINY, endpoint=f"tcp://[::1]:{port}")
        try:
            daemon.wait(300)
            result["ipv6"] = {"answered": daemon.client.infer(np.ones((1, 16), dtype=np.float32)).shape[0] == 1}
        except RuntimeError:
            result["ipv6"] = {"answered": False, **daemon.exited(10)}
        daemon.close()
    daemon = Daemon("killed", folder, ["--model", "builtin:tiny-mlp", "--policy", "fixed", "--plan", "2*1x2",
                                       "--max-batch", "4"])  # fmt: skip
    info = daemon.wait()
    innocent = Innocent(daemon)
    time.sleep(1.0)
    os.kill(info["workers"][0]["pid"], signal.SIGKILL)  # what the OOM killer does
    time.sleep(3.0)
    result["worker_sigkilled"] = innocent.finish()
    lines = daemon.log_path.read_text(errors="replace").splitlines()
    result["worker_sigkilled"]["log"] = [line.split(": ", 1)[-1] for line in lines if "was killed" in line]
    daemon.close()
    result["checks"] = {"ipv6_served": result["ipv6"].get("answered", True),
                        "kill_named": bool(result["worker_sigkilled"]["log"])}  # fmt: skip
    return result


SCENARIOS: dict[str, Callable[[Path], dict[str, Any]]] = {
    "plan_bombs": plan_bombs,
    "state_folder": state_folder,
    "template_kill": template_kill,
    "descriptors": descriptors,
    "curve_keys": curve_keys,
    "ipv6_and_kill": ipv6_and_kill,
    "frame_bomb": frame_bomb,
    "frame_bomb_flood": frame_bomb_flood,
}


def run(folder: Path, names: list[str]) -> dict[str, Any]:
    """The scenarios named (all when empty), each in its own subfolder; one that fails says why."""
    from attacks_gateway import SCENARIOS as GATEWAY  # issue 38: the OIP gateway; it imports this module too
    from attacks_input import SCENARIOS as MORE  # items 1, 3, 7, 8; it imports this module, so loaded here

    out: dict[str, Any] = {}
    scenarios = SCENARIOS | MORE | GATEWAY
    for name in names or list(scenarios):
        place = folder / f"attack-{name}"
        place.mkdir(mode=0o700)
        started = time.monotonic()
        try:
            out[name] = scenarios[name](place)
        except Exception as exc:  # a bench reports a scenario that broke, and runs the others
            out[name] = {"failed": f"{type(exc).__name__}: {exc}"[:500]}
        out[name]["seconds"] = round(time.monotonic() - started, 1)
    return out
