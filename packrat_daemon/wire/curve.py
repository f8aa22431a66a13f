"""ZeroMQ CURVE for the frontend: key files, loading them with checks, and which binds need keys.

Keys are ZeroMQ certificate files (the ZPL format czmq and pyzmq share): ``NAME.key`` holds the public
key and may be shared; ``NAME.key_secret`` holds the key pair and must stay private. The daemon
serves CURVE with its own key pair and lets in only clients whose public key is a ``.key`` file in its
allowed-clients folder, through a ZAP handler (pyzmq's ``zmq.auth``) that re-reads the folder when it
or a key file in it changes (by content, not only by the folder's mtime), so a key is revoked by deleting
its file and replaced by overwriting it. The list fails closed: a malformed key file empties it, every
client is refused and one ERROR says why, until the file is fixed. Torch-free: the client library imports this.
"""

from __future__ import annotations

import ipaddress
import logging
import math
import os
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zmq
import zmq.utils.z85
from zmq.auth.thread import ThreadAuthenticator

from packrat_daemon.wire.endpoints import allow_ipv6
from packrat_daemon.wire.errors import ConfigError

log = logging.getLogger("packrat.security")

PUBLIC_SUFFIX = ".key"
SECRET_SUFFIX = ".key_secret"
ZAP_DOMAIN = "packrat"
_KEY_LENGTH = 40  # a 32-byte Curve25519 key in Z85 text
REFUSAL_LOG_INTERVAL_S = 60.0
MAX_KEY_FILE_BYTES = 4096  # a certificate is ~200 bytes; read no more of a file (a link to /dev/zero)
MAX_ALLOWED_KEYS = 1000  # key files in the allowed-clients folder, each stat'ed at every handshake
# A file written again within the filesystem's timestamp tick can keep its size and mtime: for this long after
# the newest change the keys are re-read by content at every handshake (git's "racily clean" entries, the same).
RACY_NS = 2_000_000_000

Pathish = str | os.PathLike[str]


@dataclass(frozen=True)
class KeyPair:
    """A CURVE key pair, each key as 40 Z85 characters."""

    public: bytes
    secret: bytes


def curve_available() -> None:
    """ConfigError unless this libzmq was built with CURVE (pyzmq's wheels are)."""
    if not zmq.has("curve"):
        raise ConfigError(
            f"this libzmq ({zmq.zmq_version()}) was built without CURVE; install pyzmq from its wheels "
            "(pip install --force-reinstall pyzmq) or a libzmq built with libsodium"
        )


def write_key_pair(folder: Pathish, name: str) -> tuple[Path, Path]:
    """Write NAME.key (public, mode 0644) and NAME.key_secret (the pair, mode 0600); never overwrite.

    The secret file is created with its final mode, so it is never readable by others, not even briefly.
    """
    curve_available()
    if not name or "/" in name or name.startswith("."):
        raise ConfigError(f"key name {name!r} must be a plain file name, e.g. 'server' or 'client-alice'")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    public_path, secret_path = folder / f"{name}{PUBLIC_SUFFIX}", folder / f"{name}{SECRET_SUFFIX}"
    for path in (public_path, secret_path):
        if path.exists():
            raise ConfigError(f"{path} already exists; delete it first or choose another name")
    public, secret = zmq.curve_keypair()
    _create(secret_path, _certificate(public, secret), 0o600)
    _create(public_path, _certificate(public, None), 0o644)
    return public_path, secret_path


def _certificate(public: bytes, secret: bytes | None) -> str:
    kind = "secret key pair: keep it private (mode 0600)" if secret else "public key: safe to share"
    lines = [f"#   ZeroMQ CURVE {kind}; written by `packrat keygen`", "curve", f'    public-key = "{public.decode()}"']
    if secret is not None:
        lines.append(f'    secret-key = "{secret.decode()}"')
    return "\n".join(lines) + "\n"


def _create(path: Path, text: str, mode: int) -> None:
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(descriptor, "w", encoding="ascii") as handle:
        handle.write(text)
    os.chmod(path, mode)  # the umask may have narrowed the public file's mode


def load_key_pair(path: Pathish) -> KeyPair:
    """The key pair in a ``.key_secret`` file, which only its owner may read."""
    path = Path(path)
    public, secret = _read_certificate(path)
    if secret is None:
        raise ConfigError(f"{path} holds only a public key; give the {SECRET_SUFFIX} file `packrat keygen` wrote")
    mode = path.stat().st_mode
    if mode & 0o077:
        raise ConfigError(
            f"{path} holds a secret key but other users may access it (mode {stat.filemode(mode)}); "
            f"run `chmod 600 {path}`"
        )
    return KeyPair(public, secret)


def load_public_key(source: Pathish | bytes) -> bytes:
    """A public key: a ``.key`` (or ``.key_secret``) file, or the 40 Z85 characters themselves."""
    if isinstance(source, bytes):
        return _checked_key(source, "the public key given")
    public, _ = _read_certificate(Path(source))
    return public


def _read_certificate(path: Path) -> tuple[bytes, bytes | None]:
    """(public, secret or None) of a ZeroMQ certificate file (pyzmq's zmq.auth.load_certificate's reading),
    read bounded: only a plain file of at most MAX_KEY_FILE_BYTES."""
    try:
        with open(path, "rb") as handle:
            status = os.fstat(handle.fileno())
            if not stat.S_ISREG(status.st_mode) or status.st_size > MAX_KEY_FILE_BYTES:
                raise ConfigError(f"{path} is not a key file (not a plain file of at most {MAX_KEY_FILE_BYTES} bytes)")
            data = handle.read(MAX_KEY_FILE_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"cannot read the key file {path}: {exc}; create keys with `packrat keygen`") from None
    public = secret = None
    for line in data.splitlines():
        line = line.strip()
        if line.startswith(b"public-key") and b"=" in line:
            public = line.split(b"=", 1)[1].strip(b" \t'\"")
        elif line.startswith(b"secret-key") and b"=" in line:
            secret = line.split(b"=", 1)[1].strip(b" \t'\"")
    if public is None:
        raise ConfigError(f"{path} is not a ZeroMQ key file (no public-key line); use `packrat keygen`")
    where = str(path)
    return _checked_key(public, where), None if secret is None else _checked_key(secret, where)


def _checked_key(key: bytes, where: str) -> bytes:
    if len(key) != _KEY_LENGTH:
        raise ConfigError(f"{where}: a CURVE key is {_KEY_LENGTH} Z85 characters, found {len(key)}")
    try:
        zmq.utils.z85.decode(key)
    except (ValueError, KeyError):
        raise ConfigError(f"{where}: the key is not valid Z85 text") from None
    return key


# ---------------------------------------------------------------------------------- the client's side


@dataclass(frozen=True)
class ClientKeys:
    """What a CURVE client needs: its own key pair and the server's public key."""

    own: KeyPair
    server_public: bytes

    @classmethod
    def load(cls, key: Pathish | KeyPair, server_key: Pathish | bytes) -> ClientKeys:
        """`key`: the client's ``.key_secret`` file (or a KeyPair); `server_key`: the server's ``.key`` file
        (or its 40 Z85 characters)."""
        curve_available()
        own = key if isinstance(key, KeyPair) else load_key_pair(key)
        return cls(own, load_public_key(server_key))

    def apply(self, socket: zmq.Socket) -> None:
        """Make `socket` a CURVE client of the server; before it connects."""
        socket.setsockopt(zmq.CURVE_SERVERKEY, self.server_public)
        socket.setsockopt(zmq.CURVE_PUBLICKEY, self.own.public)
        socket.setsockopt(zmq.CURVE_SECRETKEY, self.own.secret)


# ---------------------------------------------------------------------------------- the server's side


class AllowedClients:
    """The public keys in a folder of ``.key`` files; read again whenever the folder or one of them changes.

    Each handshake asks `callback`, which first looks at the folder: its own stamp and every key file's
    (inode, size, mtime, ctime), at most MAX_ALLOWED_KEYS of them. A changed stamp, or one within RACY_NS of
    its last change, re-reads every key, so adding, deleting or overwriting a key takes effect for the next
    connection without a restart. A folder that cannot be read or a key file that is not one fails closed:
    `names` is emptied (every client refused) and `error` says why, logged once per change.
    """

    def __init__(self, folder: Pathish) -> None:
        self.folder = Path(folder)
        self._stamp: tuple[Any, ...] | None = None
        self._settled_ns = 0  # time.time_ns() after which an unchanged stamp means unchanged keys
        self.names: dict[bytes, str] = {}
        self.error: str | None = None  # why every client is refused now, if it is so
        self._refused: tuple[bytes, float] = (b"", -math.inf)  # the last key refused, and when it was logged
        self.refresh()
        if self.error is not None:
            raise ConfigError(self.error)
        if not self.names:
            raise ConfigError(
                f"the allowed-clients folder {self.folder} holds no {PUBLIC_SUFFIX} file; copy each client's "
                f"public key there (`packrat keygen NAME` writes NAME{PUBLIC_SUFFIX})"
            )

    def refresh(self) -> None:
        """Re-read the keys if the folder or a key file changed; fail closed (see the class)."""
        now = time.time_ns()
        try:
            stamp, newest = self._look()
        except ConfigError as exc:
            self._fail(str(exc), ("unreadable", str(exc)), now)
            return
        if stamp == self._stamp and now > self._settled_ns:
            return
        try:
            names = {_read_certificate(self.folder / name)[0]: name.removesuffix(PUBLIC_SUFFIX) for name in stamp[1]}
        except ConfigError as exc:
            self._fail(str(exc), stamp, newest)
            return
        if self.error is not None:
            log.warning("allowed clients: %s reads again; %d key(s) admitted", self.folder, len(names))
        self.names, self.error, self._stamp, self._settled_ns = names, None, stamp, newest + RACY_NS

    def _look(self) -> tuple[tuple[Any, ...], int]:
        """(the stamp of the folder and its key files, the newest change among them in ns); ConfigError when the
        folder is not one that may hold keys."""
        try:
            status = self.folder.stat()
            entries = sorted(e.name for e in os.scandir(self.folder) if e.name.endswith(PUBLIC_SUFFIX))
        except OSError as exc:
            raise ConfigError(f"cannot read the allowed-clients folder {self.folder}: {exc.strerror}") from None
        if not stat.S_ISDIR(status.st_mode):
            raise ConfigError(f"the allowed-clients path {self.folder} is not a folder")
        if status.st_mode & 0o022:
            raise ConfigError(
                f"other users may add keys to the allowed-clients folder {self.folder} "
                f"(mode {stat.filemode(status.st_mode)}); run `chmod go-w {self.folder}`"
            )
        if len(entries) > MAX_ALLOWED_KEYS:
            raise ConfigError(
                f"the allowed-clients folder {self.folder} holds {len(entries)} {PUBLIC_SUFFIX} files, more than "
                f"{MAX_ALLOWED_KEYS}; remove the keys no longer used"
            )
        files: list[tuple[str, tuple[int, ...] | None]] = []
        newest = status.st_mtime_ns
        for name in entries:
            try:
                info = os.stat(self.folder / name)
            except OSError:
                info = None  # gone since the listing (or a dangling link): the read below says which
            if info is None:
                files.append((name, None))
                continue
            files.append((name, (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)))
            newest = max(newest, info.st_mtime_ns, info.st_ctime_ns)
        return ((status.st_mtime_ns, status.st_ino), tuple(entries), tuple(files)), newest

    def _fail(self, why: str, stamp: tuple[object, ...], newest: int) -> None:
        """Fail closed: nobody is admitted; one ERROR per change of the folder, not one per handshake."""
        if stamp != self._stamp or why != self.error:
            log.error("allowed clients: %s; every CURVE client is refused until it is fixed", why)
        self.names, self.error, self._stamp, self._settled_ns = {}, why, stamp, newest + RACY_NS

    def callback(self, domain: str, key: bytes) -> bool:
        """The ZAP handler's question, from its thread: may this client's key (Z85) connect?"""
        self.refresh()  # never raises: a folder gone wrong refuses everyone (fails closed)
        name = self.names.get(key)
        if name is None:
            # A refused client reconnects every 100 ms or so: one warning per key and minute, not each time.
            now = time.monotonic()
            last_key, logged = self._refused
            level = logging.WARNING if key != last_key or now - logged >= REFUSAL_LOG_INTERVAL_S else logging.DEBUG
            if level == logging.WARNING:
                self._refused = (key, now)
            log.log(level, "refused a CURVE client with an unknown key %s", key.decode(errors="replace"))
            return False
        log.info("CURVE client %s connected", name)
        return True


@dataclass(frozen=True)
class FrontendSecurity:
    """How the frontend is protected: CURVE with an allow list, or plaintext (local, or public by choice)."""

    endpoint: str
    keys: KeyPair | None
    allowed: AllowedClients | None
    local: bool

    @classmethod
    def check(
        cls, endpoint: str, server_key: str | None, allowed_clients: str | None, insecure_public: bool
    ) -> FrontendSecurity:
        """The settings checked together; ConfigError says what to change."""
        local = is_local_endpoint(endpoint)
        if server_key is None:
            if allowed_clients is not None:
                raise ConfigError("allowed_clients is set but server_key is not; give the server's key pair too")
            if not local and not insecure_public:
                raise ConfigError(
                    f"{endpoint} is reachable beyond this machine, so anyone who can reach it could use the model; "
                    "give keys (`packrat keygen server`, then --server-key server.key_secret and --allowed-clients "
                    "FOLDER of clients' .key files; see docs/security.md), bind 127.0.0.1 or ipc://, or accept "
                    "the risk with --insecure-public"
                )
            return cls(endpoint, None, None, local)
        curve_available()
        if allowed_clients is None:
            raise ConfigError(
                "server_key is set but allowed_clients is not; give --allowed-clients, a folder of the public "
                ".key files of the clients that may connect"
            )
        return cls(endpoint, load_key_pair(server_key), AllowedClients(allowed_clients), local)

    def describe(self) -> str:
        if self.allowed is not None:
            return f"CURVE, {len(self.allowed.names)} allowed client key(s) in {self.allowed.folder}"
        return "plaintext, this machine only" if self.local else "PLAINTEXT AND PUBLIC (--insecure-public)"

    def apply(self, socket: zmq.Socket) -> ThreadAuthenticator | None:
        """Make `socket` a CURVE server before it binds; the started ZAP handler, for the caller to stop.

        The handler runs in its own thread (pyzmq's ThreadAuthenticator), so a handshake is answered while
        the daemon's loop is busy, and the loop polls nothing more on the request path. The bind's own needs
        come first: IPv6 for tcp://[::1]:P (`allow_ipv6`), since this is what the frontend calls before binding.
        """
        allow_ipv6(socket, self.endpoint)
        if self.keys is None or self.allowed is None:
            if not self.local:
                log.warning("the frontend %s takes plaintext from anyone who can reach it", self.endpoint)
            return None
        authenticator = ThreadAuthenticator(socket.context, log=logging.getLogger("packrat.security.zap"))
        authenticator.start()
        authenticator.configure_curve_callback(ZAP_DOMAIN, credentials_provider=self.allowed)
        socket.setsockopt(zmq.ZAP_DOMAIN, ZAP_DOMAIN.encode())
        socket.setsockopt(zmq.CURVE_SERVER, 1)
        socket.setsockopt(zmq.CURVE_PUBLICKEY, self.keys.public)
        socket.setsockopt(zmq.CURVE_SECRETKEY, self.keys.secret)
        return authenticator


# ------------------------------------------------------------------------ which addresses are local


def is_local_endpoint(endpoint: str) -> bool:
    """True for ipc:// and inproc:// and for tcp:// on a loopback address; every other bind is public."""
    transport, _, address = endpoint.partition("://")
    if transport in ("ipc", "inproc"):
        return True
    if transport != "tcp":
        return False
    host = address.rpartition(":")[0]
    return is_loopback_address(host)


def is_loopback_address(host: str) -> bool:
    """True for localhost and loopback IPs; '*', '0.0.0.0', '::', interface and host names are not."""
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
