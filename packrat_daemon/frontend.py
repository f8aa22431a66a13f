"""The clients' side of the daemon: one ROUTER socket; read, parse, queue, reply, and `info`.

This is the request path: `read` runs on every wake that has a request and `reply_result` once per
answered request, so both stay flat (no per-request layers beyond the wire protocol's own parser).
"""

from __future__ import annotations

import logging
import time
from typing import Any

import zmq

from packrat_daemon.backend import ModelInfo
from packrat_daemon.batcher import Batcher, Request
from packrat_daemon.config import ServeConfig
from packrat_daemon.dispatcher import Completed, Dispatcher
from packrat_daemon.metrics import Metrics
from packrat_daemon.reconciler import Reconciler
from packrat_daemon.wire.codec import DTYPES, MAX_HEADER_BYTES, SUPPORTED_VERSIONS, ErrorCode, ProtocolError
from packrat_daemon.wire.server_side import (
    InfoRequest,
    check_against_model,
    encode_error,
    encode_info,
    encode_timed_result,
    parse_request,
)
from packrat_daemon.wire.zmqio import NOBLOCK, ZERO_COPY_MIN_BYTES, readable, recv_frames, send_frames
from workers.messages import numpy_name

log = logging.getLogger("packrat.daemon")

MAX_READS_PER_WAKE = 256  # bound how long the frontend can starve the workers' socket
HARD_MESSAGE_SLACK_BYTES = 64 << 20


class Frontend:
    def __init__(
        self,
        context: zmq.Context,
        config: ServeConfig,
        info: ModelInfo,
        metrics: Metrics,
        batcher: Batcher,
        dispatcher: Dispatcher,
        reconciler: Reconciler,
    ) -> None:
        self.model = config.model  # neither changes on reload: both take a restart
        self.endpoint = config.endpoint
        self.info = info
        self.metrics = metrics
        self.batcher = batcher  # its max_batch is the limit requests are checked against (a reload can shrink it)
        self.dispatcher = dispatcher
        self.reconciler = reconciler
        self.accepting = False  # inference requests are queued only while serving; `info` is always answered
        self.sample_bytes = _sample_bytes(info)
        self.socket = context.socket(zmq.ROUTER)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.setsockopt(zmq.ROUTER_MANDATORY, 0)  # a vanished client must not stall the daemon

    def open(self) -> None:
        """Bind the endpoint and accept requests."""
        # Messages a little over the limit get a TOO_LARGE answer from the parser; ZeroMQ itself cuts
        # off a peer that sends far more, so a hostile client can never make the daemon buffer gigabytes.
        limit = self.max_message_bytes()
        self.socket.setsockopt(zmq.MAXMSGSIZE, max(4 * limit, limit + HARD_MESSAGE_SLACK_BYTES))
        self.socket.bind(self.endpoint)
        self.accepting = True

    def read(self) -> None:
        """Parse and queue what clients sent; answer malformed requests and `info` at once."""
        limit = self.max_message_bytes()  # max_batch changes only on reload, between wakes
        for reads in range(MAX_READS_PER_WAKE):
            # The poll reported the first message; after it, EVENTS is far cheaper than a receive that
            # raises zmq.Again once the queue is empty.
            if reads and not readable(self.socket):
                return
            try:
                frames = recv_frames(self.socket, NOBLOCK)
            except zmq.Again:
                return
            identity = frames[0].bytes
            try:
                delimiter, request = parse_request(frames[1:], max_message_bytes=limit)
            except ProtocolError as exc:
                self.metrics.count(exc.code)
                self.send(identity, exc.delimiter, encode_error(exc.request_id, exc.code, exc.message))
                continue
            if isinstance(request, InfoRequest):
                self.send(identity, delimiter, encode_info(request.request_id, self.describe()))
                continue
            if not self.accepting:
                self.metrics.count(ErrorCode.SHUTTING_DOWN)
                reply = encode_error(
                    request.request_id, ErrorCode.SHUTTING_DOWN, "the server is shutting down; retry elsewhere"
                )
                self.send(identity, delimiter, reply)
                continue
            try:
                check_against_model(request, self.info.dtype, self.info.shape, self.batcher.max_batch)
            except ProtocolError as exc:
                self.metrics.count(exc.code)
                self.send(identity, delimiter, encode_error(request.request_id, exc.code, str(exc)))
                continue
            now = time.monotonic()
            deadline = None if request.timeout_ms is None else now + request.timeout_ms / 1000.0
            queued = Request(
                identity, delimiter, request.request_id, request.dtype, request.shape, request.payload, now, deadline
            )
            if not self.batcher.offer(queued):
                message = f"the queue is full ({self.batcher.queued_inputs} inputs waiting); retry later"
                self.reply_error(queued, ErrorCode.OVERLOADED, message)
            elif self.batcher.queued_inputs >= self.batcher.max_batch and not self.dispatcher.busy:
                return  # a full batch can start now; the loop reads the rest right after dispatching it

    def describe(self) -> dict[str, Any]:
        """The `info` reply: the model, its input, the plan and the live workers."""
        plan = self.reconciler.plan
        assert plan is not None  # the daemon hands the reconciler its plan before the socket is bound
        return {
            "versions": list(SUPPORTED_VERSIONS),
            "model": self.model,
            "input": {"dtype": self.info.dtype, "shape": list(self.info.shape), "high": self.info.high},
            "runtime": self.info.runtime,
            "max_batch": self.batcher.max_batch,
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
        total_ms = (time.monotonic() - request.arrived) * 1000.0
        output = done.output
        header, payload = encode_timed_result(
            request.request_id, numpy_name(output.dtype), output.shape, output,
            done.queue_ms, done.compute_ms, total_ms, done.instances,
        )  # fmt: skip
        self.send(request.identity, request.delimiter, [header, payload], output.nbytes >= ZERO_COPY_MIN_BYTES)
        self.metrics.answered_ok(total_ms)

    def max_message_bytes(self) -> int:
        return self.batcher.max_batch * self.sample_bytes + MAX_HEADER_BYTES + 1024

    def close(self) -> None:
        self.socket.close(linger=0)


def _sample_bytes(info: ModelInfo) -> int:
    count = 1
    for dim in info.shape:
        count *= dim
    return count * DTYPES[info.dtype].itemsize
