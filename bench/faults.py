"""Faults under load, hostile messages and a multipart flood against real daemons; prints JSON.

1. Worker faults: a daemon serves tests/model_factories.py's slow_mlp (a tiny MLP that sleeps 0.3 s a
   batch, so a slice's latency is known and the CPU stays free) on 2 one-thread workers, from a profile
   measured first with `packrat profile`. Under continuous load, workers are SIGKILLed, then SIGSTOPped
   (hung: alive, silent), with serve's default slice hedges and deadlines; before each signal the pool
   is whole again (the last one's worker replaced). Reported: answered, typed errors by code, lost (no
   reply within 30 s), and the longest stall (the longest time without any reply while requests were
   waiting) against the slice's predicted latency.
2. SIGTERM under load, on that daemon and on `--drains` fresh ones: requests keep coming through the
   drain; replies received against requests sent before the daemon stopped reading its socket (it logs
   when, on the machine's monotonic clock), and before the client's socket monitor saw it close.
3. Hostile messages: tests/helpers/fuzz_frontend.py's generator (the fuzz test's) against a
   tiny-mlp daemon; it must stay up, answer every message exactly once, and still be right on a
   reference input.
4. Multipart flood: clients send messages of 3 frames near the frame cap without reading replies; the
   daemon's peak RSS against the bound docs/protocol.md states. Then the gap that bound leaves: one
   message of many frames, which ZeroMQ buffers whole before the daemon can refuse it.
5. Attacks (bench/attacks.py): plan bombs over the control socket, a hostile state folder, the template
   killed, too few file descriptors, CURVE keys changed in place, IPv6 loopback and a worker SIGKILLed;
   each with an innocent client's requests, answers, losses, longest stall and the daemon's peak RSS.

    .venv/bin/python bench/faults.py > bench/results/faults.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
sys.path[:0] = [str(REPO), str(REPO / "bench")]

import numpy as np  # noqa: E402
import zmq  # noqa: E402
from harness import DaemonProcess  # noqa: E402
from innocent import Load  # noqa: E402
from zmq.utils.monitor import recv_monitor_message  # noqa: E402

from packrat_daemon.requests.frontend import RECEIVE_HWM  # noqa: E402
from packrat_daemon.wire.client_side import encode_infer_request  # noqa: E402
from policies.planning.profile import Profile  # noqa: E402
from tests.helpers.fuzz_frontend import Model, PeakRss, fuzz, rss_bytes  # noqa: E402

SLOW = "tests.model_factories:slow_mlp"
MIB = 1 << 20


def pids(daemon: DaemonProcess) -> list[int]:
    return [w["pid"] for w in daemon.client.info(timeout=10)["workers"]]


def whole_pool(daemon: DaemonProcess, size: int, victims: set[int], timeout_s: float = 30.0) -> list[int]:
    """Wait until `size` workers serve and none of them was signalled; their pids. Each fault is then one
    worker of the pool: two hung at once leave no worker to hedge on, whatever the daemon does."""
    deadline = time.monotonic() + timeout_s
    while True:
        live = pids(daemon)
        if (len(live) == size and not victims.intersection(live)) or time.monotonic() > deadline:
            return live
        time.sleep(0.05)


def slow_profile(folder: Path) -> Path:
    """`packrat profile` of the slow model: the predictions the slice deadlines are computed from."""
    profile_path = folder / "slow.csv"
    if not profile_path.exists():
        subprocess.run(
            [sys.executable, "-m", "packrat_daemon", "profile", "--model", SLOW, "--threads", "1", "--batches",
             "1,2,4", "--warmup", "1", "--repeats", "3", "--out", str(profile_path)],
            check=True, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
    return profile_path


def slow_daemon(folder: Path, name: str) -> DaemonProcess:
    args = ["--model", SLOW, "--policy", "fixed", "--plan", "2*1x2", "--max-batch", "4", "--max-delay-ms", "2",
            "--profile", str(slow_profile(folder)), "--no-adapt"]  # serve's slice deadlines and hedges  # fmt: skip
    daemon = DaemonProcess(name, folder, args)
    daemon.wait()
    return daemon


def drains(folder: Path, runs: int) -> list[dict[str, Any]]:
    """`sigterm_under_load` on `runs` fresh daemons, one after another."""
    results = []
    for k in range(runs):
        daemon = slow_daemon(folder, f"drain{k}")
        results.append(sigterm_under_load(daemon))
        daemon.client.close()
    return results


def worker_faults(folder: Path, kills: int, stops: int) -> dict[str, Any]:
    daemon = slow_daemon(folder, "faults")
    profile = Profile.read_csv(slow_profile(folder))
    rng = random.Random(12)
    load = Load(daemon.endpoint, concurrency=4).start()
    time.sleep(2.0)
    size = len(pids(daemon))
    result: dict[str, Any] = {"model": SLOW, "plan": "2*1x2", "max_batch": 4}
    victims: set[int] = set()
    for name, count, signum, every_s in (
        ("sigkill", kills, signal.SIGKILL, 1.0),
        ("sigstop", stops, signal.SIGSTOP, 2.5),
    ):
        start = time.monotonic()
        signalled: list[float] = []
        whole_again: list[float] = []  # seconds from each signal until the pool was whole again
        for _ in range(count):
            victim = rng.choice(whole_pool(daemon, size, victims))
            victims.add(victim)
            signalled.append(time.monotonic())
            os.kill(victim, signum)
            time.sleep(every_s)
            whole_pool(daemon, size, victims)
            whole_again.append(round(time.monotonic() - signalled[-1], 2))
        time.sleep(2.0)
        end = time.monotonic()
        # The longest stall from the last reply before each signal until the next signal.
        stalls = [
            round(load.longest_stall(load.last_reply_before(at), until), 3)
            for at, until in zip(signalled, [*signalled[1:], end][: len(signalled)], strict=True)
        ]
        result[name] = {
            "signals": count,
            **load.summary(start, end),
            "longest_stall_per_signal_s": stalls,
            "pool_whole_again_after_s": whole_again,
        }
    load.stop()
    # Each batch of 4 is split 2 + 2: the slice's predicted latency is the profile's 1-thread, 2-input cell.
    predicted_s = profile.latency(1, 2) / 1000.0
    result["slice_predicted_latency_s"] = round(predicted_s, 3)
    for name in ("sigkill", "sigstop"):
        result[name]["longest_stall_over_predicted"] = round(result[name]["longest_stall_s"] / predicted_s, 2)
    log = daemon.log_path.read_text(errors="replace")
    result["log_presumed_hung"] = [line.split(": ", 1)[-1] for line in log.splitlines() if "presumed hung" in line]
    result["log_exited_unexpectedly"] = log.count("exited unexpectedly")
    result["log_hedged"] = [line.split(": ", 1)[-1] for line in log.splitlines() if "the first answer is used" in line]
    result["drain"] = sigterm_under_load(daemon)
    return result


def sigterm_under_load(daemon: DaemonProcess, in_flight: int = 8) -> dict[str, Any]:
    """Up to `in_flight` requests outstanding, then a SIGTERM, then a request every 2 ms through the drain;
    each one sent before the daemon closed its socket (the client's socket monitor says when) must get a reply."""
    context = zmq.Context.instance()
    socket = context.socket(zmq.DEALER)
    socket.setsockopt(zmq.LINGER, 0)
    monitor = socket.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)
    socket.connect(daemon.endpoint)
    x = np.ones((1, 16), dtype=np.float32)
    sent_open = sent_after = replies = 0
    codes: dict[str, int] = {}
    connected = closed = False
    signalled: float | None = None
    unanswered: set[int] = set()
    sent_at: dict[int, float] = {}  # each request's send time, on the machine's monotonic clock (the daemon's too)
    refused_seen = -1  # how many requests had been sent when the first SHUTTING_DOWN came back
    start = time.monotonic()

    def receive(wait_ms: int) -> None:
        nonlocal replies, refused_seen
        while socket.poll(wait_ms):
            header = json.loads(socket.recv_multipart()[0])
            replies += 1
            unanswered.discard(header["id"])
            code = "ok" if header["ok"] else header["error"]["code"]
            if code == "SHUTTING_DOWN" and refused_seen < 0:
                refused_seen = sent_open + sent_after
            codes[code] = codes.get(code, 0) + 1
            wait_ms = 0

    while daemon.process.poll() is None:
        while monitor.poll(0):
            event = recv_monitor_message(monitor)["event"]
            connected = connected or event == zmq.EVENT_CONNECTED
            closed = closed or (connected and event == zmq.EVENT_DISCONNECTED)
        if signalled is None and time.monotonic() - start > 2.0:
            daemon.process.send_signal(signal.SIGTERM)
            signalled = time.monotonic()
        if signalled is not None or sent_open - replies < in_flight:
            try:
                socket.send_multipart(encode_infer_request(sent_open + sent_after, x), zmq.NOBLOCK, copy=False)
            except zmq.Again:
                pass  # closed, and the client's queue is full: a blocking send would wait for ever
            else:
                sent_at[sent_open + sent_after] = time.monotonic()
                unanswered.add(sent_open + sent_after)
                if closed:
                    sent_after += 1
                else:
                    sent_open += 1
        receive(2)
    receive(500)  # replies still in flight when the process exited
    socket.close()
    monitor.close()
    # The daemon's last call, as it logs it: it answers every request sent before it.
    log = daemon.log_path.read_text(errors="replace").splitlines()
    closing = [line for line in log if "last call at" in line]
    last_call = float(closing[-1].split("monotonic ")[1].split()[0]) if closing else None
    before_stop = [k for k in sent_at if last_call is not None and sent_at[k] < last_call]
    return {
        "requests_sent_before_the_socket_closed": sent_open,
        "replies": replies,
        "by_code": codes,
        "sent_after_the_socket_closed": sent_after,
        # A client that stops sending to this daemon once told SHUTTING_DOWN (docs/protocol.md) loses nothing:
        "sent_before_the_first_shutting_down_reply": refused_seen,
        "unanswered_of_those": sum(1 for k in unanswered if k < refused_seen),
        # The rest were sent in the last moment before the socket closed, racing the close:
        "unanswered_sent_before_close": sum(1 for k in unanswered if k < sent_open),
        # The daemon's own account: requests sent before its last call, and how many of them got no reply.
        "daemon_log": closing[-1].split("last call at ")[-1] if closing else None,
        "sent_before_the_last_call": len(before_stop),
        "unanswered_of_those_sent_before_the_last_call": sum(1 for k in before_stop if k in unanswered),
        "sent_after_the_last_call_before_the_socket_closed": sum(
            1 for k in sent_at if last_call is not None and k < sent_open and sent_at[k] >= last_call
        ),
        "exit_code": daemon.process.returncode,
        "exit_after_sigterm_s": round(time.monotonic() - (signalled or start), 2),
    }


def hostile(folder: Path, fuzz_messages: int, flood_clients: int, flood_messages: int, gap_frames: int) -> dict:
    # The runtime pinned: under auto the daemon serves torch first and may move to the runtime it measures fastest
    # meanwhile, whose floats differ in the last bits from the reference's.
    args = ["--model", "builtin:tiny-mlp", "--policy", "fixed", "--plan", "1x4", "--max-batch", "4",
            "--runtime", "torch", "--precision", "fp32"]  # fmt: skip
    daemon = DaemonProcess("hostile", folder, args)
    info = daemon.wait()
    limits = info["limits"]
    model = Model(info["input"]["dtype"], tuple(info["input"]["shape"]), info["max_batch"], limits["max_message_bytes"])
    x = np.random.default_rng(12).standard_normal((3, 16), dtype=np.float32)
    reference = daemon.client.infer(x)
    pid = daemon.process.pid
    result: dict[str, Any] = {"model": "builtin:tiny-mlp", "limits": limits}

    rss = PeakRss(pid)
    before = rss.peak
    stats = fuzz(daemon.endpoint, model, fuzz_messages, derandomize=False)
    result["fuzz"] = {
        **stats.to_json(),
        "alive": daemon.process.poll() is None,
        "reference_unchanged": bool(np.array_equal(daemon.client.infer(x), reference)),
        "rss_before_mib": round(before / MIB, 1),
        "rss_peak_growth_mib": round((rss.stop() - before) / MIB, 1),
        "internal_errors_logged": daemon.log_path.read_text(errors="replace").count("internal error on a message"),
    }

    # The flood: each client sends header + 2 frames of just under the frame cap, without reading replies.
    frame = bytes(limits["max_frame_bytes"] - 1024)
    head = json.dumps({"v": 1, "id": 1, "op": "infer", "dtype": "float32", "shape": [1, 16]}).encode()
    context = zmq.Context.instance()
    sockets = []
    for _ in range(flood_clients):
        s = context.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.SNDHWM, 0)
        s.connect(daemon.endpoint)
        sockets.append(s)
    rss = PeakRss(pid)
    before = rss.peak

    def send_all(socket: zmq.Socket) -> None:
        for _ in range(flood_messages):
            socket.send_multipart([head, frame, frame])

    senders = [threading.Thread(target=send_all, args=(s,)) for s in sockets]
    for t in senders:
        t.start()
    for t in senders:
        t.join()
    answered = 0
    deadline = time.monotonic() + 60
    while answered < flood_clients * flood_messages and time.monotonic() < deadline:
        for s in sockets:
            while s.poll(0):
                s.recv_multipart()
                answered += 1
        time.sleep(0.01)
    peak = rss.stop()
    bound = flood_clients * (RECEIVE_HWM + 1) * 3 * limits["max_frame_bytes"]
    result["flood"] = {
        "clients": flood_clients,
        "messages_each": flood_messages,
        "message_bytes": len(head) + 2 * len(frame),
        "sent_mib": round(flood_clients * flood_messages * (len(head) + 2 * len(frame)) / MIB, 1),
        "answered": answered,
        "rss_before_mib": round(before / MIB, 1),
        "rss_peak_growth_mib": round((peak - before) / MIB, 1),
        "documented_bound_mib": round(bound / MIB, 1),
        "within_bound": peak - before <= bound,
        "alive": daemon.process.poll() is None,
    }

    # The gap: one message of many frames, each under the cap. ZeroMQ holds all of it before the daemon sees it.
    rss = PeakRss(pid)
    before = rss.peak
    sockets[0].send_multipart([head, *[frame] * gap_frames])
    got = sockets[0].poll(60_000)
    reply = json.loads(sockets[0].recv_multipart()[0]) if got else None
    time.sleep(0.5)
    peak = rss.stop()
    result["many_frames"] = {
        "frames": gap_frames + 1,
        "message_mib": round((len(head) + gap_frames * len(frame)) / MIB, 1),
        "reply_code": None if reply is None else reply["error"]["code"],
        "rss_peak_growth_mib": round((peak - before) / MIB, 1),
        "rss_after_mib": round(rss_bytes(pid) / MIB, 1),
        "alive": daemon.process.poll() is None,
    }
    for s in sockets:
        s.close()
    result["reference_unchanged_at_end"] = bool(np.array_equal(daemon.client.infer(x), reference))
    daemon.close()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--stops", type=int, default=10)
    parser.add_argument("--drains", type=int, default=6, help="SIGTERM runs on fresh daemons, after the faults run's")
    parser.add_argument("--fuzz", type=int, default=10_000)
    parser.add_argument("--flood-clients", type=int, default=8)
    parser.add_argument("--flood-messages", type=int, default=100)
    parser.add_argument("--gap-frames", type=int, default=2000)
    parser.add_argument("--skip", choices=["workers", "drains", "hostile", "attacks"], action="append", default=[])
    parser.add_argument("--attack", action="append", default=[], help="only these of bench/attacks.py (default: all)")
    options = parser.parse_args()
    out: dict[str, Any] = {"machine": {"cpus": len(os.sched_getaffinity(0)), "load_average": os.getloadavg()[0]}}
    with tempfile.TemporaryDirectory() as folder:
        if "workers" not in options.skip:
            out["worker_faults"] = worker_faults(Path(folder), options.kills, options.stops)
        if "drains" not in options.skip:
            out["drains"] = drains(Path(folder), options.drains)
        if "hostile" not in options.skip:
            out["hostile"] = hostile(
                Path(folder), options.fuzz, options.flood_clients, options.flood_messages, options.gap_frames
            )
        if "attacks" not in options.skip:
            import attacks

            out["attacks"] = attacks.run(Path(folder), options.attack)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
