"""systemd notification (sd_notify(3)) for units of Type=notify.

The protocol is one datagram per state change, a newline-separated list of assignments, sent to the
AF_UNIX socket named by $NOTIFY_SOCKET ("@" at the start means Linux's abstract namespace). Outside
systemd the variable is unset and every call is a no-op, so the daemon calls it unconditionally.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time

READY = "READY=1\nSTATUS=serving"
STOPPING = "STOPPING=1"


def reloading() -> str:
    """RELOADING=1 with the CLOCK_MONOTONIC time in microseconds, which Type=notify-reload requires."""
    return f"RELOADING=1\nMONOTONIC_USEC={time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000}"


def reloaded(plan: str) -> str:
    """READY=1 after a reload, with the plan now served as the unit's status line."""
    return f"READY=1\nSTATUS=serving {plan}"


def sd_notify(message: str) -> None:
    """Tell systemd about our state, if it started us; a notification is never worth failing for."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return
    if address.startswith("@"):
        address = "\0" + address[1:]
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock, contextlib.suppress(OSError):
        sock.sendto(message.encode(), address)
