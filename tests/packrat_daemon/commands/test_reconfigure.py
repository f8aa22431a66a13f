"""`packrat reconfigure`: what it asks the control socket for (the live daemon's answer is test_server's)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from packrat_daemon.cli import main
from packrat_daemon.control import server


@pytest.mark.parametrize(
    ("flags", "body"),
    [
        (["--plan", "2x4"], {"op": "reconfigure", "plan": "2x4"}),
        (["--policy", "single"], {"op": "reconfigure", "policy": "single"}),
        (["--auto"], {"op": "reconfigure", "auto": True}),
    ],
)
def test_each_flag_asks_for_one_thing(
    flags: list[str], body: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    asked: list[tuple[str, dict[str, Any], float]] = []

    def request(endpoint: str, sent: dict[str, Any], timeout: float) -> dict[str, Any]:
        asked.append((endpoint, sent, timeout))
        return {"done": "serving 2x4 after 0.4 s"}

    monkeypatch.setattr(server, "request", request)
    assert main(["reconfigure", "--run-dir", str(tmp_path), "--timeout", "7", *flags]) == 0
    assert asked == [(server.control_endpoint(None, str(tmp_path)), body, 7.0)]
    assert capsys.readouterr().out.strip() == "serving 2x4 after 0.4 s"


def test_it_needs_somewhere_to_ask_and_one_thing_to_ask_for(capsys: Any) -> None:
    with pytest.raises(SystemExit):
        main(["reconfigure", "--auto"])
    with pytest.raises(SystemExit):
        main(["reconfigure", "--run-dir", ".", "--auto", "--plan", "2x4"])
    assert "not allowed with argument" in capsys.readouterr().err
