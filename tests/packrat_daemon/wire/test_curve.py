"""CURVE key files, the frontend's security settings, and ZAP on a real in-process socket."""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq

from packrat_daemon.wire.curve import (
    AllowedClients,
    ClientKeys,
    FrontendSecurity,
    is_local_endpoint,
    is_loopback_address,
    load_key_pair,
    load_public_key,
    write_key_pair,
)
from packrat_daemon.wire.errors import ConfigError


@pytest.fixture
def keys(tmp_path: Path) -> Path:
    """server, alice (allowed) and mallory (not), with an allowed-clients folder listing alice."""
    for name in ("server", "alice", "mallory"):
        write_key_pair(tmp_path, name)
    allowed = tmp_path / "allowed"
    allowed.mkdir(mode=0o755)
    shutil.copy(tmp_path / "alice.key", allowed / "alice.key")
    return tmp_path


def test_keygen_writes_a_private_pair_and_a_shareable_public_key(tmp_path: Path) -> None:
    public_path, secret_path = write_key_pair(tmp_path / "new", "server")
    assert (public_path.name, secret_path.name) == ("server.key", "server.key_secret")
    assert secret_path.stat().st_mode & 0o777 == 0o600 and public_path.stat().st_mode & 0o777 == 0o644
    pair = load_key_pair(secret_path)
    assert load_public_key(public_path) == pair.public and len(pair.secret) == 40
    assert zmq.curve_public(pair.secret) == pair.public
    with pytest.raises(ConfigError, match="already exists"):
        write_key_pair(tmp_path / "new", "server")
    with pytest.raises(ConfigError, match="plain file name"):
        write_key_pair(tmp_path, "../elsewhere")


def test_key_files_are_checked_with_what_to_do(keys: Path) -> None:
    secret = keys / "server.key_secret"
    os.chmod(secret, 0o640)
    with pytest.raises(ConfigError, match="chmod 600"):
        load_key_pair(secret)
    with pytest.raises(ConfigError, match="only a public key"):
        load_key_pair(keys / "server.key")
    with pytest.raises(ConfigError, match="packrat keygen"):
        load_key_pair(keys / "missing.key_secret")
    (keys / "bad.key").write_text('curve\n    public-key = "tooshort"\n')
    with pytest.raises(ConfigError, match="40 Z85 characters"):
        load_public_key(keys / "bad.key")
    assert load_public_key(load_public_key(keys / "alice.key")) == load_public_key(keys / "alice.key")


@pytest.mark.parametrize(
    ("endpoint", "local"),
    [
        ("ipc:///run/packrat/front.ipc", True),
        ("inproc://x", True),
        ("tcp://127.0.0.1:5555", True),
        ("tcp://127.3.0.1:5555", True),
        ("tcp://localhost:5555", True),
        ("tcp://[::1]:5555", True),
        ("tcp://*:5555", False),
        ("tcp://0.0.0.0:5555", False),
        ("tcp://10.0.0.7:5555", False),
        ("tcp://eth0:5555", False),
        ("tcp://[::]:5555", False),
        ("ws://127.0.0.1:5555", False),
    ],
)
def test_which_endpoints_are_local(endpoint: str, local: bool) -> None:
    assert is_local_endpoint(endpoint) is local


def test_which_metrics_addresses_are_loopback() -> None:
    assert is_loopback_address("127.0.0.1") and is_loopback_address("::1") and is_loopback_address("localhost")
    assert not any(is_loopback_address(a) for a in ("", "0.0.0.0", "::", "192.168.1.4", "metrics.example"))


def test_a_public_bind_without_keys_is_refused_saying_how_to_fix_it() -> None:
    with pytest.raises(ConfigError) as refused:
        FrontendSecurity.check("tcp://0.0.0.0:5555", None, None, insecure_public=False)
    message = str(refused.value)
    assert "packrat keygen" in message and "--server-key" in message and "--allowed-clients" in message
    assert "--insecure-public" in message and "127.0.0.1" in message
    assert FrontendSecurity.check("tcp://0.0.0.0:5555", None, None, insecure_public=True).keys is None
    assert FrontendSecurity.check("tcp://127.0.0.1:5555", None, None, insecure_public=False).local


def test_keys_come_as_a_pair_of_settings(keys: Path) -> None:
    with pytest.raises(ConfigError, match="allowed_clients is not"):
        FrontendSecurity.check("tcp://*:5555", str(keys / "server.key_secret"), None, False)
    with pytest.raises(ConfigError, match="server_key is not"):
        FrontendSecurity.check("tcp://*:5555", None, str(keys / "allowed"), False)
    empty = keys / "empty"
    empty.mkdir()
    with pytest.raises(ConfigError, match="holds no .key file"):
        FrontendSecurity.check("tcp://*:5555", str(keys / "server.key_secret"), str(empty), False)
    os.chmod(keys / "allowed", 0o777)
    with pytest.raises(ConfigError, match="chmod go-w"):
        AllowedClients(keys / "allowed")


def test_allowed_clients_follow_the_folder(keys: Path, caplog: pytest.LogCaptureFixture) -> None:
    allowed = AllowedClients(keys / "allowed")
    alice, mallory = load_public_key(keys / "alice.key"), load_public_key(keys / "mallory.key")
    assert allowed.callback("packrat", alice) and not allowed.callback("packrat", mallory)
    shutil.copy(keys / "mallory.key", keys / "allowed" / "mallory.key")
    (keys / "allowed" / "alice.key").unlink()
    caplog.clear()
    assert allowed.callback("packrat", mallory) and not allowed.callback("packrat", alice)
    with caplog.at_level(logging.DEBUG, "packrat.security"):
        for _ in range(5):
            allowed.callback("packrat", alice)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and "unknown key" in r.message]
    assert len(warnings) == 1  # a client retrying every 100 ms must not flood the log


@pytest.fixture
def curve_server(keys: Path) -> Iterator[tuple[zmq.Context, zmq.Socket, str]]:
    context = zmq.Context()
    server = context.socket(zmq.ROUTER)
    server.setsockopt(zmq.LINGER, 0)
    security = FrontendSecurity.check("tcp://*:0", str(keys / "server.key_secret"), str(keys / "allowed"), False)
    authenticator = security.apply(server)
    assert authenticator is not None
    port = server.bind_to_random_port("tcp://127.0.0.1")
    try:
        yield context, server, f"tcp://127.0.0.1:{port}"
    finally:
        server.close()
        authenticator.stop()
        context.term()


def _delivered(
    context: zmq.Context, server: zmq.Socket, endpoint: str, keys: ClientKeys | None, wait_ms: int = 300
) -> bool:
    client = context.socket(zmq.DEALER)
    client.setsockopt(zmq.LINGER, 0)
    if keys is not None:
        keys.apply(client)
    client.connect(endpoint)
    client.send(b"hello")
    try:
        return bool(server.poll(wait_ms)) and server.recv_multipart()[-1] == b"hello"
    finally:
        client.close()


@pytest.mark.slow
def test_zap_lets_in_listed_keys_only(keys: Path, curve_server: tuple[zmq.Context, zmq.Socket, str]) -> None:
    context, server, endpoint = curve_server
    server_key = keys / "server.key"
    assert _delivered(context, server, endpoint, ClientKeys.load(keys / "alice.key_secret", server_key), 5000)
    assert not _delivered(context, server, endpoint, ClientKeys.load(keys / "mallory.key_secret", server_key))
    assert not _delivered(context, server, endpoint, None)  # plaintext
    wrong_server = ClientKeys.load(keys / "alice.key_secret", keys / "mallory.key")
    assert not _delivered(context, server, endpoint, wrong_server)


# -- the allowed list re-read by content, failing closed ----------------------------------------------
def test_a_key_overwritten_in_place_takes_effect_at_the_next_handshake(keys: Path) -> None:
    # Before: only the folder's mtime and inode were compared, and writing a file in place changes neither.
    allowed = AllowedClients(keys / "allowed")
    alice, mallory = load_public_key(keys / "alice.key"), load_public_key(keys / "mallory.key")
    assert allowed.callback("packrat", alice)
    (keys / "allowed" / "alice.key").write_bytes((keys / "mallory.key").read_bytes())  # same size, same name
    assert allowed.callback("packrat", mallory) and not allowed.callback("packrat", alice)


def test_a_malformed_key_file_refuses_everyone_with_one_error_until_it_is_fixed(
    keys: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Before: the re-read failed, the keys read before stayed admitted (a deleted key was not revoked), and an
    # ERROR was logged at every handshake.
    allowed = AllowedClients(keys / "allowed")
    alice, mallory = load_public_key(keys / "alice.key"), load_public_key(keys / "mallory.key")
    shutil.copy(keys / "mallory.key", keys / "allowed" / "mallory.key")
    assert allowed.callback("packrat", mallory)
    (keys / "allowed" / "broken.key").write_text("not a certificate\n")
    (keys / "allowed" / "mallory.key").unlink()  # revoked, whatever else is wrong in the folder
    with caplog.at_level(logging.ERROR, "packrat.security"):
        assert not any(allowed.callback("packrat", key) for key in (alice, mallory) * 5)
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert (
        len(errors) == 1 and "broken.key" in errors[0].message and "every CURVE client is refused" in errors[0].message
    )
    assert allowed.error is not None and allowed.names == {}
    (keys / "allowed" / "broken.key").unlink()
    assert allowed.callback("packrat", alice) and not allowed.callback("packrat", mallory)
    assert allowed.error is None


def test_a_key_file_that_never_ends_is_refused_unread(keys: Path) -> None:
    (keys / "allowed" / "zero.key").symlink_to("/dev/zero")
    with pytest.raises(ConfigError, match="not a plain file"):
        AllowedClients(keys / "allowed")  # at start: the daemon says which file


def test_too_many_key_files_fail_closed(keys: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from packrat_daemon.wire import curve

    allowed = AllowedClients(keys / "allowed")
    monkeypatch.setattr(curve, "MAX_ALLOWED_KEYS", 1)
    shutil.copy(keys / "mallory.key", keys / "allowed" / "mallory.key")
    assert not allowed.callback("packrat", load_public_key(keys / "alice.key"))
    assert allowed.error is not None and "more than 1" in allowed.error
