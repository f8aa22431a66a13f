"""The signal table and the queue the daemon's loop reads it from (after uvicorn's server).

A handler only appends the event its signal asks for and writes a byte to a wake-up pipe, which the loop
polls with its sockets: the loop acts on the events between two polls, never inside a handler (logging
there could deadlock on the logging lock the interrupted code holds).

Every catchable signal whose default would kill the daemon has a handler here or a deliberate default
(`DEFAULTS`, with the reason): SIGUSR1, SIGUSR2, SIGALRM and SIGQUIT used to kill it at once, with no drain,
no log line, no state saved, and the requests in flight lost.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import socket
from collections import deque
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

log = logging.getLogger("packrat.daemon")

STOP, RELOAD, STATUS, IGNORE = "stop", "reload", "status", "ignore"

# The signal table: what each handled signal asks the loop to do.
#   stop    drain (finish what is queued and in flight, up to drain_timeout_s), save the state, exit 0; a second
#           stop signal exits at once. SIGQUIT too (not a core dump: nothing of the daemon's own to inspect),
#           SIGXCPU (the soft CPU-time limit: drain before the hard one kills) and SIGPWR (power failing).
#   reload  re-read the configuration and profile, re-plan (SIGHUP, as for most daemons).
#   status  log one line of status (the plan, the workers, the queue): `kill -USR1 PID`.
#   ignore  log that it came and was ignored: no meaning here, and its default would kill the daemon.
SIGNALS: dict[int, str] = {
    signal.SIGTERM: STOP,
    signal.SIGINT: STOP,
    signal.SIGQUIT: STOP,
    signal.SIGXCPU: STOP,
    signal.SIGPWR: STOP,
    signal.SIGHUP: RELOAD,
    signal.SIGUSR1: STATUS,
    signal.SIGUSR2: IGNORE,
    signal.SIGALRM: IGNORE,
    signal.SIGVTALRM: IGNORE,
    signal.SIGPROF: IGNORE,
    signal.SIGIO: IGNORE,  # SIGPOLL
    signal.SIGSTKFLT: IGNORE,
    **dict.fromkeys(range(signal.SIGRTMIN, signal.SIGRTMAX + 1), IGNORE),  # real-time signals: default kills
}

# Ignored outright (SIG_IGN, as Python itself sets them at start): the failing call reports it instead.
SILENT = (signal.SIGPIPE, signal.SIGXFSZ)  # EPIPE on a closed peer; EFBIG on a file past RLIMIT_FSIZE

# The catchable signals left at their default, and why.
DEFAULTS: dict[int, str] = {
    signal.SIGTSTP: "stops the process (Ctrl-Z); SIGCONT resumes it: requests wait, none is lost",
    signal.SIGTTIN: "stops the process (background read from a terminal); the daemon reads none",
    signal.SIGTTOU: "stops the process (background write to a terminal); SIGCONT resumes it",
    signal.SIGCONT: "resumes a stopped process",
    signal.SIGCHLD: "ignored by default; the daemon reaps its template with waitpid",
    signal.SIGURG: "ignored by default",
    signal.SIGWINCH: "ignored by default",
    signal.SIGSEGV: "a fault: the process cannot go on; the kernel's core dump (and faulthandler) say where",
    signal.SIGBUS: "a fault, as SIGSEGV",
    signal.SIGFPE: "a fault, as SIGSEGV",
    signal.SIGILL: "a fault, as SIGSEGV",
    signal.SIGABRT: "abort(): a library found itself broken; the core dump says where",
    signal.SIGTRAP: "a debugger's breakpoint",
    signal.SIGSYS: "a bad system call (a seccomp filter): a fault, as SIGSEGV",
}


class SignalQueue:
    """The events of the signals received, and the pipe that wakes the loop's poll for them."""

    def __init__(self) -> None:
        self.events: deque[str] = deque()
        self.wake_r, self.wake_w = socket.socketpair()
        self.wake_w.setblocking(False)  # a handler must never block; one unread wake-up byte is enough
        self.noted: deque[int] = deque()  # the signals of the STATUS and IGNORE events, in order

    def _enqueue(self, signum: int, _frame: FrameType | None) -> None:
        event = SIGNALS[signum]
        if event in (STATUS, IGNORE):
            self.noted.append(signum)
        self.events.append(event)
        with contextlib.suppress(OSError):
            self.wake_w.send(b"\0")

    @property
    def interrupting(self) -> bool:
        """A stop or reload is waiting: start-up stops waiting for it (a status or ignored signal does not)."""
        return any(event in (STOP, RELOAD) for event in self.events)

    def note(self, event: str, status: Callable[[], dict[str, Any]]) -> None:
        """Act on a STATUS or IGNORE event, in the loop: log the status line, or that the signal was ignored."""
        signum = self.noted.popleft() if self.noted else 0
        name = signal.Signals(signum).name if signum in signal.Signals._value2member_map_ else f"signal {signum}"
        if event == IGNORE:
            log.warning("%s received and ignored (it means nothing to packrat; see the signal table)", name)
            return
        now = status()
        queue, workers = now.get("queue", {}), now.get("workers", [])
        serving = sum(bool(worker.get("serving")) for worker in workers)
        log.info("%s: status: generation %s, %d worker(s) (%d serving), %s request(s) queued, batch in flight %s, "
                 "accepting %s", name, now.get("generation"), len(workers), serving, queue.get("requests"),
                 queue.get("batch_in_flight"), queue.get("accepting"))  # fmt: skip

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        """Handle SIGNALS inside the block; after it the handlers from before are back, the pipe closed."""
        previous: dict[int, Any] = {signum: signal.signal(signum, self._enqueue) for signum in SIGNALS}
        previous |= {signum: signal.signal(signum, signal.SIG_IGN) for signum in SILENT}
        try:
            yield
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, signal.SIG_DFL if handler is None else handler)
            self.wake_r.close()
            self.wake_w.close()
