"""The control channel and `packrat status` against a real daemon: a fixed plan, a policy, back to automatic,
typed refusals, the control socket private and out of the frontend's reach, the status reply, the history."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import zmq

from packrat_daemon.cli import main
from packrat_daemon.control.messages import parse, plan_from_request
from packrat_daemon.control.server import Control, ControlError, control_endpoint, request
from packrat_daemon.wire.client import Client
from packrat_daemon.wire.errors import ConfigError, PolicyError
from tests.helpers.daemons import running_daemon

needs_two_cpus = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs for two pinned workers")


def test_the_control_endpoint_is_private(tmp_path: Path) -> None:
    assert control_endpoint(None, tmp_path) == f"ipc://{tmp_path}/control.ipc"
    # tcp even on loopback: every local user could reconfigure or stop the daemon (issue 27, 1).
    for endpoint in ("tcp://127.0.0.1:7001", "tcp://[::1]:7001", "tcp://0.0.0.0:7001"):
        with pytest.raises(ConfigError, match="would let other users change or stop the pool.*default ipc socket"):
            control_endpoint(endpoint, tmp_path)
    open_dir = tmp_path / "open"
    open_dir.mkdir(mode=0o755)
    open_dir.chmod(0o755)
    with pytest.raises(ConfigError, match="other users may enter"):
        control_endpoint(f"ipc://{open_dir}/control.ipc", tmp_path)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"not json", "is a JSON object"),
        (b'{"op": "infer"}', '"op": "reconfigure"'),
        (b'{"op": "reconfigure"}', "exactly one of"),
        (b'{"op": "reconfigure", "plan": "2x4", "auto": true}', "exactly one of"),
        (b'{"op": "reconfigure", "auto": 1}', "'auto' must be true"),
        (b'{"op": "reconfigure", "policy": 3}', "'policy' must be a string"),
    ],
)
def test_malformed_control_requests_are_refused_with_what_to_send(body: bytes, message: str) -> None:
    with pytest.raises(ControlError, match=message):
        parse(body, 2)


@pytest.mark.parametrize("body", [b"[" * 4000, b"{" * 100_000, b'{"op": "reconfigure", "plan": [[[[[[[[[[1]]]]]]]]]]}'])
def test_deeply_nested_control_requests_are_refused_before_parsing(body: bytes) -> None:
    # 4 000 `[` raised RecursionError out of json.loads, past the handler's `except PackratError`: exit 1.
    with pytest.raises(ControlError, match="one flat JSON object"):
        parse(body, 2)


def test_a_control_plan_beyond_max_batch_is_refused() -> None:
    class Board:
        config = SimpleNamespace(max_batch=8, min_split_gain=0.1, plan=None)

    control = Control.__new__(Control)
    control.board = Board()  # type: ignore[assignment]
    with pytest.raises(PolicyError, match="max_batch 8"):
        control._policy({"op": "reconfigure", "plan": "1x100000"})


def reconfigure(capsys: pytest.CaptureFixture[str], run_dir: Path, *args: str) -> tuple[int, str, str]:
    code = main(["reconfigure", "--run-dir", str(run_dir), *args])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.slow
@needs_two_cpus
def test_reconfigure_and_status_on_a_real_daemon(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = tmp_path / "run"
    args = ("--model", "builtin:tiny-mlp", "--policy", "fixed", "--plan", "2x4", "--max-batch", "8")
    with running_daemon(tmp_path, *args, "--run-dir", str(run_dir)) as (endpoint, _), Client(endpoint) as client:
        socket_file = run_dir / "control.ipc"
        assert stat.S_ISSOCK(socket_file.stat().st_mode)
        assert stat.S_IMODE(run_dir.stat().st_mode) == 0o700

        # The serving endpoint knows no control request: the plan stays.
        raw = zmq.Context.instance().socket(zmq.DEALER)
        raw.setsockopt(zmq.LINGER, 0)
        raw.connect(endpoint)
        raw.send(json.dumps({"v": 1, "id": 1, "op": "reconfigure", "plan": "2*1x4"}).encode())
        assert raw.poll(10_000)
        refused = json.loads(raw.recv())
        raw.close()
        assert refused["error"]["code"] == "BAD_REQUEST" and "'status'" in refused["error"]["message"]
        assert [w["threads"] for w in client.info()["workers"]] == [2]

        code, out, _ = reconfigure(capsys, run_dir, "--plan", "2*1x4", "--json")
        assert code == 0
        reply = json.loads(out)
        assert reply["done"].startswith("switched from fixed: 1×⟨2 threads, batch 4⟩ to fixed: 2×⟨1 thread, batch 4⟩")
        assert 0 < reply["reconfiguration"]["serving_s"] <= reply["reconfiguration"]["retired_s"]
        assert [w["threads"] for w in client.info()["workers"]] == [1, 1]

        code, out, _ = reconfigure(capsys, run_dir, "--plan", "2*1x4")
        assert code == 0 and out.startswith("already serving")

        code, _, err = reconfigure(capsys, run_dir, "--plan", "9x8")
        assert code == 2 and "needs 9 cores but only 2 are usable" in err
        with pytest.raises(PolicyError, match="unknown policy 'nope'"):
            request(f"ipc://{socket_file}", {"op": "reconfigure", "policy": "nope"}, 10.0)
        with pytest.raises(ControlError, match="exactly one of"):
            request(f"ipc://{socket_file}", {"op": "reconfigure"}, 10.0)

        x = np.ones((3, 16), dtype=np.float32)
        for _ in range(20):
            client.infer(x)
        code, _, _ = reconfigure(capsys, run_dir, "--policy", "single")
        assert code == 0
        status = client.status()
        assert status["plan"]["policy"] == "single" and status["planning"]["override"] == "--policy single"
        serving = [w for w in status["workers"] if w["serving"]]
        assert [w["threads"] for w in serving] == [2]
        assert [w["state"] for w in status["workers"] if not w["serving"]] == ["parked"]  # kept for a switch back
        assert {"pid", "runtime", "threads", "cores", "state", "batches_served"} <= set(serving[0])
        assert status["traffic"]["batch_sizes"] == [[3, 1.0]] and status["traffic"]["inputs_per_s"] > 0
        assert status["queue"]["requests"] == 0 and status["queue"]["accepting"]
        assert {"measured_offline", "estimated", "learned_in_production"} <= set(status["profile"])
        history = status["history"]
        assert [h["reason"] for h in history] == ["start", "control: --plan 2*1x4", "control: --policy single"]
        assert all(h["serving_s"] is not None and h["retired_s"] is not None for h in history)
        assert history[1]["from"] == history[0]["to"] and history[2]["from"] == history[1]["to"]

        code, out, _ = reconfigure(capsys, run_dir, "--auto")
        assert code == 0 and "to fixed: 1×⟨2 threads, batch 4⟩" in out  # the configured policy again
        assert [w["pid"] for w in client.info()["workers"]] == [serving[0]["pid"]]  # same slot: kept
        assert main(["status", "--endpoint", endpoint]) == 0
        human = capsys.readouterr().out
        assert "plan history:" in human and "control: --auto" in human and "batches" in human
        assert client.status()["planning"]["override"] is None


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b'{"op": "assign"}', "'cpus' is a list of CPU numbers"),
        (b'{"op": "assign", "cpus": "0-3"}', "'cpus' is a list of CPU numbers"),
        (b'{"op": "assign", "cpus": [0, true]}', "'cpus' is a list of CPU numbers"),
        (b'{"op": "assign", "cpus": [-1]}', "'cpus' is a list of CPU numbers"),
        (b'{"op": "assign", "cpus": []}', "'cpus' is empty: give this model at least one usable CPU"),
        (b'{"op": "assign", "cpus": [0], "plan": "2x4"}', "'plan' is a plan as Plan.to_json writes it"),
        (b'{"op": "assign", "cpus": [0], "reason": 3}', "'reason' is a string"),
        (b'{"op": "assign", "cpus": [0], "gain": "big"}', "'gain' is a number"),
        (b'{"op": "move"}', '{"op": "assign", ...} or {"op": "demand"}'),
    ],
)
def test_malformed_assign_requests_are_refused_with_what_to_send(body: bytes, message: str) -> None:
    with pytest.raises(ControlError, match=message):
        parse(body, 2)


def test_an_assign_carries_a_plan_as_plan_to_json_writes_it() -> None:
    from policies.base import InstancePlan, Plan

    plan = Plan(
        (InstancePlan(2, 4), InstancePlan(1, 4)), "packrat", "joint", 1.5, alternatives=((InstancePlan(3, 8),),)
    )
    body = json.dumps({"op": "assign", "cpus": [0, 1, 2], "plan": plan.to_json(), "reason": "r", "gain": 0.2})
    request = parse(body.encode(), 2)  # 5 deep: within the bound
    restored = plan_from_request(request["plan"])
    assert (restored.instances, restored.alternatives, restored.policy) == (
        plan.instances,
        plan.alternatives,
        "packrat",
    )
    with pytest.raises(PolicyError, match="not a plan as Plan.to_json writes it.*leave it out"):
        plan_from_request({"instances": [{"threads": "two"}]})
    with pytest.raises(PolicyError, match="its split is 'sideways', neither 'exact' nor 'even'"):
        plan_from_request({"instances": [{"threads": 1, "batch": 1}], "split": "sideways"})
