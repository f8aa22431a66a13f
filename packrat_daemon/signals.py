"""The signal table and the queue the daemon's loop reads it from (after uvicorn's server).

A handler only appends the event its signal asks for and writes a byte to a wake-up pipe, which the loop
polls with its sockets: the loop acts on the events between two polls, never inside a handler.
"""

from __future__ import annotations

import contextlib
import signal
import socket
from collections import deque
from collections.abc import Iterator
from types import FrameType

# The signal table: what each handled signal asks the loop to do.
SIGNALS = {signal.SIGTERM: "stop", signal.SIGINT: "stop", signal.SIGHUP: "reload"}


class SignalQueue:
    """The events of the signals received, and the pipe that wakes the loop's poll for them."""

    def __init__(self) -> None:
        self.events: deque[str] = deque()
        self.wake_r, self.wake_w = socket.socketpair()
        self.wake_w.setblocking(False)  # a handler must never block; one unread wake-up byte is enough

    def _enqueue(self, signum: int, _frame: FrameType | None) -> None:
        self.events.append(SIGNALS[signal.Signals(signum)])
        with contextlib.suppress(OSError):
            self.wake_w.send(b"\0")

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        """Handle SIGNALS inside the block; after it the handlers from before are back, the pipe closed."""
        previous = {signum: signal.signal(signum, self._enqueue) for signum in SIGNALS}
        try:
            yield
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, signal.SIG_DFL if handler is None else handler)
            self.wake_r.close()
            self.wake_w.close()
