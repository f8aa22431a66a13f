"""`packrat coordinate`'s exclusive hold on the daemons it steers: a lock file in each daemon's run dir (the
folder of its control socket), `flock`ed for the coordinator's whole life.

Two coordinators on the same daemons would each assign them shares and undo the other's moves (the second one
logged an error at every look). The lock makes the second refuse to start instead, naming the first by the pid
the first wrote into the file. `flock` is released by the kernel when its holder exits, however it exits, so a
coordinator that was killed leaves no lock behind: the file stays, and the next coordinator takes it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator, Sequence
from pathlib import Path

from packrat_daemon.coordinate.shares import CoordinateError
from packrat_daemon.ops.hardening import private_dir

LOCK_FILE = "coordinator.lock"


class AlreadyCoordinated(CoordinateError):
    """Another `packrat coordinate` steers one of the daemons given; exit status 2, as for any error at start."""

    def __init__(self, message: str, name: str, path: Path, pid: int | None) -> None:
        super().__init__(message)
        self.name = name
        self.path = path
        self.pid = pid


def lock_path(endpoint: str) -> Path:
    """The lock file of the daemon whose control socket is `endpoint` (ipc://RUN_DIR/control.ipc, or another ipc
    path `control_endpoint` accepted: always in a folder of the daemon's user alone)."""
    return Path(endpoint.removeprefix("ipc://")).parent / LOCK_FILE


@contextlib.contextmanager
def coordinating(daemons: Sequence[tuple[str, str]]) -> Iterator[list[Path]]:
    """Hold every daemon's lock, (name, control endpoint) each, for the block; AlreadyCoordinated, with none held,
    if another coordinator holds any of them. Yields the lock files held."""
    held: dict[Path, int] = {}
    try:
        for name, endpoint in daemons:
            path = lock_path(endpoint)
            # The daemon may not have started yet: its run dir is made as the daemon would make it (mode 0700),
            # and one that other users may enter is refused, since they could then take the lock themselves.
            private_dir(path.parent)
            key = Path(os.path.realpath(path))
            if key not in held:  # two names for one folder: one lock (a second flock here would fail on ourselves)
                held[key] = _take(name, path)
        yield list(held)
    finally:
        for fd in held.values():
            os.close(fd)  # releases the flock; the file is left for the next coordinator (removing it would race)


def _take(name: str, path: Path) -> int:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        pid = _holder(fd)
        os.close(fd)
        who = "another `packrat coordinate`" + (f" (pid {pid})" if pid is not None else " (its pid not written yet)")
        stop = f"stop it first (`kill {pid}`)" if pid is not None else "stop it first"
        raise AlreadyCoordinated(
            f"daemon {name!r} is already steered by {who}, which holds {path}; two coordinators would undo each "
            f"other's moves: {stop}, or leave this daemon out of --daemon",
            name, path, pid,
        ) from None  # fmt: skip
    except OSError as exc:
        os.close(fd)
        raise CoordinateError(f"cannot lock {path} for daemon {name!r}: {exc.strerror}; check the run dir") from None
    # Held: say who holds it, for the coordinator that comes next. Truncated first, so no longer pid's digits stay.
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def _holder(fd: int) -> int | None:
    """The pid the holder wrote, or None in the instant between its lock and its write."""
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None
