"""The clients' side of the daemon: one ROUTER socket; read, parse, queue, reply, and `info`.

This is the request path: `read` runs on every wake that has a request and `reply_result` once per
answered request, so both stay flat (no per-request layers beyond the wire protocol's own parser).
What it needs of the rest of the daemon is given at construction: the batcher it queues into, whether a
batch is in flight (`busy`: reading stops for a full batch only when one can start), where each answer's
own cost goes (`served`: the batcher's cost model), and the `status` reply. Beside it: the bounds on what a
client's messages may cost (`socket_bounds`), the clients' connections (`peers`), and the last call after the drain
(`last_call`).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from typing import Any

import zmq
from zmq.auth.thread import ThreadAuthenticator
from zmq.backend import Socket as _CompiledSocket

from packrat_daemon.config import ServeConfig
from packrat_daemon.fleet.backend import ModelInfo
from packrat_daemon.fleet.reconciler import Reconciler
from packrat_daemon.measure import emulation
from packrat_daemon.ops.hardening import claim_ipc
from packrat_daemon.ops.logs import log_request
from packrat_daemon.ops.metrics import Metrics
from packrat_daemon.requests.batcher import Batcher, Request
from packrat_daemon.requests.jobs import Completed
from packrat_daemon.requests.last_call import REFUSE_GRACE_S, REFUSE_QUIET_S, REFUSE_WAITING_S, refuse_until_quiet
from packrat_daemon.requests.oversized import (
    TRIM_AFTER_FRAMES,
    Oversized,
    give_back_memory,
    peak_memory,
    refuse_oversized,
)
from packrat_daemon.requests.peers import Peers
from packrat_daemon.requests.socket_bounds import (
    DISCARD_FRAMES_PER_WAKE,
    DISCARD_UNBOUNDED_MAX_BYTES,
    DISCARDING_RECEIVE_HWM,
    MAX_KEPT_FRAMES,
    RECEIVE_HWM,
    SEND_HWM,
    frame_cap,
)
from packrat_daemon.requests.tensors import ModelTensors
from packrat_daemon.wire.codec import (
    ITEMSIZE,
    MAX_HEADER_BYTES,
    MAX_ID_CHARS,
    MAX_TIMEOUT_MS,
    SUPPORTED_VERSIONS,
    ErrorCode,
    ProtocolError,
)
from packrat_daemon.wire.curve import FrontendSecurity
from packrat_daemon.wire.model_checks import check_against_model
from packrat_daemon.wire.server_replies import encode_error, encode_info, encode_timed_result
from packrat_daemon.wire.server_side import CancelRequest, InfoRequest, parse_request
from packrat_daemon.wire.zmqio import NOBLOCK, ZERO_COPY_MIN_BYTES, discarder, readable, send_frames
from workers.messages import numpy_name
from workers.models.spec import EMULATED

log = logging.getLogger("packrat.daemon")

MAX_READS_PER_WAKE = 256  # bound how long the frontend can starve the workers' socket
# How long one `status` reply serves every asker: status is for people and scrapers, never the request path.
STATUS_CACHE_S = 0.1
# On close, how long ZeroMQ may still try to deliver the last replies (the drain's results, the
# SHUTTING_DOWN answers) before the process exits.
CLOSE_LINGER_MS = 1000

_recv = _CompiledSocket.recv


class Frontend:
    def __init__(
        self,
        context: zmq.Context,
        config: ServeConfig,
        info: ModelInfo,
        metrics: Metrics,
        batcher: Batcher,
        reconciler: Reconciler,
        busy: Callable[[], bool],
        served: Callable[[float], None],
        status: Callable[[], dict[str, Any]] | None = None,
    ) -> None:
        self.model = config.model  # neither changes on reload: both take a restart
        self.endpoint = config.endpoint
        self.info = info
        # An emulating daemon says so in every `info` reply: its latencies are the profile's, not this machine's.
        cores = reconciler.allocator.topology.usable_cores
        self.emulation = emulation.describe(config, cores) if info.runtime == EMULATED else None
        self.metrics = metrics
        self.batcher = batcher  # its max_batch is the limit requests are checked against (a reload can shrink it)
        self.reconciler = reconciler  # the plan and the serving workers `info` describes
        self.busy = busy  # a batch is in flight
        # Each answer's time from dispatch to reply less its compute: the daemon's own cost per batch, which the
        # batcher's decision to wait for company weighs (Batcher.served).
        self.served = served
        self.status = status  # the `status` reply, as the daemon builds it (None: answered as `info`)
        self._status_cache: tuple[float, int, dict[str, Any]] | None = None  # (built at, generation, reply)
        self.accepting = False  # inference requests are queued only while serving; `info` is always answered
        self.sample_bytes = math.prod(info.shape) * ITEMSIZE[info.dtype]
        self.tensors = ModelTensors(info.input)  # named inputs and outputs: protocol version 2
        self.socket = context.socket(zmq.ROUTER)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.setsockopt(zmq.ROUTER_MANDATORY, 0)  # a vanished client must not stall the daemon
        self.security = FrontendSecurity.check(
            config.endpoint, config.server_key, config.allowed_clients, config.insecure_public
        )
        self.authenticator: ThreadAuthenticator | None = None  # the ZAP handler, while CURVE serves
        self.socket.setsockopt(zmq.RCVHWM, RECEIVE_HWM)
        self.socket.setsockopt(zmq.SNDHWM, SEND_HWM)  # unread replies: bounded per client (docs/protocol.md)
        self.peers = Peers(self.socket)  # each client's connection: the queued requests of one gone are dropped
        self._oversized: Oversized | None = None  # a message of too many frames, being discarded
        self._discard_budget = 0  # the frames this read may still discard

    def open(self) -> None:
        """Bind the endpoint and accept requests."""
        # Frames a little over the limit get a TOO_LARGE answer; ZeroMQ itself cuts off a peer that sends
        # a frame far over it. The cap is per frame: `read` bounds what a message of many frames costs.
        self.socket.setsockopt(zmq.MAXMSGSIZE, self.max_frame_bytes())
        if self.endpoint.startswith("ipc://"):
            claim_ipc(self.endpoint.removeprefix("ipc://"))  # libzmq would silently take a live daemon's socket
        self.authenticator = self.security.apply(self.socket)  # CURVE options must be set before the bind
        self.socket.bind(self.endpoint)
        log.info("frontend %s: %s", self.endpoint, self.security.describe())
        self.accepting = True

    def read(self) -> int:
        """Parse and queue what clients sent; answer malformed requests and `info` at once. Returns how
        many messages it took in."""
        limit = self.max_message_bytes()  # max_batch changes only on reload, between wakes
        self._discard_budget = DISCARD_FRAMES_PER_WAKE
        for reads in range(MAX_READS_PER_WAKE):
            # The poll reported the first message; after it, EVENTS is far cheaper than a receive that
            # raises zmq.Again once the queue is empty.
            if reads and not readable(self.socket):
                return reads
            try:
                message = self._receive()
            except zmq.Again:
                return reads
            if message is None:
                return reads  # this wake's share of a message of too many frames is discarded: the loop comes back
            frames, size, count = message
            if count > TRIM_AFTER_FRAMES:
                give_back_memory()
            try:
                if self._handle(frames, size, count, limit):
                    return reads + 1  # a full batch can start now; the loop reads the rest right after it starts
            except Exception:
                # The last resort: no message may stop the daemon. Logged with what it was, answered INTERNAL.
                log.exception("internal error on a message of %d bytes in %d frames; answered INTERNAL", size, count)
                self.metrics.count(ErrorCode.INTERNAL)
                delimiter = b"" if len(frames) > 1 and len(frames[1]) == 0 else None
                reply = encode_error(None, ErrorCode.INTERNAL, "the server failed on this message; it is logged")
                self.send(frames[0].bytes, delimiter, reply)
        return MAX_READS_PER_WAKE

    def _receive(self) -> tuple[list[zmq.Frame], int, int] | None:
        """The next message: its first MAX_KEPT_FRAMES frames, its size in bytes (the identity not counted) and its
        number of frames; None while a message of too many frames is still being discarded (this read's share is
        spent).
        Raises zmq.Again when no message is waiting.

        ZeroMQ hands a multipart message over only once all of it has arrived, so this cannot refuse the bytes
        themselves; it makes sure the daemon never holds more than a few frames of a message of many, builds no
        Python object for the others and spends a bounded time on them per wake.
        """
        oversized = self._oversized
        if oversized is None:
            frame = _recv(self.socket, NOBLOCK, False, False)
            frames = [frame]
            size, count = 0, 1
            while frame.more and count < MAX_KEPT_FRAMES:
                frame = _recv(self.socket, NOBLOCK, False, False)
                count += 1
                size += len(frame)
                frames.append(frame)
            if not frame.more:
                return frames, size, count
            # Too many frames: only those that say what to answer are kept while the rest is discarded.
            oversized = self._oversized = Oversized(frames[:3], size, count, time.monotonic())
            oversized.unbounded_below = peak_memory() + DISCARD_UNBOUNDED_MAX_BYTES
            self.socket.setsockopt(zmq.RCVHWM, DISCARDING_RECEIVE_HWM)  # libzmq applies it to every peer's queue
        taken, size, ended = discarder()(self.socket, self._discard_budget)
        self._discard_budget -= taken
        oversized.size += size
        oversized.count += taken
        if oversized.unbounded_below is not None and (ended or peak_memory() >= oversized.unbounded_below):
            oversized.unbounded_below = None
            self.socket.setsockopt(zmq.RCVHWM, RECEIVE_HWM)
        if not ended:
            return None
        self._oversized = None
        if oversized.count > TRIM_AFTER_FRAMES:  # an operator should know: every client waited for it
            log.warning(
                "refused a message of %d frames (%d bytes): ZeroMQ held all of it before it could be refused, about "
                "64 bytes a frame, and reading it took %.1f s, in which no other client's request could be read; "
                "where untrusted clients can connect, let in only the ones you list (docs/security.md)",
                oversized.count - 1, oversized.size, time.monotonic() - oversized.started,
            )  # fmt: skip
        return oversized.frames, oversized.size, oversized.count

    def _handle(self, frames: list[zmq.Frame], size: int, count: int, limit: int) -> bool:
        """Answer or queue one message; True when a full batch is waiting to start."""
        identity = frames[0].bytes
        try:
            if count > len(frames) or size > limit:
                refuse_oversized(frames[1:], size, count - 1, limit, self.batcher.max_batch)
            delimiter, request = parse_request(frames[1:], max_message_bytes=limit)
        except ProtocolError as exc:
            self.metrics.count(exc.code)
            self.send(identity, exc.delimiter, encode_error(exc.request_id, exc.code, exc.message))
            return False
        if isinstance(request, CancelRequest):  # one reply for that id either way: CANCELLED here, or its own later
            cancelled = self.batcher.cancel(identity, request.request_id)
            if cancelled is not None:
                self.reply_error(cancelled, ErrorCode.CANCELLED, "cancelled by its client before it started")
            return False
        if isinstance(request, InfoRequest):
            info = self.describe() if self.status is None or request.op != "status" else self._status_now()
            self.send(identity, delimiter, encode_info(request.request_id, info))
            return False
        if not self.accepting:
            self.metrics.count(ErrorCode.SHUTTING_DOWN)
            reply = encode_error(
                request.request_id, ErrorCode.SHUTTING_DOWN, "the server is shutting down; retry elsewhere"
            )
            self.send(identity, delimiter, reply)
            return False
        named = request.tensors is not None
        try:
            if not named and not self.tensors.records and not self.tensors.ragged:  # version 1, as always
                check_against_model(request, self.info.dtype, self.info.shape, self.batcher.max_batch, self.info.high)
            else:
                request = self.tensors.checked(request, self.batcher.max_batch)
        except ProtocolError as exc:
            self.metrics.count(exc.code)
            self.send(identity, delimiter, encode_error(request.request_id, exc.code, exc.message))
            return False
        now = time.monotonic()
        deadline = None if request.timeout_ms is None else now + request.timeout_ms / 1000.0
        queued = Request(
            identity, delimiter, request.request_id, request.dtype, request.shape, request.payload, now, deadline
        )
        queued.named, queued.client = named, request.client
        queued.length = self.tensors.length_of(request)
        if not self.batcher.offer(queued):
            message = f"the queue is full ({self.batcher.queued_inputs} inputs waiting); retry later"
            self.reply_error(queued, ErrorCode.OVERLOADED, message)
            return False
        if not self.peers.known(identity, descriptor := frames[0].get(zmq.SRCFD)):
            self.forget_departed()  # first: the descriptor may be a closed connection's, reused (Peers.note)
            self.peers.note(identity, descriptor)
        return self.batcher.queued_inputs >= self.batcher.max_batch and not self.busy()

    def forget_departed(self) -> None:
        """Drop the queued requests of clients whose connection closed: their replies could reach nobody, and
        computing them holds up everyone queued behind. A batch already in flight is not recalled (one batch)."""
        gone = self.peers.departed()
        if gone:
            dropped = self.batcher.drop(gone)
            if dropped:
                log.info("dropped %d queued request(s), %d inputs, of %d client(s) that disconnected",
                         len(dropped), sum(r.samples for r in dropped), len(gone))  # fmt: skip

    def answer_all_and_close(self, left: list[Request]) -> None:
        """Exactly one reply per request: after a second stop signal the queue and the batch in flight (`left`)
        are answered too, and requests that reached the socket after the drain get SHUTTING_DOWN, until it closes."""
        for request in left:
            self.reply_error(request, ErrorCode.SHUTTING_DOWN, "the server is shutting down")
        self.refuse_waiting()
        self.close()

    def refuse_waiting(self) -> None:
        """After the drain: answer every message that reaches the socket (SHUTTING_DOWN; `info` is still
        answered) until it has been quiet for REFUSE_QUIET_S, at most REFUSE_WAITING_S in all; log that
        moment, the last call, and go on answering for REFUSE_GRACE_S (`last_call`)."""
        self.accepting = False
        refuse_until_quiet(self.socket, self.read, REFUSE_WAITING_S, REFUSE_QUIET_S, REFUSE_GRACE_S)

    def _status_now(self) -> dict[str, Any]:
        """The `status` reply, built at most once per STATUS_CACHE_S whoever asks: a flood of `status` requests
        (on one connection or many) rebuilt it for each and cut serving 16-fold; each now costs its encoding."""
        now, generation = time.monotonic(), self.reconciler.generation
        cache = self._status_cache
        # A new plan (a switch, a reload, a control request) is shown at once: the cache is of one generation.
        if cache is None or now - cache[0] >= STATUS_CACHE_S or cache[1] != generation:
            assert self.status is not None
            cache = self._status_cache = (now, generation, self.status())
        return cache[2]

    def describe(self) -> dict[str, Any]:
        """The `info` reply: the model, its input, the plan and the live workers."""
        plan = self.reconciler.plan
        assert plan is not None  # the daemon hands the reconciler its plan before the socket is bound
        return {
            "versions": list(SUPPORTED_VERSIONS),
            "model": self.model,
            "input": {"dtype": self.info.dtype, "shape": list(self.info.shape), "high": self.info.high},
            **self.tensors.describe(),
            "runtime": self.info.runtime,
            "precision": self.info.precision,
            "accuracy_guard": self.info.guard,
            "emulation": self.emulation,
            "max_batch": self.batcher.max_batch,
            "max_delay_ms": round(self.batcher.max_delay_s * 1000.0, 6),  # live: the gateway's model config says it
            "limits": self.limits(),
            "plan": plan.to_json(),
            "template_pid": self.info.template_pid,
            "workers": [
                {"id": w.id, "pid": w.pid, "threads": w.threads, "cores": list(w.cores)}
                for w in self.reconciler.serving()
            ],
        }

    def send(self, identity: bytes, delimiter: bytes | None, frames: list[Any], large: bool = False) -> None:
        """Answer a client; `large`: the last frame is a result tensor big enough for zero-copy to pay."""
        try:
            send_frames(self.socket, [identity, *frames] if delimiter is None else [identity, delimiter, *frames],
                        copy=not large)  # fmt: skip
        except zmq.ZMQError as exc:
            log.debug("could not answer a client: %s", exc)

    def reply_error(self, request: Request, code: ErrorCode, message: str) -> None:
        self.metrics.count(code)
        self.send(request.identity, request.delimiter, encode_error(request.request_id, code, message))

    def reply_result(self, done: Completed) -> None:
        request = done.request
        now = time.monotonic()
        total_ms = (now - request.arrived) * 1000.0
        output = done.output
        if request.named or self.tensors.output_records:  # named tensors (protocol version 2)
            reply = self.tensors.reply(done, request.named, total_ms)
        else:
            reply = encode_timed_result(
                request.request_id, numpy_name(output.dtype), output.shape, output,
                done.queue_ms, done.compute_ms, total_ms, done.instances,
            )  # fmt: skip
        self.send(request.identity, request.delimiter, reply, output.nbytes >= ZERO_COPY_MIN_BYTES)
        self.metrics.answered(done, total_ms)
        self.served((total_ms - done.queue_ms - done.compute_ms) / 1000.0)  # what batching waits for
        self.batcher.answered(request.samples, now)  # a closed loop's client comes back within a round trip
        log_request(done, total_ms)

    def max_message_bytes(self) -> int:
        return self.batcher.max_batch * self.sample_bytes + MAX_HEADER_BYTES + 1024

    def max_frame_bytes(self) -> int:
        return frame_cap(self.max_message_bytes())

    def limits(self) -> dict[str, int]:
        """The size limits a request is checked against, as `info` states them (docs/protocol.md)."""
        limit = self.max_message_bytes()
        return {
            "max_samples": self.batcher.max_batch,
            "max_message_bytes": limit,
            "max_frame_bytes": self.max_frame_bytes(),
            "max_header_bytes": MAX_HEADER_BYTES,
            "max_id_chars": MAX_ID_CHARS,
            "max_timeout_ms": MAX_TIMEOUT_MS,
        }

    def close(self) -> None:
        self.socket.disable_monitor()
        self.peers.close()
        self.socket.close(linger=CLOSE_LINGER_MS)
        if self.authenticator is not None:
            self.authenticator.stop()
