"""Handlers of a test's own for the signals the daemon handles, to check that the daemon puts them back."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator

from packrat_daemon.signals import SIGNALS, SILENT

HANDLED = (*SIGNALS, *SILENT)


@contextlib.contextmanager
def own_handlers() -> Iterator[dict[int, object]]:
    """Handlers of our own for the daemon's signals, as a program embedding `serve` would have."""
    before = {signum: signal.getsignal(signum) for signum in HANDLED}
    ours: dict[int, object] = {}
    for signum in HANDLED:
        signal.signal(signum, lambda *_: None)
        ours[signum] = signal.getsignal(signum)
    try:
        yield ours
    finally:
        for signum, previous in before.items():
            signal.signal(signum, previous)
