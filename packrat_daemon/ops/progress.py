"""A small progress line with ETA for long work (profiling, start-up), on stderr.

On a terminal it redraws one line; elsewhere (logs, CI, systemd) it prints one line per step so the
journal shows progress without control characters.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    def __init__(self, total: int, label: str, stream: TextIO | None = None, enabled: bool = True) -> None:
        self.total = max(total, 1)
        self.label = label
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.done = 0
        self.started = time.monotonic()
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()

    def advance(self, note: str = "", steps: int = 1) -> None:
        self.done += steps
        self._draw(note)

    def note(self, note: str) -> None:
        self._draw(note)

    def close(self) -> None:
        if self.enabled and self.tty:
            self.stream.write("\n")
            self.stream.flush()

    def _draw(self, note: str) -> None:
        if not self.enabled:
            return
        elapsed = time.monotonic() - self.started
        eta = elapsed / self.done * (self.total - self.done) if self.done else float("nan")
        width = 24
        filled = int(width * min(self.done, self.total) / self.total)
        bar = "#" * filled + "-" * (width - filled)
        eta_text = "?" if eta != eta else _clock(eta)
        line = f"{self.label} [{bar}] {self.done}/{self.total} elapsed {_clock(elapsed)} eta {eta_text} {note}"
        if self.tty:
            self.stream.write("\r\x1b[2K" + line)
        else:
            self.stream.write(line + "\n")
        self.stream.flush()


def _clock(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 60}:{seconds % 60:02d}"
