"""What one client's messages may cost the daemon's frontend: the bounds set on its ROUTER socket (frames kept of a
message, the frame cap, the queues' high-water marks) and the pace at which a message of too many frames is
discarded. docs/protocol.md ("Limits and memory") gives them to the clients.
"""

from __future__ import annotations

from packrat_daemon.wire.codec import MAX_TENSORS

# Frames of a request: the ROUTER's identity, a REQ client's empty delimiter, the header, the payload.
MAX_KEPT_FRAMES = 3 + MAX_TENSORS  # version 2: a frame per named tensor
# A message of more frames is refused; the frames past these are discarded without a Python object each
# (zmqio.discarder), at most DISCARD_FRAMES_PER_WAKE of them per read: libzmq hands over no other client's
# message before that one's last frame anyway, and in between the loop goes on answering the requests it holds,
# keeping their deadlines and starting batches. Read whole, a message of 10 million frames kept the loop from
# answering anything for seconds, the requests it already held included.
DISCARD_FRAMES_PER_WAKE = 1 << 15
# ZeroMQ's cap is per frame (ZMQ_MAXMSGSIZE): a frame up to twice the message limit, and at least 1 MiB over
# it (a small model's limit is mostly the header's allowance), is read and answered TOO_LARGE; a peer that
# sends a bigger frame is disconnected by ZeroMQ without an answer.
FRAME_CAP_FACTOR = 2
FRAME_CAP_SLACK_BYTES = 1 << 20
# Complete messages ZeroMQ queues per connected peer before it stops reading that peer's socket: with
# the frame cap, what bounds the frontend's memory (docs/protocol.md, "Limits and memory").
RECEIVE_HWM = 64
# While a message of too many frames is discarded the receive queues have no high-water mark (ZeroMQ's 0).
# libzmq 4.3 tells the sending peer's I/O thread that the queue has room once per *frame* read while the count
# of whole messages read from that peer is a multiple of the low-water mark (half the high-water mark), which
# it always is at a connection's first message: such a message cost several times as much a frame to read, and
# a client can choose it. With no high-water mark there is no low-water mark, and no command per frame.
DISCARDING_RECEIVE_HWM = 0
# What the other clients send meanwhile is queued without the 64-message bound, so the bound comes back (and
# the discard goes on at libzmq's slower pace) once the process's peak memory has grown this much since the
# discard began: that peak already holds the whole message, whose memory libzmq frees as it is read.
DISCARD_UNBOUNDED_MAX_BYTES = 64 << 20
# Replies ZeroMQ queues per connected peer that has stopped reading: past it, with ROUTER_MANDATORY off, a
# reply is dropped (the client that does not read times out) instead of queued. ZeroMQ's default of 1 000
# let a client that never read grow the daemon without bound (5 GB for 100 replies of a 4 MiB-output model).
# A client that reads loses nothing: its own receive queue takes the replies before this one fills.
SEND_HWM = 64


def frame_cap(max_message_bytes: int) -> int:
    """The largest frame read (and answered TOO_LARGE if over the message limit) rather than cut off by ZeroMQ."""
    return max(FRAME_CAP_FACTOR * max_message_bytes, max_message_bytes + FRAME_CAP_SLACK_BYTES)
