"""systemd notification (sd_notify(3)) for units of Type=notify, and the service watchdog.

The protocol is one datagram per state change, a newline-separated list of assignments, sent to the
AF_UNIX socket named by $NOTIFY_SOCKET ("@" at the start means Linux's abstract namespace). Outside
systemd the variable is unset and every call is a no-op, so the daemon calls it unconditionally.

The watchdog (WatchdogSec= in the unit): systemd passes the interval in $WATCHDOG_USEC and kills and
restarts a service that sends no WATCHDOG=1 within it. The daemon pings from its main loop, so a loop that
stops turning stops the pings; and it withholds them while the worker pool has stayed off its plan (a
worker missing, or one of an older plan not yet gone) for longer than the time start-up gives the workers
to become ready, because a pool that has not recovered by then will not recover by itself, and a restart
is the cure.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import socket
import time
from collections.abc import Callable

log = logging.getLogger("packrat.daemon")

# READY=1 at start and after a reload; the plan itself is in the STATUS= lines the reconciler sends.
READY = "READY=1"
STOPPING = "STOPPING=1"
WATCHDOG = "WATCHDOG=1"


def status(text: str) -> str:
    """The one-line status `systemctl status` shows (systemd keeps it until the next STATUS=)."""
    return f"STATUS={text}"


def reloading() -> str:
    """RELOADING=1 with the CLOCK_MONOTONIC time in microseconds, which Type=notify-reload requires."""
    return f"RELOADING=1\nMONOTONIC_USEC={time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000}"


def sd_notify(message: str) -> None:
    """Tell systemd about our state, if it started us; a notification is never worth failing for."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return
    if address.startswith("@"):
        address = "\0" + address[1:]
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock, contextlib.suppress(OSError):
        sock.sendto(message.encode(), address)


def watchdog_interval_s(environ: dict[str, str] | os._Environ[str], pid: int) -> float | None:
    """The watchdog timeout systemd asked for, in seconds; None when there is none for this process.

    WATCHDOG_PID names the process the watchdog is meant for (sd_watchdog_enabled(3)): a child that inherited
    the variables is not it. A value that does not parse is no watchdog, as in sd_watchdog_enabled.
    """
    usec, owner = environ.get("WATCHDOG_USEC", ""), environ.get("WATCHDOG_PID", "")
    if not usec.isdigit() or int(usec) == 0:
        return None
    if owner and (not owner.isdigit() or int(owner) != pid):
        return None
    return int(usec) / 1e6


class Watchdog:
    """WATCHDOG=1 every half interval from the main loop, while the pool is healthy.

    Healthy: the loop turns (the pings come from it), and the pool has not stayed off its plan for longer
    than `off_plan_bound_s`. The pool is sampled when a ping is due, so a pool that keeps losing a worker and
    recovering between two samples counts as healthy, as it should: it serves.
    """

    def __init__(self, interval_s: float | None, off_plan_bound_s: float) -> None:
        self.interval_s = interval_s
        self.off_plan_bound_s = off_plan_bound_s
        self.due = math.inf if interval_s is None else 0.0  # time.monotonic() of the next ping
        self.off_since: float | None = None
        self.starving = False  # pings withheld: the pool stayed off its plan too long

    @classmethod
    def from_environment(cls, off_plan_bound_s: float) -> Watchdog:
        interval = watchdog_interval_s(os.environ, os.getpid())
        if interval is not None:
            log.info("systemd watchdog: a ping every %.1f s while the pool is at its plan", interval / 2)
        return cls(interval, off_plan_bound_s)

    def tick(self, now: float, at_plan: Callable[[], bool]) -> None:
        """Called on every turn of the loop; cheap unless a ping is due. `at_plan`: the pool is as planned."""
        if now < self.due:
            return
        assert self.interval_s is not None  # due is infinite otherwise
        self.due = now + self.interval_s / 2  # twice per interval, so one late turn is not a missed ping
        if at_plan():
            self.off_since = None
        elif self.off_since is None:
            self.off_since = now
        if self.off_since is not None and now - self.off_since > self.off_plan_bound_s:
            if not self.starving:
                self.starving = True
                message = (
                    f"the pool has not matched its plan for {now - self.off_since:.0f} s (more than the "
                    f"{self.off_plan_bound_s:.0f} s start-up allows workers to become ready): withholding the "
                    "watchdog's pings, so systemd restarts the daemon"
                )
                log.error("%s", message)
                sd_notify(status(message))
            return
        if self.starving:
            self.starving = False
            log.info("the pool is back at its plan: watchdog pings resume")
        sd_notify(WATCHDOG)
