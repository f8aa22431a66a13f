"""Issue 38's findings against the Open Inference Protocol gateway, as more scenarios of bench/faults.py's
`--attack NAME`: each reports requests sent, answered, lost, the innocent client's longest stall, and the
gateway's and the daemon's peak RSS growth (`checks`: each true when the service held).

The daemon is `packrat serve --http-port --grpc-port --metrics-port` on builtin:tiny-mlp (one worker, a fixed
plan), so that the gateway, not the model, is what is measured. The clients are tests/helpers/oip_clients.py's
closed loops: a request is `lost` when its connection closed without a status or a gRPC call was CANCELLED.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from attacks import MIB, PINNED, STALL_FLOOR_S, Innocent, Rss
from harness import REPO, DaemonProcess, free_port, private_state

from tests.helpers.fuzz_frontend import rss_bytes
from tests.helpers.oip_clients import (
    LOST,
    NOT_CONNECTED,
    OK,
    REFUSED,
    Outcomes,
    closed_loops,
    gateway_pid,
    http_status,
    rest_loop,
)

MODEL = "tiny-mlp"
SAMPLE = np.ones((1, 16), np.float32)


class Gateway(DaemonProcess):
    """A tiny-mlp daemon with its gateway (REST, gRPC) and metrics port; `gateway_pid` is the gateway child."""

    def __init__(
        self, name: str, folder: Path, extra: list[str] | None = None, model_args: list[str] | None = None
    ) -> None:
        self.endpoint = f"ipc://{folder}/{name}.ipc"
        self.log_path = folder / f"{name}.log"
        self.http, self.grpc, self.metrics = free_port(), free_port(), free_port()
        args = model_args or ["--model", "builtin:tiny-mlp", "--policy", "fixed", "--plan", "1*1x4", "--max-batch", "4"]
        if model_args is None:
            profile = folder / f"{name}-profile.csv"
            profile.write_text("threads,batch,latency_ms\n1,1,0.2\n1,2,0.3\n1,4,0.4\n")
            args = [*args, "--profile", str(profile)]
        args = [*args, "--http-port", str(self.http), "--grpc-port", str(self.grpc)]
        args += ["--metrics-port", str(self.metrics), *PINNED, *(extra or [])]
        command = [sys.executable, "-m", "packrat_daemon", "serve", "--endpoint", self.endpoint]
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen([*command, *private_state(name, folder, args)], stdout=log,
                                            stderr=subprocess.STDOUT, cwd=REPO)  # fmt: skip
        from packrat_daemon.wire.client import Client

        self.client = Client(self.endpoint, timeout=5.0)

    def wait_ready(self, timeout_s: float = 120.0) -> None:
        deadline = time.monotonic() + timeout_s
        while http_status(self.metrics) != 200 or http_status(self.http, "/v2/health/ready") != 200:
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the daemon did not get ready:\n{self.log_tail()}")
            time.sleep(0.1)

    @property
    def gateway_pid(self) -> int:
        return gateway_pid(self.process.pid)


class Growth:
    """The gateway's and the daemon's peak RSS growth from now until `stop`, in MiB (a process that exits keeps
    the peak it reached)."""

    def __init__(self, daemon: Gateway) -> None:
        self.gateway, self.daemon = Rss(daemon.gateway_pid), Rss(daemon.process.pid)
        self.base = (self.gateway.peak, self.daemon.peak)

    def stop(self) -> dict[str, float]:
        return {
            "gateway_rss_growth_mib": round((self.gateway.stop() - self.base[0]) / MIB, 1),
            "daemon_rss_growth_mib": round((self.daemon.stop() - self.base[1]) / MIB, 1),
        }


def _longest(*outcomes: Outcomes) -> float | None:
    """The longest a client of these waited for an answer, in seconds."""
    return max((max(o.latencies_s) for o in outcomes if o.latencies_s), default=None)


def _summed(runs: list[dict[str, Any]], key: str) -> int:
    return sum(run[protocol][key] for run in runs for protocol in ("rest", "grpc"))


# -- lifecycle ------------------------------------------------------------------------------------------------
def gateway_sigterm(folder: Path, runs: int = 10) -> dict[str, Any]:
    """SIGTERM to `serve` while 6 REST and 6 gRPC clients run closed loops, `runs` times (a fresh daemon each)."""
    results = []
    for run in range(runs):
        daemon = Gateway(f"sigterm-{run}", folder)
        daemon.wait_ready()
        growth = Growth(daemon)
        rest, rpc, stop, threads = closed_loops("127.0.0.1", daemon.http, daemon.grpc, MODEL, SAMPLE, 6, 6)
        time.sleep(1.5)
        daemon.process.send_signal(signal.SIGTERM)
        code = daemon.process.wait(60)
        stop.set()
        for thread in threads:
            thread.join(30)
        daemon.client.close()
        results.append({"rest": rest.to_json(), "grpc": rpc.to_json(), "exit_code": code,
                        "longest_stall_s": _longest(rest, rpc), **growth.stop()})  # fmt: skip
    sent = _summed(results, OK) + _summed(results, REFUSED) + _summed(results, LOST)
    return {
        "runs": runs,
        "requests_sent": sent,
        "answered": _summed(results, OK),
        "refused_503_or_unavailable": _summed(results, REFUSED),
        "not_connected": _summed(results, NOT_CONNECTED),
        "lost": _summed(results, LOST),
        "lost_detail": [d for run in results for p in ("rest", "grpc") for d in run[p]["lost_detail"]][:5],
        "exit_codes": sorted({run["exit_code"] for run in results}),
        "longest_stall_s": max(run["longest_stall_s"] or 0.0 for run in results),
        "gateway_rss_growth_mib": max(run["gateway_rss_growth_mib"] for run in results),
        "daemon_rss_growth_mib": max(run["daemon_rss_growth_mib"] for run in results),
        "checks": {"nothing_lost": _summed(results, LOST) == 0, "exit_0": all(r["exit_code"] == 0 for r in results)},
    }


def gateway_kill(folder: Path) -> dict[str, Any]:
    """The gateway SIGKILLed while ZeroMQ, REST and gRPC clients run: /readyz, the restart, the ZeroMQ client."""
    daemon = Gateway("kill", folder)
    daemon.wait_ready()
    innocent = Innocent(daemon)  # a ZeroMQ client: the daemon's own clients must not notice
    growth = Growth(daemon)  # the gateway's until it is killed, the daemon's throughout
    rest, rpc, stop, threads = closed_loops("127.0.0.1", daemon.http, daemon.grpc, MODEL, SAMPLE, 2, 2)
    time.sleep(1.0)
    killed_at = time.monotonic()
    os.kill(daemon.gateway_pid, signal.SIGKILL)
    seen: list[tuple[float, int | None]] = []
    while time.monotonic() - killed_at < 30:
        seen.append((round(time.monotonic() - killed_at, 3), http_status(daemon.metrics)))
        if seen[-1][1] == 200 and any(status == 503 for _, status in seen):
            break
        time.sleep(0.02)
    stop.set()
    for thread in threads:
        thread.join(30)
    again, stop_again = Outcomes(), threading.Event()
    after = threading.Thread(target=rest_loop, args=("127.0.0.1", daemon.http, MODEL, SAMPLE, again, stop_again))
    after.start()
    time.sleep(1.0)
    stop_again.set()
    after.join(30)
    result = innocent.finish() | growth.stop()
    daemon.close()
    unready = [when for when, status in seen if status == 503]
    back = next((when for when, status in seen if status == 200 and unready and when > unready[0]), None)
    result |= {
        "unready_after_s": unready[0] if unready else None,
        "ready_again_after_s": back,
        "rest_answered_after_restart": again.counts[OK],
        "clients_of_the_killed_gateway": {"rest": rest.to_json(), "grpc": rpc.to_json()},
    }
    result["checks"] = {
        "unready_within_1s": bool(unready) and unready[0] < 1.0,
        "ready_again": back is not None,
        "zeromq_clients_untouched": result["lost"] == 0 and not result["typed_errors"],
        "rest_serves_again": again.counts[OK] > 0 and again.counts[LOST] == 0,
    }
    return result


def gateway_ports_taken(folder: Path) -> dict[str, Any]:
    """Each port (ZeroMQ, REST, gRPC held by a server with SO_REUSEPORT, metrics) taken: exit code and message."""
    from concurrent import futures

    import grpc

    out: dict[str, Any] = {}
    for which in ("zeromq", "rest", "grpc", "metrics"):
        port, holder, plain = free_port(), None, socket.socket()
        if which == "grpc":
            holder = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
            holder.add_insecure_port(f"127.0.0.1:{port}")
            holder.start()
        else:
            plain.bind(("127.0.0.1", port))
            plain.listen()
        flag = {"rest": "--http-port", "grpc": "--grpc-port", "metrics": "--metrics-port"}.get(which)
        endpoint = f"tcp://127.0.0.1:{port}" if which == "zeromq" else f"ipc://{folder}/{which}.ipc"
        extra = [] if flag is None else [flag, str(port)]
        extra += [] if which == "rest" else ["--http-port", str(free_port())]
        command = [sys.executable, "-m", "packrat_daemon", "serve", "--endpoint", endpoint, "--model",
                   "builtin:tiny-mlp", "--state-dir", str(folder / f"{which}.state"), *PINNED, *extra]  # fmt: skip
        started = time.monotonic()
        done = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=REPO)
        plain.close()
        if holder is not None:
            holder.stop(None)
        last = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else ""
        out[which] = {"exit_code": done.returncode, "seconds": round(time.monotonic() - started, 2),
                      "error": last[-300:], "names_the_port": str(port) in last,
                      "traceback": "Traceback" in done.stderr}  # fmt: skip
    out["checks"] = {which: r["exit_code"] == 2 and r["names_the_port"] and not r["traceback"]
                     for which, r in out.items()}  # fmt: skip
    return out


def gateway_figures(daemon: Gateway, innocent: Outcomes, predicted_s: float = 0.01) -> dict[str, Any]:
    """The innocent REST client's figures, in the shape bench/attacks.py's scenarios report."""
    target = max(STALL_FLOOR_S, 3 * predicted_s)
    longest = max(innocent.latencies_s, default=None)
    return {
        "requests_sent": sum(innocent.counts.values()),
        "answered": innocent.counts[OK] + innocent.counts[REFUSED],
        "lost": innocent.counts[LOST],
        "longest_innocent_stall_s": None if longest is None else round(longest, 3),
        "stall_target_s": target,
        "stall_within_target": longest is not None and longest <= target,
    }


# -- cancellation ---------------------------------------------------------------------------------------------
SLOW_ARGS = ["--model", "tests.model_factories:slow_mlp", "--policy", "fixed", "--plan", "1*1x8", "--max-batch", "8",
             "--max-queue", "1000"]  # fmt: skip


def _innocent_grpc_latency(target: str, calls: int = 5) -> float:
    """The median latency of `calls` sequential gRPC calls, in seconds."""
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(target)
    tensor = grpcclient.InferInput("input", [1, 16], "FP32")
    tensor.set_data_from_numpy(SAMPLE)
    times = []
    for _ in range(calls):
        started = time.perf_counter()
        client.infer("slow_mlp", [tensor], client_timeout=120)
        times.append(time.perf_counter() - started)
    client.close()
    return float(np.median(times))


def _cancelled_grpc(target: str, calls: int, after_s: float) -> int:
    """Send `calls` gRPC inferences at once and cancel each after `after_s`; how many came back cancelled."""
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(target)
    tensor = grpcclient.InferInput("input", [1, 16], "FP32")
    tensor.set_data_from_numpy(SAMPLE)
    outcomes: list[object] = []
    contexts = [client.async_infer("slow_mlp", [tensor], lambda result, error: outcomes.append(error))
                for _ in range(calls)]  # fmt: skip
    time.sleep(after_s)
    for context in contexts:
        context.cancel()
    deadline = time.monotonic() + 10
    while len(outcomes) < calls and time.monotonic() < deadline:
        time.sleep(0.01)
    client.close()
    return sum(1 for error in outcomes if error is not None and "CANCELLED" in str(error.status()))  # type: ignore[attr-defined]


def _closed_rest(port: int, calls: int, after_s: float) -> None:
    """Open `calls` connections, send an inference on each, close them all after `after_s` without reading."""
    body = json.dumps({"inputs": [{"name": "input", "shape": [1, 16], "datatype": "FP32",
                                   "data": [1.0] * 16}]}).encode()  # fmt: skip
    head = (f"POST /v2/models/slow_mlp/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()  # fmt: skip
    sockets = []
    for _ in range(calls):
        sock = socket.create_connection(("127.0.0.1", port))
        sock.sendall(head + body)
        sockets.append(sock)
    time.sleep(after_s)
    for sock in sockets:
        sock.close()


def gateway_cancel(folder: Path, calls: int = 300, after_s: float = 0.2) -> dict[str, Any]:
    """`calls` gRPC calls cancelled by their client after `after_s`, then `calls` REST connections closed after
    `after_s`: the next innocent call's latency against its latency before (slow_mlp: 0.3 s a batch of up to 8)."""
    daemon = _slow_gateway(folder)
    target = f"127.0.0.1:{daemon.grpc}"
    growth = Growth(daemon)
    before = _innocent_grpc_latency(target)
    cancelled = _cancelled_grpc(target, calls, after_s)
    after_grpc = _innocent_grpc_latency(target, calls=1)
    _closed_rest(daemon.http, calls, after_s)
    after_rest = _innocent_grpc_latency(target, calls=1)
    with urllib.request.urlopen(f"http://127.0.0.1:{daemon.http}/metrics", timeout=10) as reply:
        exposition = reply.read().decode()
    grown = growth.stop()
    daemon.close()
    counted = {line.split("}")[0] + "}": float(line.split()[-1]) for line in exposition.splitlines()
               if line.startswith("packrat_gateway_refusals_total") and 'reason="cancelled"' in line}  # fmt: skip
    return {
        "innocent_before_s": round(before, 3),
        "after_300_grpc_cancelled_s": round(after_grpc, 3),
        "after_300_rest_closed_s": round(after_rest, 3),
        "grpc_calls_cancelled": cancelled,
        "gateway_refusals_cancelled": counted,
        **grown,
        "checks": {"grpc_within_2x": after_grpc <= 2 * before, "rest_within_2x": after_rest <= 2 * before},
    }


def _slow_gateway(folder: Path) -> Gateway:
    profile = folder / "slow-profile.csv"
    profile.write_text("threads,batch,latency_ms\n1,1,300\n1,2,300\n1,4,300\n1,8,300\n")
    daemon = Gateway("slow", folder, ["--profile", str(profile)], model_args=SLOW_ARGS)
    daemon.wait_ready()
    return daemon


def gateway_fairness(folder: Path, seconds: float = 12.0) -> dict[str, Any]:
    """6 REST and 6 gRPC closed-loop clients together on slow_mlp (0.3 s a batch of up to 4): their medians."""
    profile = folder / "fair-profile.csv"
    profile.write_text("threads,batch,latency_ms\n1,1,300\n1,2,300\n1,4,300\n")
    args = ["--model", "tests.model_factories:slow_mlp", "--policy", "fixed", "--plan", "1*1x4", "--max-batch", "4"]
    daemon = Gateway("fair", folder, ["--profile", str(profile)], model_args=args)
    daemon.wait_ready()
    growth = Growth(daemon)
    rest, rpc, stop, threads = closed_loops("127.0.0.1", daemon.http, daemon.grpc, "slow_mlp", SAMPLE, 6, 6)
    time.sleep(seconds)
    stop.set()
    for thread in threads:
        thread.join(30)
    grown = growth.stop()
    daemon.close()
    medians = {"rest": rest.to_json()["median_s"], "grpc": rpc.to_json()["median_s"]}
    ratio = max(medians.values()) / min(medians.values())  # type: ignore[type-var, operator]
    return {
        "answered": {"rest": rest.counts[OK], "grpc": rpc.counts[OK]},
        "lost": rest.counts[LOST] + rpc.counts[LOST],
        "median_s": medians,
        "slower_over_faster": round(ratio, 3),
        "longest_stall_s": _longest(rest, rpc),  # every client's turn comes every third batch: about 0.9 s
        **grown,
        "checks": {"medians_within_1.5x": ratio <= 1.5},
    }


# -- cost per byte and per connection ------------------------------------------------------------------------
# The bound on what each of the three memory attacks may grow a process by, and the metrics port's own
# (docs/oip.md, "Limits": at most 64 connections, each a head of 8 KiB and an answer of tens of KiB).
MEMORY_ATTACK_BOUND_MIB = 256.0
METRICS_BOUND_MIB = 64 * (8 + 64) / 1024


def _under_attack(daemon: Gateway, attack: Callable[[], dict[str, Any]], bound_mib: float,
                  daemon_bound_mib: float = MEMORY_ATTACK_BOUND_MIB) -> dict[str, Any]:  # fmt: skip
    """Run `attack` while an innocent REST client runs a closed loop and both processes' RSS is sampled: the
    innocent's figures, the gateway's and the daemon's peak growth, and what the attack returned."""
    innocent, stop = Outcomes(), threading.Event()
    loop = threading.Thread(target=rest_loop, args=("127.0.0.1", daemon.http, MODEL, SAMPLE, innocent, stop))
    loop.start()
    time.sleep(1.0)  # its connection made and its first requests answered before the attack
    growth = Growth(daemon)
    result = attack()
    time.sleep(0.5)
    gateway_held = round((rss_bytes(daemon.gateway_pid) - growth.base[0]) / MIB, 1)  # what it kept after
    grown = growth.stop()
    gateway_growth, daemon_growth = grown["gateway_rss_growth_mib"], grown["daemon_rss_growth_mib"]
    stop.set()
    loop.join(60)
    figures = gateway_figures(daemon, innocent)
    figures["lost_detail"] = innocent.lost[:3]
    figures |= {"gateway_rss_growth_mib": gateway_growth, "gateway_rss_bound_mib": round(bound_mib, 1),
                "gateway_rss_held_after_mib": gateway_held,
                "daemon_rss_growth_mib": daemon_growth, "daemon_rss_bound_mib": round(daemon_bound_mib, 1)}  # fmt: skip
    checks = {
        "nothing_lost": figures["lost"] == 0,
        "innocent_served_throughout": not _stopped_early(innocent, figures),
        "stall_within_target": figures.pop("stall_within_target"),
        "gateway_rss_within_bound": gateway_growth <= bound_mib,
        "daemon_rss_within_bound": daemon_growth <= daemon_bound_mib,
        **result.pop("checks"),
    }
    return figures | result | {"checks": checks}


def _stopped_early(innocent: Outcomes, figures: dict[str, Any]) -> bool:
    """Whether the innocent client stopped before the attack ended: a refusal or a loss ends its loop."""
    return figures["requests_sent"] == 0 or innocent.counts[REFUSED] > 0 or innocent.counts[LOST] > 0


FIELD_BOMB_MIB = 16


def gateway_grpc_field_bomb(folder: Path, messages: int = 5) -> dict[str, Any]:
    """gRPC ModelInfer of a 16 MiB message made of 2-byte unknown fields (field 15, varint 0), `messages` times,
    as raw bytes: each must be refused INVALID_ARGUMENT at once (85 s of gateway CPU and 2.4 GB before)."""
    import grpc

    bomb = b"\x78\x00" * (FIELD_BOMB_MIB * MIB // 2)
    daemon = Gateway("field-bomb", folder)
    daemon.wait_ready()

    def attack() -> dict[str, Any]:
        channel = grpc.insecure_channel(f"127.0.0.1:{daemon.grpc}", options=[("grpc.max_send_message_length", -1)])
        infer = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer",
                                    request_serializer=None, response_deserializer=None)  # fmt: skip
        answers = []
        for _ in range(messages):
            started = time.perf_counter()
            try:
                infer(bomb, timeout=120)
                code, detail = "OK", ""
            except grpc.RpcError as exc:
                code, detail = exc.code().name, exc.details() or ""  # type: ignore[attr-defined]
            answers.append({"code": code, "seconds": round(time.perf_counter() - started, 3), "detail": detail[:120]})
        channel.close()
        slowest = max(answer["seconds"] for answer in answers)
        return {
            "message_mib": FIELD_BOMB_MIB,
            "messages": messages,
            "codes": sorted({answer["code"] for answer in answers}),
            "answer_s": [answer["seconds"] for answer in answers],
            "detail": answers[0]["detail"],
            "checks": {
                "invalid_argument": all(a["code"] == "INVALID_ARGUMENT" for a in answers),
                "answered_within_1s": slowest <= 1.0,
            },
        }

    try:
        return _under_attack(daemon, attack, MEMORY_ATTACK_BOUND_MIB)
    finally:
        daemon.close()


def _status(sock: socket.socket) -> tuple[int | None, bool]:
    """The status of the answer waiting on `sock` (None: none yet) and whether the server closed it."""
    sock.setblocking(False)  # a socket with a timeout would wait for data first, whatever MSG_DONTWAIT says
    try:
        data = sock.recv(65536)
    except BlockingIOError:
        return None, False
    except OSError:
        return None, True
    if not data:
        return None, True
    line = data.split(b"\r\n", 1)[0].split()
    return (int(line[1]) if len(line) > 1 and line[1].isdigit() else -1), False


def gateway_rest_content_length_flood(folder: Path, connections: int = 3000, hold_s: float = 14.0) -> dict[str, Any]:
    """`connections` connections each sending a head with `Content-Length: 1000000` and 10 bytes of its body,
    held for `hold_s` (3.0 GB of the gateway before): the connection limit answers the excess 503 at once, the
    body's idle timeout (10 s) answers the rest 408, and what they hold is what came."""
    head = (f"POST /v2/models/{MODEL}/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            "Content-Length: 1000000\r\n\r\n").encode() + b'{"inputs":'  # fmt: skip
    daemon = Gateway("content-length", folder)
    daemon.wait_ready()
    limit = 1000  # GatewayLimits.max_connections, the default the harness runs with

    def attack() -> dict[str, Any]:
        sockets, failed = [], 0
        started = time.monotonic()
        for _ in range(connections):
            try:
                sock = socket.create_connection(("127.0.0.1", daemon.http), timeout=10)
                sock.sendall(head)
                sockets.append(sock)
            except OSError:
                failed += 1
        opened_s = time.monotonic() - started
        answered: dict[int, tuple[str, float]] = {}  # each connection's answer (status) and when it came
        while len(answered) < len(sockets) and time.monotonic() - started < hold_s:
            for index, sock in enumerate(sockets):
                if index not in answered:
                    status, closed = _status(sock)
                    if status is not None or closed:
                        answered[index] = (str(status or "closed_without_answer"), time.monotonic() - started)
            time.sleep(0.25)
        held = len(sockets) - len(answered)
        for sock in sockets:
            sock.close()
        answers: dict[str, dict[str, float]] = {}
        for status, when in answered.values():
            seen = answers.setdefault(status, {"count": 0, "first_s": when, "last_s": when})
            seen |= {
                "count": seen["count"] + 1,
                "first_s": min(seen["first_s"], when),
                "last_s": max(seen["last_s"], when),
            }
        for seen in answers.values():
            seen["first_s"], seen["last_s"] = round(seen["first_s"], 1), round(seen["last_s"], 1)
        refused = answers.get("503", {}).get("count", 0)
        return {
            "connections": connections,
            "opened_in_s": round(opened_s, 2),
            "connect_failed": failed,
            "max_connections": limit,
            "accepted": connections - failed - refused,
            "refused_503": refused,
            "answers": answers,  # by status: how many, and the first and last seen (s after the first connection)
            "held_without_answer_at_end": held,
            "checks": {
                "excess_refused_503": refused >= connections - limit,
                "accepted_at_most_the_limit": connections - failed - refused <= limit,
            },
        }

    try:
        return _under_attack(daemon, attack, MEMORY_ATTACK_BOUND_MIB)
    finally:
        daemon.close()


def gateway_rest_head_stream(folder: Path, seconds: float = 40.0, chunk_mib: int = 1) -> dict[str, Any]:
    """One connection streaming one header without end, `chunk_mib` MiB at a time for up to `seconds` or until
    the server answers or closes (101 MiB accepted before, no answer): 431 at `header_bytes` (64 KiB)."""
    import select

    chunk = b"a" * (chunk_mib * MIB)
    daemon = Gateway("head-stream", folder)
    daemon.wait_ready()

    def attack() -> dict[str, Any]:
        sock = socket.create_connection(("127.0.0.1", daemon.http), timeout=10)
        sock.setblocking(False)
        pending = memoryview(f"POST /v2/models/{MODEL}/infer HTTP/1.1\r\nHost: x\r\nX-Long: ".encode())
        sent, status, closed, answer = 0, None, False, b""
        started = time.monotonic()
        while time.monotonic() - started < seconds:
            readable, writable, _ = select.select([sock], [sock], [], 0.5)
            if readable:
                try:
                    answer = sock.recv(65536)
                except OSError:
                    answer = b""
                if answer:
                    line = answer.split(b"\r\n", 1)[0].split()
                    status = int(line[1]) if len(line) > 1 and line[1].isdigit() else -1
                closed = not answer
                break
            if writable:
                try:
                    count = sock.send(pending)
                except OSError:
                    closed = True
                    break
                sent += count
                pending = pending[count:] if count < len(pending) else memoryview(chunk)
        answered_s = time.monotonic() - started
        sock.close()
        return {
            "status": status,
            "closed_without_answer": closed and status is None,
            "answered_after_s": round(answered_s, 3),
            "bytes_sent_before_answer": sent,  # what the kernel took: the server read at most `header_bytes` more
            "answer": answer.split(b"\r\n\r\n", 1)[-1][:120].decode(errors="replace"),
            "checks": {"answered_431": status == 431, "answered_within_1s": answered_s <= 1.0},
        }

    try:
        return _under_attack(daemon, attack, MEMORY_ATTACK_BOUND_MIB)
    finally:
        daemon.close()


def _threads(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    raise RuntimeError(f"no Threads for pid {pid}")


def gateway_metrics_idle(folder: Path, connections: int = 500, hold_s: float = 3.0) -> dict[str, Any]:
    """`connections` idle connections to the daemon's metrics port (505 threads in the serving process before):
    its thread count before, while they are open and after, and a scrape while they are open."""
    daemon = Gateway("metrics-idle", folder)
    daemon.wait_ready()

    def attack() -> dict[str, Any]:
        pid = daemon.process.pid
        before = _threads(pid)
        sockets = [socket.create_connection(("127.0.0.1", daemon.metrics), timeout=10) for _ in range(connections)]
        time.sleep(hold_s)
        during = _threads(pid)
        started = time.perf_counter()
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{daemon.metrics}/metrics", timeout=10) as reply:
                scrape_status, scrape_bytes = int(reply.status), len(reply.read())
        except OSError as exc:
            scrape_status, scrape_bytes = None, f"{type(exc).__name__}: {exc}"
        scrape_s = time.perf_counter() - started
        still_open = sum(1 for sock in sockets if not _status(sock)[1])
        for sock in sockets:
            sock.close()
        time.sleep(0.5)
        after = _threads(pid)
        return {
            "connections": connections,
            "threads": {"before": before, "with_idle_open": during, "after": after},
            "idle_still_open_after_hold": still_open,
            "scrape": {"status": scrape_status, "bytes": scrape_bytes, "seconds": round(scrape_s, 3)},
            "checks": {"no_thread_per_connection": during <= before + 2, "scrape_answers": scrape_status == 200},
        }

    try:
        return _under_attack(daemon, attack, MEMORY_ATTACK_BOUND_MIB, daemon_bound_mib=METRICS_BOUND_MIB)
    finally:
        daemon.close()


SCENARIOS: dict[str, Callable[[Path], dict[str, Any]]] = {
    "gateway_sigterm": gateway_sigterm,
    "gateway_kill": gateway_kill,
    "gateway_ports_taken": gateway_ports_taken,
    "gateway_cancel": gateway_cancel,
    "gateway_fairness": gateway_fairness,
    "gateway_grpc_field_bomb": gateway_grpc_field_bomb,
    "gateway_rest_content_length_flood": gateway_rest_content_length_flood,
    "gateway_rest_head_stream": gateway_rest_head_stream,
    "gateway_metrics_idle": gateway_metrics_idle,
}

if __name__ == "__main__":  # one scenario alone: python bench/attacks_gateway.py NAME FOLDER
    print(json.dumps(SCENARIOS[sys.argv[1]](Path(sys.argv[2])), indent=2))
