"""Generated and mutated client messages for a live daemon's frontend (the fuzz test and bench/faults.py).

`messages()` draws whole multipart messages: headers built from the protocol's fields with each field
drawn from valid and hostile values, or such a header's JSON mutated byte by byte, or arbitrary bytes;
then zero to five more frames, of the right payload size or not, empty, or over the size limit.
`fuzz()` sends each one on a DEALER socket and checks that exactly one typed reply comes back.
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from packrat_daemon.wire.codec import DTYPES, MAX_TIMEOUT_MS, ErrorCode

CODES = {str(code) for code in ErrorCode}
REPLY_TIMEOUT_S = 10.0

# Hostile values for any field: wrong types, huge and tiny numbers, strings JSON can carry but UTF-8 cannot.
JUNK = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([10**400, -(10**400), 2**63, -(2**63) - 1, 2**31, MAX_TIMEOUT_MS + 1, 0, -1]),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=40),
    st.sampled_from(["\ud800", "ok\udfff", "x" * 129, "é" * 128, "", "infer", "info"]),
    st.lists(st.integers(min_value=-3, max_value=70), max_size=40),
    st.dictionaries(st.text(max_size=5), st.integers(), max_size=3),
)


@dataclass
class Model:
    """What the daemon serves: the fields a well-formed request for it carries."""

    dtype: str
    sample_shape: tuple[int, ...]
    max_batch: int
    max_message_bytes: int

    def payload_bytes(self, samples: int) -> int:
        return samples * math.prod(self.sample_shape) * DTYPES[self.dtype].itemsize


def _field(valid: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Mostly the valid value (so that whole well-formed requests are drawn too), sometimes junk, sometimes
    absent (a sentinel the header drops). Chosen by a weighted draw: st.one_of does not weigh its branches
    by how often they are listed."""
    choices = {"valid": valid, "junk": JUNK, "absent": st.just(_ABSENT)}
    return st.sampled_from(["valid"] * 8 + ["junk", "absent"]).flatmap(lambda kind: choices[kind])


_ABSENT = object()


@st.composite
def headers(draw: st.DrawFn, model: Model) -> tuple[bytes, int]:
    """A header's bytes and the samples its shape claims (0 when it claims none)."""
    samples = draw(st.integers(min_value=1, max_value=model.max_batch + 2))
    fields = {
        "v": draw(_field(st.just(1))),
        "id": draw(_field(st.one_of(st.integers(min_value=-(2**63), max_value=2**63 - 1), st.text(max_size=128)))),
        "op": draw(_field(st.sampled_from(["infer", "infer", "info"]))),
        "dtype": draw(_field(st.sampled_from([model.dtype] * len(DTYPES) + list(DTYPES)))),
        "shape": draw(_field(st.just([samples, *model.sample_shape]))),
        "timeout_ms": draw(_field(st.one_of(st.none(), st.floats(min_value=1, max_value=MAX_TIMEOUT_MS)))),
    }
    header = {key: value for key, value in fields.items() if value is not _ABSENT}
    extra = draw(st.dictionaries(st.text(max_size=8), JUNK, max_size=2))
    header = {**extra, **header} if draw(st.booleans()) else {**header, **extra}
    raw = json.dumps(header, ensure_ascii=draw(st.booleans())).encode("utf-8", "surrogatepass")
    mode = draw(st.sampled_from(["as is"] * 4 + ["mutated", "truncated", "bytes", "duplicate keys"]))
    if mode == "mutated":
        data = bytearray(raw)
        for _ in range(draw(st.integers(min_value=1, max_value=4))):
            at = draw(st.integers(min_value=0, max_value=len(data) - 1))
            data[at] = draw(st.integers(min_value=0, max_value=255))
        raw = bytes(data)
    elif mode == "truncated":
        raw = raw[: draw(st.integers(min_value=0, max_value=len(raw)))]
    elif mode == "bytes":
        raw = draw(st.binary(max_size=200))
    elif mode == "duplicate keys":
        raw = raw[:-1] + b',"id":' + json.dumps(draw(JUNK)).encode() + b"}" if raw.endswith(b"}") else raw
    return raw, samples if isinstance(header.get("shape"), list) else 0


@st.composite
def messages(draw: st.DrawFn, model: Model) -> list[bytes]:
    """One multipart message as a client sends it (ZeroMQ adds the identity)."""
    header, samples = draw(headers(model))
    frames = [header]
    if draw(st.integers(min_value=0, max_value=9)) == 0:
        frames.insert(0, b"")  # as a REQ socket would send it
    sizes = st.one_of(
        st.just(model.payload_bytes(max(samples, 1))),
        st.just(model.payload_bytes(max(samples, 1))),
        st.integers(min_value=0, max_value=4096),
        st.integers(min_value=model.max_message_bytes - 64, max_value=model.max_message_bytes + 4096),
    )
    for _ in range(draw(st.sampled_from([1, 1, 1, 0, 2, 5]))):
        frames.append(bytes(draw(sizes)))
    return frames


@dataclass
class FuzzStats:
    sent: int = 0
    replies: int = 0
    ok: int = 0
    codes: Counter[str] = field(default_factory=Counter)
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {"sent": self.sent, "replies": self.replies, "ok": self.ok, "errors_by_code": dict(self.codes),
                "seconds": round(self.seconds, 1)}  # fmt: skip


def fuzz(endpoint: str, model: Model, examples: int, derandomize: bool = True) -> FuzzStats:
    """Send `examples` generated messages one at a time; each must get exactly one typed reply."""
    stats = FuzzStats()
    context = zmq.Context.instance()
    socket = context.socket(zmq.DEALER)
    socket.setsockopt(zmq.LINGER, 0)
    socket.connect(endpoint)
    started = time.monotonic()

    @settings(
        max_examples=examples,
        derandomize=derandomize,
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(messages(model))
    def exchange(frames: list[bytes]) -> None:
        socket.send_multipart(frames)
        stats.sent += 1
        assert socket.poll(int(REPLY_TIMEOUT_S * 1000)), f"no reply to {short(frames)}"
        reply = socket.recv_multipart()
        stats.replies += 1
        if reply and reply[0] == b"" and frames[0] == b"":
            reply = reply[1:]  # the delimiter of a REQ-style message, echoed
        header = json.loads(reply[0])
        assert header["v"] == 1 and isinstance(header["ok"], bool), header
        if header["ok"]:
            stats.ok += 1
        else:
            assert header["error"]["code"] in CODES, header
            assert not header["error"]["message"].startswith(header["error"]["code"]), header
            stats.codes[header["error"]["code"]] += 1
        assert not socket.poll(0), f"a second reply to {short(frames)}"

    try:
        exchange()
    finally:
        stats.seconds = time.monotonic() - started
        socket.close()
    return stats


def short(frames: list[bytes]) -> str:
    return repr([frame[:80] + (b"..." if len(frame) > 80 else b"") for frame in frames])


def rss_bytes(pid: int) -> int:
    """The process's resident set size now."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


class PeakRss:
    """Samples a process's RSS every 10 ms in a thread; `peak` is the largest seen."""

    def __init__(self, pid: int) -> None:
        self.pid, self.peak, self._stop = pid, rss_bytes(pid), threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.01):
            self.peak = max(self.peak, rss_bytes(self.pid))

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak
