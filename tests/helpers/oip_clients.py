"""Closed-loop Open Inference Protocol clients for the lifecycle tests and bench/faults.py's gateway scenarios.

Each client sends one request at a time over a connection it keeps (HTTP keep-alive, one gRPC channel), and
sorts every outcome: `ok`, `refused` (503 / UNAVAILABLE: the server said it cannot serve, which a client retries
elsewhere), `not_connected` (nothing listened any more: no request was taken) or `lost` (a connection reset or
closed without a status, a gRPC call CANCELLED, anything else). A client stops at its first refusal, as a
client told "shutting down" does, or when `stop` is set.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

OK, REFUSED, NOT_CONNECTED, LOST = "ok", "refused", "not_connected", "lost"


@dataclass
class Outcomes:
    counts: Counter[str] = field(default_factory=Counter)
    lost: list[str] = field(default_factory=list)  # what each lost request saw
    latencies_s: list[float] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, outcome: str, detail: str = "", latency_s: float | None = None) -> None:
        with self.lock:
            self.counts[outcome] += 1
            if outcome == LOST:
                self.lost.append(detail)
            if latency_s is not None and outcome == OK:
                self.latencies_s.append(latency_s)

    def to_json(self) -> dict[str, object]:
        median = float(np.median(self.latencies_s)) if self.latencies_s else None
        return {**{k: self.counts.get(k, 0) for k in (OK, REFUSED, NOT_CONNECTED, LOST)},
                "lost_detail": self.lost[:5], "median_s": median}  # fmt: skip


def rest_body(sample: np.ndarray) -> bytes:
    request = {"inputs": [{"name": "input", "shape": list(sample.shape), "datatype": "FP32",
                           "data": sample.reshape(-1).tolist()}]}  # fmt: skip
    return json.dumps(request).encode()


def rest_loop(host: str, port: int, model: str, sample: np.ndarray, outcomes: Outcomes, stop: threading.Event) -> None:
    body = rest_body(sample)
    path = f"/v2/models/{model}/infer"
    connection: http.client.HTTPConnection | None = None
    while not stop.is_set():
        if connection is None:
            connection = http.client.HTTPConnection(host, port, timeout=30)
            try:
                connection.connect()
            except ConnectionRefusedError:
                outcomes.add(NOT_CONNECTED)
                return
        started = time.perf_counter()
        try:
            connection.request("POST", path, body, {"Content-Type": "application/json"})
            response = connection.getresponse()
            response.read()
        except (ConnectionError, http.client.HTTPException, OSError) as exc:
            outcomes.add(LOST, f"REST {type(exc).__name__}: {exc}")
            return
        if response.status == 503:
            outcomes.add(REFUSED)
            return
        if response.status != 200:
            outcomes.add(LOST, f"REST status {response.status}")
            return
        outcomes.add(OK, latency_s=time.perf_counter() - started)
        if response.will_close:
            connection.close()
            connection = None
    if connection is not None:
        connection.close()


def grpc_loop(target: str, model: str, sample: np.ndarray, outcomes: Outcomes, stop: threading.Event) -> None:
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    client = grpcclient.InferenceServerClient(target)
    tensor = grpcclient.InferInput("input", list(sample.shape), "FP32")
    tensor.set_data_from_numpy(sample)
    try:
        while not stop.is_set():
            started = time.perf_counter()
            try:
                client.infer(model, [tensor], client_timeout=30)
            except InferenceServerException as exc:
                status = str(exc.status())
                if status == "StatusCode.UNAVAILABLE":
                    # Refused by a gateway that drains, or nothing listens any more: either way no request was taken.
                    outcomes.add(REFUSED if "shutting down" in (exc.message() or "") else NOT_CONNECTED)
                else:
                    outcomes.add(LOST, f"gRPC {status}: {exc.message()}")
                return
            outcomes.add(OK, latency_s=time.perf_counter() - started)
    finally:
        client.close()


def closed_loops(
    host: str, http_port: int, grpc_port: int, model: str, sample: np.ndarray, rest: int, grpc: int
) -> tuple[Outcomes, Outcomes, threading.Event, list[threading.Thread]]:
    """Start `rest` REST and `grpc` gRPC closed-loop clients; returns their outcomes, a stop event and threads."""
    rest_out, grpc_out, stop = Outcomes(), Outcomes(), threading.Event()
    threads = [
        threading.Thread(target=rest_loop, args=(host, http_port, model, sample, rest_out, stop), daemon=True)
        for _ in range(rest)
    ]
    threads += [
        threading.Thread(target=grpc_loop, args=(f"{host}:{grpc_port}", model, sample, grpc_out, stop), daemon=True)
        for _ in range(grpc)
    ]
    for thread in threads:
        thread.start()
    return rest_out, grpc_out, stop, threads


def http_status(port: int, path: str = "/readyz") -> int | None:
    """The status a GET of `path` on loopback answers (the daemon's /readyz by default); None: nothing answers."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as reply:
            return int(reply.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return None


def gateway_pid(daemon_pid: int) -> int:
    """The process id of the gateway `packrat serve` started beside the daemon of `daemon_pid`."""
    children = Path(f"/proc/{daemon_pid}/task/{daemon_pid}/children").read_text().split()
    for child in children:
        if b"oip" in Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0"):
            return int(child)
    raise RuntimeError(f"no gateway among the daemon's children {children}")
