"""The frontend's last call: after the drain, every message that still reaches the socket is answered (SHUTTING_DOWN;
`info` is still answered) until it has been quiet a while, and a little longer after that moment, logged.

Closing at the first moment the queue is empty loses the request a client sends right after its last reply.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable

import zmq

log = logging.getLogger("packrat.daemon")

# After the drain the daemon keeps answering SHUTTING_DOWN until no message has come for REFUSE_QUIET_S. The quiet
# time is longer than a client's turn-around between a reply and its next send.
REFUSE_QUIET_S = 0.1
# At most this long in all: a client flooding the socket must not keep the daemon from exiting.
REFUSE_WAITING_S = 1.0
# After the last call the socket is still read this long: a request sent just before it, still on its way
# through the client's and the kernel's buffers, is answered too.
REFUSE_GRACE_S = 0.05


def refuse_until_quiet(
    socket: zmq.Socket,
    read: Callable[[], int],
    waiting_s: float = REFUSE_WAITING_S,
    quiet_s: float = REFUSE_QUIET_S,
    grace_s: float = REFUSE_GRACE_S,
) -> None:
    """`read` whatever reaches `socket` until it has been quiet for `quiet_s`, at most `waiting_s` in all; log that
    moment, the last call, and go on reading for `grace_s`."""
    now = time.monotonic()
    stop, quiet_until = now + waiting_s, now + quiet_s
    while now < min(stop, quiet_until):
        if socket.poll(math.ceil((min(stop, quiet_until) - now) * 1000)):
            read()
            quiet_until = time.monotonic() + quiet_s
        now = time.monotonic()
    # The monotonic clock is the machine's: a client can tell which of its requests went before the last call.
    why = "a client still sending" if now >= stop else f"quiet for {quiet_s * 1000:.0f} ms"
    log.info("last call at monotonic %.6f (%s); closing the frontend %.0f ms later", now, why, grace_s * 1000)
    grace_end = now + grace_s
    while (left := grace_end - time.monotonic()) > 0:
        if socket.poll(math.ceil(left * 1000)):
            read()
