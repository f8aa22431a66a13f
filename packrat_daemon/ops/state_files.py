"""The state folder's files, held to the run dir's rules (docs/state.md, docs/security.md).

A daemon (often root, or a unit's user) reads and writes `--state-dir`, so the folder and its files must be
this user's alone: the folder is owned by this user (or root, as systemd's StateDirectory= may make it),
not a symbolic link, and not writable by group or others; otherwise another local user could plant a
link (`.learned-profile.json.tmp` → a root-only file) and have the daemon overwrite what it points to.

Every access goes through a descriptor of the folder opened without following links, and every file is
opened relative to it with O_NOFOLLOW: a link in place of a file is refused, never followed. The
temporary file of a write is created with O_EXCL (a stale one is unlinked first: unlinking a link
removes the link, not its target) and removed again when the write fails (a full disk leaves no empty
`.tmp`). A read is bounded (`MAX_STATE_BYTES`) before it is parsed, and its nesting
while it is parsed, so neither a link to /dev/zero nor 100 000 `[` costs more than a refusal. What is refused is a
`StateError`: the caller sets the file aside and starts as if there were none.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from packrat_daemon.wire.errors import ConfigError

MAX_STATE_BYTES = 8 << 20  # a manycore machine's profile for every runtime and precision fits many times over


class StateError(ValueError):
    """A state file that cannot be used as it is (it is set aside)."""


def check_folder(folder: Path) -> None:
    """`folder` exists (made private if new) and holds to the run dir's rules: ConfigError, saying what to do,
    before the model loads otherwise (a daemon that cannot keep what it learns should not find out after
    measuring)."""
    try:
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as exc:
        raise ConfigError(
            f"--state-dir {folder}: cannot create it ({exc.strerror}); give a folder this user can write "
            "(under systemd, StateDirectory= makes one)"
        ) from None
    fd = _open_folder(folder)
    os.close(fd)
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ConfigError(f"--state-dir {folder}: this user cannot write it; give a folder it can write")


def _open_folder(folder: Path) -> int:
    """A descriptor of `folder`, checked: not a link, owned by this user or root, written by nobody else."""
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise ConfigError(
                f"--state-dir {folder} is a symbolic link or not a folder; give the real folder (a link could "
                "be changed to point elsewhere)"
            ) from None
        raise ConfigError(
            f"--state-dir {folder}: cannot open it ({exc.strerror}); give a folder this user can write"
        ) from None
    status = os.fstat(fd)
    why = _foreign(status)
    if why is not None:
        os.close(fd)
        user = os.geteuid()
        raise ConfigError(
            f"--state-dir {folder} {why}, so another user could plant files the daemon reads or links it "
            f"writes through; run `chown {user} {folder} && chmod 700 {folder}` or give a private folder "
            "(under systemd, StateDirectory= makes one)"
        )
    return fd


def _foreign(status: os.stat_result) -> str | None:
    """Why a folder or file with `status` may be written by someone other than this user (or root), or None."""
    user = os.geteuid()
    if status.st_uid not in (user, 0):
        return f"belongs to uid {status.st_uid}, neither this user (uid {user}) nor root"
    if status.st_mode & 0o022:
        return f"may be written by group or others (mode {stat.filemode(status.st_mode)})"
    return None


@contextlib.contextmanager
def _folder(folder: Path) -> Iterator[int]:
    fd = _open_folder(folder)
    try:
        yield fd
    finally:
        os.close(fd)


def read_bounded(path: Path) -> bytes | None:
    """`path`'s bytes, None when there is no such file; StateError when it is a link, not a plain file, not
    this user's (or root's), writable by others, or over MAX_STATE_BYTES. Never reads past the bound."""
    with _folder(path.parent) as folder:
        try:
            # O_NONBLOCK: a FIFO planted in the file's place must not hang the start in open().
            fd = os.open(path.name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=folder)
        except FileNotFoundError:
            return None
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise StateError("it is a symbolic link, which the daemon never follows") from None
            raise
        try:
            status = os.fstat(fd)
            if not stat.S_ISREG(status.st_mode):
                raise StateError(f"it is not a plain file (mode {stat.filemode(status.st_mode)})")
            why = _foreign(status)
            if why is not None:
                raise StateError(f"it {why}")
            if status.st_size > MAX_STATE_BYTES:
                raise StateError(f"it is {status.st_size} bytes, more than the {MAX_STATE_BYTES} a state file holds")
            chunks, size = [], 0
            while chunk := os.read(fd, min(1 << 20, MAX_STATE_BYTES + 1 - size)):
                chunks.append(chunk)
                size += len(chunk)
                if size > MAX_STATE_BYTES:  # grew while read
                    raise StateError(f"it holds more than the {MAX_STATE_BYTES} bytes a state file holds")
            return b"".join(chunks)
        finally:
            os.close(fd)


def load_json(raw: bytes) -> Any:
    """The JSON value of `raw`; StateError for JSON nested deeper than the interpreter's recursion limit (the
    decoder counts its depth and stops there, in linear time), which no state file comes near (it nests 6)."""
    try:
        return json.loads(raw.decode("utf-8"))
    except RecursionError:
        raise StateError("its JSON nests too deeply to be a state file (which nests 6 levels)") from None


def write_atomically(path: Path, data: bytes) -> None:
    """`path` holds either its old bytes or `data`, whatever is killed when: write a temporary file created
    afresh (O_EXCL, O_NOFOLLOW: a link planted under its name is removed, never written through), fsync it,
    rename it over `path`, fsync the folder (so the rename itself survives a power cut). A failed write
    removes its temporary file (a full disk leaves nothing behind) and raises OSError."""
    tmp = f".{path.name}.tmp"
    with _folder(path.parent) as folder:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp, dir_fd=folder)  # left by a kill mid-write (or planted): the link goes, not its target
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(tmp, flags, 0o600, dir_fd=folder)
        try:
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, path.name, src_dir_fd=folder, dst_dir_fd=folder)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=folder)
            raise
        os.fsync(folder)


def set_aside(path: Path) -> str:
    """Rename `path` out of the way (kept for a look) as `NAME.set-aside-TIME`; the new name. Whatever `path`
    is (a link is renamed as a link, never followed). OSError when it cannot be renamed."""
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%SZ")
    aside = f"{path.name}.set-aside-{stamp}"
    with _folder(path.parent) as folder:
        os.replace(path.name, aside, src_dir_fd=folder, dst_dir_fd=folder)
    return aside
