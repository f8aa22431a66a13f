"""`packrat reconfigure`'s arguments and what it sends, against a stand-in control socket that records each
request and answers as the daemon would (the real daemon's side is control/test_server.py)."""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq

from packrat_daemon.cli import main
from packrat_daemon.control.server import CONTROL_FILE

DONE = {"ok": True, "done": "switched from single to fixed: 2×⟨1 thread, batch 4⟩", "plan": {"policy": "fixed"}}


@contextlib.contextmanager
def control_socket(run_dir: Path, reply: dict[str, Any]) -> Iterator[list[dict[str, Any]]]:
    """A control socket at RUN_DIR/control.ipc that answers one request with `reply`; yields what it got."""
    socket = zmq.Context.instance().socket(zmq.ROUTER)
    socket.setsockopt(zmq.LINGER, 0)
    socket.bind(f"ipc://{run_dir / CONTROL_FILE}")
    received: list[dict[str, Any]] = []

    def answer() -> None:
        if socket.poll(10_000):
            identity, body = socket.recv_multipart()
            received.append(json.loads(body))
            socket.send_multipart([identity, json.dumps(reply).encode()])

    thread = threading.Thread(target=answer)
    thread.start()
    try:
        yield received
    finally:
        thread.join()
        socket.close()


@pytest.mark.parametrize(
    ("flags", "body"),
    [
        (["--plan", "2*1x4"], {"op": "reconfigure", "plan": "2*1x4"}),
        (["--policy", "single"], {"op": "reconfigure", "policy": "single"}),
        (["--auto"], {"op": "reconfigure", "auto": True}),
    ],
)
def test_each_request_is_sent_as_the_control_protocol_says_and_the_answer_printed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], body: dict[str, Any]
) -> None:
    with control_socket(tmp_path, DONE) as received:
        code = main(["reconfigure", "--run-dir", str(tmp_path), *flags])
    assert code == 0 and received == [body]
    assert capsys.readouterr().out == DONE["done"] + "\n"


def test_json_prints_the_whole_answer(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with control_socket(tmp_path, DONE):
        assert main(["reconfigure", "--control", f"ipc://{tmp_path / CONTROL_FILE}", "--auto", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == DONE


def test_a_refusal_exits_2_with_the_daemons_reason(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    reason = "the fixed plan '9x9' needs 9 cores but only 2 are usable; use fewer threads or instances"
    with control_socket(tmp_path, {"ok": False, "error": {"type": "PolicyError", "message": reason}}):
        assert main(["reconfigure", "--run-dir", str(tmp_path), "--plan", "9x9"]) == 2
    assert capsys.readouterr().err == f"packrat reconfigure: error: {reason}\n"


def test_no_daemon_listening_says_where_it_asked(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["reconfigure", "--run-dir", str(tmp_path), "--auto", "--timeout", "0.05"]) == 2
    assert f"no answer from ipc://{tmp_path / CONTROL_FILE} within" in capsys.readouterr().err


def test_a_control_endpoint_others_could_reach_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["reconfigure", "--control", "tcp://127.0.0.1:7001", "--auto"]) == 2
    assert "would let other users change or stop the pool" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("args", "complaint"),
    [
        (["--auto"], "one of the arguments --control --run-dir is required"),
        (["--run-dir", "/tmp/x"], "one of the arguments --plan --policy --auto is required"),
        (["--run-dir", "/tmp/x", "--control", "ipc:///tmp/x/c.ipc", "--auto"], "not allowed with argument"),
        (["--run-dir", "/tmp/x", "--plan", "2x4", "--auto"], "not allowed with argument"),
        (["--run-dir", "/tmp/x", "--auto", "--timeout", "soon"], "invalid float value: 'soon'"),
    ],
)
def test_arguments_that_do_not_say_where_and_what_exactly_once_are_refused(
    capsys: pytest.CaptureFixture[str], args: list[str], complaint: str
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["reconfigure", *args])
    assert exited.value.code == 2
    assert complaint in capsys.readouterr().err
