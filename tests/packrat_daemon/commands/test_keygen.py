"""`packrat keygen`: the key files it writes, and that it never overwrites them."""

from __future__ import annotations

from pathlib import Path

import pytest

from packrat_daemon.cli import main
from packrat_daemon.wire.curve import load_key_pair, load_public_key


def test_keygen_writes_a_pair_the_daemon_and_clients_load(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["keygen", "server", "--dir", str(tmp_path)]) == 0
    pair = load_key_pair(tmp_path / "server.key_secret")
    assert load_public_key(tmp_path / "server.key") == pair.public
    assert pair.public.decode() in capsys.readouterr().out
    assert main(["keygen", "server", "--dir", str(tmp_path)]) == 2
    assert "already exists" in capsys.readouterr().err
    assert load_key_pair(tmp_path / "server.key_secret") == pair  # untouched
