"""The coordinator's loop on daemons answered in memory (the real daemons are test_colocated's): the order it
tells them their shares, what a daemon that is down or refuses does to it, when it moves cores, and its status.
The daemons here answer the two control requests as `coordinate.tenancy.Tenancy` does, from a table."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from packrat_daemon.control.server import ControlError
from packrat_daemon.coordinate.loop import Coordinator, Link
from packrat_daemon.wire.errors import PolicyError
from policies.planning.profile import Profile
from policies.planning.topology import Topology, format_cpulist

# A model whose batch of 4 takes 40 ms on one thread, a quarter of it serial: cores pay, each less than the last,
# so two busy models are served faster on disjoint shares than both on all the cores.
PROFILE = Profile.from_latencies(
    {(t, b): 40.0 * b / 4 * (0.25 + 0.75 / t) for t in range(1, 9) for b in (1, 4)}
).to_csv()


class Clock:
    """The coordinator's clock: each look comes one interval after the last."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Daemons:
    """What each daemon answers: its share, its traffic (batches of 4 at `rates` per second, counted as they
    arrive on `clock`), its queue; `down` ones do not answer, `refusing` ones refuse."""

    def __init__(self, machine: int, **rates: float) -> None:
        self.clock = Clock()
        self.arrived = dict.fromkeys(rates, 0.0)
        self.queued = dict.fromkeys(rates, 0)
        self._counted = dict.fromkeys(rates, 0.0)
        everything = list(range(machine))
        self.shares = {name: list(everything) for name in rates}
        self.rates = dict(rates)
        self.down: set[str] = set()
        self.refusing: set[str] = set()
        self.profiles = {name: PROFILE for name in rates}
        self.told: list[tuple[str, str, bool]] = []  # (model, cpulist, with a plan)

    def __call__(self, endpoint: str, body: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        name = endpoint.removeprefix("ipc://").removesuffix("/control.ipc")
        if name in self.down:
            raise ControlError(f"no answer from {endpoint} within {timeout_s:.0f} s")
        if body["op"] == "assign":
            if name in self.refusing:
                raise PolicyError("the plan does not fit")
            self.shares[name] = list(body["cpus"])
            self.told.append((name, format_cpulist(body["cpus"]), "plan" in body))
            return {"ok": True, "done": "switched"}
        rate = self.rates[name]
        self.arrived[name] += 4 * rate * (self.clock.now - self._counted[name])
        self._counted[name] = self.clock.now
        return {"ok": True, "demand": {
            "model": name, "profile": self.profiles[name], "batch_sizes": [[4, 1.0]] if rate else [],
            "batches_per_s": rate, "inputs_per_s": 4 * rate, "vacated": True, "now_s": self.clock.now,
            "arrived_inputs": round(self.arrived[name]), "queued_inputs": self.queued[name],
            "share": {"cpu_ids": self.shares[name], "cores": len(self.shares[name])},
        }}  # fmt: skip


def coordinator(daemons: Daemons, tmp_path: Path | None = None, cores: int = 8) -> Coordinator:
    links = [Link(name, f"ipc://{name}/control.ipc") for name in daemons.rates]
    status = None if tmp_path is None else tmp_path / "coordinator.json"
    return Coordinator(links, Topology.synthetic(cores), 5.0, 0.1, 30.0, status, request=daemons, clock=daemons.clock)


def tick(coord: Coordinator, daemons: Daemons) -> None:
    """One look, one interval after the last."""
    daemons.clock.now += coord.interval_s
    coord.tick()


def test_the_first_look_gives_every_daemon_every_core_the_safe_default(tmp_path: Path) -> None:
    daemons = Daemons(8, a=0.0, b=0.0)
    tick(coordinator(daemons, tmp_path), daemons)
    # Before any traffic is seen, every model on all the cores: told in --daemon order, each plans on all of them.
    assert daemons.told == [("a", "0-7", False), ("b", "0-7", False)]
    status = json.loads((tmp_path / "coordinator.json").read_text())
    assert [(m["name"], m["cpus"], m["up"]) for m in status["models"]] == [("a", "0-7", True), ("b", "0-7", True)]
    assert status["split"] == {"a": 8, "b": 8} and status["moves"] == []
    assert "waiting for 1 s" in status["declined"]  # one look: no rate yet


def test_when_both_models_are_busy_the_cores_are_split_each_daemon_shrinking_onto_its_share(tmp_path: Path) -> None:
    daemons = Daemons(8, a=0.0, b=0.0)
    coord = coordinator(daemons, tmp_path)
    tick(coord, daemons)
    daemons.told.clear()
    daemons.rates["a"] = daemons.rates["b"] = 80.0  # both busy: on all the cores they would collide
    tick(coord, daemons)
    assert [name for name, _, _ in daemons.told] == ["a", "b"]  # both only give CPUs up: in --daemon order
    assert all(with_plan for _, _, with_plan in daemons.told)  # each with its share of the joint plan
    assert daemons.shares["a"] == [0, 1, 2, 3] and daemons.shares["b"] == [4, 5, 6, 7]
    status = json.loads((tmp_path / "coordinator.json").read_text())
    move = status["moves"][-1]
    assert move["from"] == {"a": "0-7", "b": "0-7"} and move["to"] == {"a": "0-3", "b": "4-7"}
    assert move["reason"] == "joint plan: even" and [step["model"] for step in move["steps"]] == ["a", "b"]
    assert status["serving"]["mode"] == "even" and "an even split" in status["serving"]["why"]  # ties: the simple one
    # Steady traffic: the next look keeps the split (hysteresis).
    daemons.told.clear()
    tick(coord, daemons)
    assert daemons.told == []


def test_a_daemon_that_is_down_keeps_its_share_and_gets_it_back_when_it_returns(tmp_path: Path) -> None:
    daemons = Daemons(8, a=0.0, b=0.0)
    coord = coordinator(daemons, tmp_path)
    tick(coord, daemons)
    daemons.told.clear()
    daemons.down.add("a")
    daemons.rates["b"] = 60.0
    tick(coord, daemons)  # never raises: a is skipped, and no core moves while it is away
    status = json.loads((tmp_path / "coordinator.json").read_text())
    # b gives a's first share up, so that a finds it free when it restarts on its --cpus.
    assert daemons.told == [("b", "4-7", False)] and "a down" in status["declined"]
    assert [(m["name"], m["up"], m["cpus"]) for m in status["models"]][0] == ("a", False, "0-3")
    daemons.down.clear()
    daemons.shares["a"] = list(range(8))  # restarted on every CPU
    tick(coord, daemons)
    assert daemons.told[1] == ("a", "0-3", False)  # its share back first; then the joint plan may move cores


def test_a_refusal_ends_the_move_before_the_next_model_is_told(tmp_path: Path) -> None:
    daemons = Daemons(8, a=0.0, b=0.0)
    coord = coordinator(daemons, tmp_path)
    tick(coord, daemons)
    daemons.told.clear()
    daemons.refusing.add("a")
    daemons.rates["a"] = daemons.rates["b"] = 80.0
    tick(coord, daemons)
    assert daemons.told == []  # a refused its share, so b was not told
    move = json.loads((tmp_path / "coordinator.json").read_text())["moves"][-1]
    assert move["steps"] == [
        {"model": "a", "ok": False, "seconds": pytest.approx(0, abs=1), "error": "the plan does not fit"}
    ]
    assert coord.split == (8, 8)  # the books keep what was served


def test_without_a_profile_the_shares_stay_as_they_are(tmp_path: Path) -> None:
    daemons = Daemons(8, a=0.0, b=60.0)
    daemons.profiles["a"] = None  # type: ignore[assignment]
    coord = coordinator(daemons, tmp_path)
    tick(coord, daemons)
    assert [name for name, _, _ in daemons.told] == ["a", "b"]  # shares given, no move
    assert "a serve(s) without a profile" in coord.declined


def test_cores_moved_onto_a_down_models_first_share_are_given_up_for_its_restart(tmp_path: Path) -> None:
    daemons = Daemons(8, a=0.0, b=0.0)
    coord = coordinator(daemons, tmp_path)
    tick(coord, daemons)
    daemons.rates["b"] = 60.0
    tick(coord, daemons)
    assert daemons.shares["b"] == list(range(8))  # b shares a's first CPUs 0-3 (a idle: every model on all)
    daemons.told.clear()
    daemons.down.add("a")
    tick(coord, daemons)
    # a restarts on its --cpus 0-3: b gives 1-3 up now, so that a finds them free.
    assert daemons.told == [("b", "4-7", False)] and coord.split == (4, 4)
    move = json.loads((tmp_path / "coordinator.json").read_text())["moves"][-1]
    assert move["reason"] == "a down: its first share kept free" and move["to"] == {"b": "4-7"}
    daemons.told.clear()
    tick(coord, daemons)
    assert daemons.told == []  # while a stays down, nothing more moves
    daemons.down.clear()
    daemons.shares["a"] = [0, 1, 2, 3]
    tick(coord, daemons)
    assert daemons.told[0] == ("a", "0-3", False)  # back on its own share; then b, still busy, may grow again


def test_a_daemon_that_restarted_between_two_looks_is_told_its_share(tmp_path: Path) -> None:
    daemons = Daemons(8, a=0.0, b=60.0)
    coord = coordinator(daemons, tmp_path)
    tick(coord, daemons)
    tick(coord, daemons)
    assert daemons.shares["a"] == list(range(8))  # a idle: every model on all the cores
    daemons.told.clear()
    daemons.shares["a"] = [0, 1, 2, 3]  # back on its --cpus before any look saw it down
    tick(coord, daemons)
    assert daemons.told == [("a", "0-7", False)]


def test_a_backlog_while_the_other_model_is_light_keeps_every_model_on_all_cores(tmp_path: Path) -> None:
    daemons = Daemons(8, a=20.0, b=20.0)
    links = [Link(name, f"ipc://{name}/control.ipc") for name in daemons.rates]
    coord = Coordinator(links, Topology.synthetic(8), 0.5, 0.1, 30.0, tmp_path / "coordinator.json",
                        request=daemons, clock=daemons.clock)  # fmt: skip
    for _ in range(10):
        tick(coord, daemons)
    assert coord.split == (8, 8) and not coord.moves  # collisions rare: every model stays on all the cores
    moved = 0
    daemons.rates["a"], daemons.queued["a"] = 150.0, 40  # a's traffic jumps past what 4 cores carry; it queues
    tick(coord, daemons)
    assert len(coord.moves) == moved  # its last second's rate still half the phase before
    tick(coord, daemons)
    # b light: a's batches already run on the whole machine, which no split of it beats.
    assert len(coord.moves) == moved and coord.split == (8, 8)
    status = json.loads((tmp_path / "coordinator.json").read_text())
    assert status["models"][0]["queued_inputs"] == 40 and status["watch"]["backlog_looks"] == 1
    assert status["serving"]["mode"] == "every"
