"""Handlers of a test's own for the signals the daemon handles, to check that the daemon puts them back."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator

HANDLED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


@contextlib.contextmanager
def own_handlers() -> Iterator[dict[int, object]]:
    """Handlers of our own for the daemon's signals, as a program embedding `serve` would have."""
    before = {signum: signal.getsignal(signum) for signum in HANDLED}
    ours = {signum: (lambda *_: None) for signum in HANDLED}
    for signum, handler in ours.items():
        signal.signal(signum, handler)
    try:
        yield ours
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)
