"""Local hardening at start: a private run dir, no stale or stolen ipc sockets, a warning for root, and the
open-file limit raised to what the system allows.

Anyone who can open an ipc socket file can talk to whoever listens on it, so the internal sockets live
in a run dir only the daemon's user may enter. libzmq unlinks an existing socket file when it binds,
which would silently take the socket of another daemon still using it; so a file left there is
removed only once nothing answers on it (its daemon was killed), and refused otherwise.
"""

from __future__ import annotations

import errno
import logging
import os
import resource
import socket
import stat
from pathlib import Path

import zmq

from packrat_daemon.wire.endpoints import allow_ipv6
from packrat_daemon.wire.errors import ConfigError

log = logging.getLogger("packrat.daemon")


def private_dir(path: str | os.PathLike[str]) -> Path:
    """`path`, created with mode 0700 if missing; ConfigError unless this user owns it and nobody else may enter."""
    path = Path(path)
    try:
        path.mkdir(mode=0o700, parents=True)
    except FileExistsError:
        pass
    except OSError as exc:
        raise ConfigError(f"cannot create the run dir {path}: {exc.strerror}; choose another --run-dir") from None
    status = path.lstat()
    if not stat.S_ISDIR(status.st_mode):
        raise ConfigError(f"the run dir {path} is not a folder (a link or a file); choose another --run-dir")
    user = os.geteuid()
    if status.st_uid != user:
        raise ConfigError(
            f"the run dir {path} belongs to uid {status.st_uid}, not to this user (uid {user}), who could then "
            f"reach the workers' sockets; choose another --run-dir, or `chown {user} {path}`"
        )
    if status.st_mode & 0o077:
        raise ConfigError(
            f"other users may enter the run dir {path} (mode {stat.filemode(status.st_mode)}) and reach the "
            f"workers' sockets; run `chmod 700 {path}` (under systemd: RuntimeDirectoryMode=0700)"
        )
    return path


def claim_ipc(path: str | os.PathLike[str]) -> None:
    """Make way to bind an ipc socket at `path`: remove a stale socket file, refuse a live one."""
    path = Path(path)
    try:
        status = path.lstat()
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(status.st_mode):
        raise ConfigError(f"{path} exists and is not a socket; remove it or choose another endpoint or run dir")
    if _answers(path):
        raise ConfigError(
            f"another process listens on {path}: is another daemon using it? stop it, or give each daemon its "
            "own --run-dir and ipc endpoint"
        )
    path.unlink(missing_ok=True)
    log.info("removed %s, a socket file left by a daemon that did not stop cleanly", path)


def _answers(path: Path) -> bool:
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(str(path))
    except OSError as exc:
        if exc.errno in (errno.ECONNREFUSED, errno.ENOENT):
            return False
        raise ConfigError(f"cannot tell whether {path} is in use: {exc.strerror}; remove it if it is not") from None
    finally:
        probe.close()
    return True


def warn_if_root() -> None:
    """Running as root outside systemd is allowed, but every worker then runs the model as root."""
    if os.geteuid() == 0 and "INVOCATION_ID" not in os.environ:
        log.warning(
            "running as root: the model's code and every worker run with full privileges; run as an "
            "unprivileged user (the systemd unit uses DynamicUser=yes, see docs/security.md)"
        )


# Below this, a few hundred client connections (each a descriptor) or shared-memory slabs run the daemon out.
FEW_FDS = 4096


def raise_fd_limit() -> int:
    """Raise the soft limit on open files to the hard limit, and log it; the limit now in force.

    Every client connection, every worker's socket and every shared-memory slab is a file descriptor, and the
    usual soft limit (1 024) is reached by a thousand idle connections: new clients then get no answer at
    all. The hard limit is what the administrator allows (systemd: LimitNOFILE=, 524 288 by default), so
    the daemon takes all of it, as nginx's worker_rlimit_nofile or systemd's own services do.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = _nr_open() if hard == resource.RLIM_INFINITY else hard
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError) as exc:
            log.warning("file descriptors: could not raise the soft limit %d to %d (%s)", soft, target, exc)
        else:
            log.info("file descriptors: soft limit raised from %d to %d (the hard limit)", soft, target)
            soft = target
    if soft != resource.RLIM_INFINITY and soft < FEW_FDS:
        log.warning(
            "file descriptors: only %d may be open (the hard limit); each client connection and shared-memory "
            "slab takes one, so raise it (`ulimit -Hn`, or LimitNOFILE= under systemd)", soft
        )  # fmt: skip
    return soft


def _nr_open() -> int:
    """The kernel's ceiling on a process's open files (a hard limit of "unlimited" cannot be set as a soft one)."""
    try:
        return int(Path("/proc/sys/fs/nr_open").read_text())
    except (OSError, ValueError):
        return 1 << 20


def check_endpoint(context: zmq.Context, endpoint: str) -> None:
    """Bind the serving endpoint once and let it go, so a port in use or a malformed endpoint fails now,
    not after the model has loaded and been profiled; the frontend binds it for good later."""
    probe = context.socket(zmq.ROUTER)
    probe.setsockopt(zmq.LINGER, 0)
    allow_ipv6(probe, endpoint)  # as the frontend's socket must be, for tcp://[::1]:P
    try:
        probe.bind(endpoint)
    except zmq.ZMQError as exc:
        raise ConfigError(
            f"cannot serve on endpoint {endpoint!r}: {exc}; free the port or choose another --endpoint "
            f"(tcp://HOST:PORT or ipc://PATH)"
        ) from None
    finally:
        probe.close()
