"""What discarding one frame of a message of very many costs, each way the frontend can do it, in paired rounds.

A ROUTER on loopback TCP, set up as the frontend's (a 64-message receive high-water mark); a hand-written ZMTP 3.0
DEALER sends one message of `--frames` empty frames in one `sendall`, either as its connection's first message or
after one small one. Once the ROUTER is readable (libzmq's I/O thread has decoded it all), the whole message is
discarded by each discarder of packrat_daemon/wire/zmqio.py (the compiled loop, zmq_recviov, pyzmq frame by
frame), with the receive high-water mark left at 64 or set to 0 for the discard as the frontend does. Every
configuration runs once a round, in a shuffled order; the JSON has each one's nanoseconds a frame (median of
the rounds) and its ratio to the frontend's way (compiled, high-water mark 0) in the same round.

    .venv/bin/python bench/discard.py > bench/results/discard.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import statistics
import struct
import sys
import time
from pathlib import Path
from typing import Any

import zmq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from packrat_daemon.requests.frontend import DISCARDING_RECEIVE_HWM, RECEIVE_HWM  # noqa: E402
from packrat_daemon.wire import zmqio  # noqa: E402


def _greeting() -> bytes:
    """ZMTP 3.0's greeting for the NULL mechanism, as a client (RFC 23), then a READY naming a DEALER."""
    greeting = b"\xff" + bytes(8) + b"\x7f" + b"\x03\x00" + b"NULL".ljust(20, b"\x00") + b"\x00" + bytes(31)
    name, value = b"Socket-Type", b"DEALER"
    body = b"\x05READY" + bytes([len(name)]) + name + struct.pack(">I", len(value)) + value
    return greeting + b"\x04" + bytes([len(body)]) + body


def _frames(count: int) -> bytes:
    """One message of `count` empty frames: a short frame is a flags byte and a size byte."""
    return b"\x01\x00" * (count - 1) + b"\x00\x00"


def _read(peer: socket.socket, count: int) -> bytes:
    """Exactly `count` bytes from `peer`."""
    data = b""
    while len(data) < count:
        chunk = peer.recv(count - len(data))
        if not chunk:
            raise ConnectionError("the ROUTER closed the connection during the handshake")
        data += chunk
    return data


def one_run(router: zmq.Socket, port: int, frames: int, first: bool, discard: zmqio.Discarder, hwm: int) -> float:
    """Nanoseconds a frame to discard one message of `frames` frames sent by a fresh connection."""
    peer = socket.create_connection(("127.0.0.1", port))
    try:
        peer.sendall(_greeting())
        _read(peer, 64)  # the server's greeting, then its READY: libzmq takes no message before they are read
        _read(peer, _read(peer, 2)[1])
        if not first:
            peer.sendall(b"\x00\x05hello")  # one small message before
            assert router.poll(10_000), "the small message did not arrive"
            router.recv_multipart()
        peer.sendall(_frames(frames))
        assert router.poll(120_000), "the message did not arrive"
        started = time.perf_counter()
        router.recv(copy=False)  # the identity
        router.setsockopt(zmq.RCVHWM, hwm)
        discarded, ended = 0, False
        while not ended:
            taken, _, ended = discard(router, zmqio.DISCARD_BATCH)
            discarded += taken
        elapsed = time.perf_counter() - started
        router.setsockopt(zmq.RCVHWM, RECEIVE_HWM)
        assert discarded == frames, (discarded, frames)
        return elapsed / frames * 1e9
    finally:
        peer.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--frames", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    options = parser.parse_args()
    context = zmq.Context()
    router = context.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    router.setsockopt(zmq.RCVHWM, RECEIVE_HWM)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    ways = zmqio.discarders()
    configurations = [(name, hwm, first) for name in ways for hwm in (RECEIVE_HWM, DISCARDING_RECEIVE_HWM)
                      for first in (True, False)]  # fmt: skip
    reference = ("compiled" if "compiled" in ways else "zmq_recviov", DISCARDING_RECEIVE_HWM, True)
    order = random.Random(options.seed)
    runs: dict[tuple[str, int, bool], list[float]] = {c: [] for c in configurations}
    ratios: dict[tuple[str, int, bool], list[float]] = {c: [] for c in configurations}
    for round_number in range(options.rounds):
        this_round: dict[tuple[str, int, bool], float] = {}
        for configuration in order.sample(configurations, len(configurations)):
            name, hwm, first = configuration
            this_round[configuration] = one_run(router, port, options.frames, first, ways[name], hwm)
            print(f"round {round_number + 1}/{options.rounds}: {name} hwm {hwm} first {first}: "
                  f"{this_round[configuration]:.0f} ns a frame", file=sys.stderr, flush=True)  # fmt: skip
        for configuration, value in this_round.items():
            runs[configuration].append(value)
            ratios[configuration].append(value / this_round[reference])
    router.close()
    context.term()
    result: dict[str, Any] = {
        "what": __doc__.splitlines()[0],
        "command": "bench/discard.py " + " ".join(sys.argv[1:]),
        "machine": {"cpus": os.cpu_count(), "load_average_at_start": round(os.getloadavg()[0], 2)},
        "frames": options.frames,
        "rounds": options.rounds,
        "reference": f"{reference[0]}, receive hwm {reference[1]}, first message",
        "ns_per_frame": {
            f"{name}, hwm {hwm}, {'first message' if first else 'after one message'}": {
                "median": round(statistics.median(runs[(name, hwm, first)])),
                "runs": [round(value) for value in runs[(name, hwm, first)]],
                "ratio_to_reference_median": round(statistics.median(ratios[(name, hwm, first)]), 2),
            }
            for name, hwm, first in configurations
        },
    }
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
