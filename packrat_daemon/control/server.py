"""The control channel: `packrat reconfigure` asks the running daemon for a plan, a policy, or automatic
planning again.

It is a ROUTER socket of its own, never the serving frontend: an ipc socket in a folder only the daemon's
user may enter (by default `control.ipc` in the run dir). Whoever can reach it can change or stop the pool,
so nothing else is accepted: not even tcp on loopback, which every local user can reach (the control socket
has no CURVE keys of its own). One request is one JSON frame, one reply is one JSON frame:

    {"op": "reconfigure", "plan": "2*1x1"}   a fixed plan (the fixed policy's syntax)
    {"op": "reconfigure", "policy": "single"} a policy from the registry, planned on the live batch sizes
    {"op": "reconfigure", "auto": true}       back to the configured policy, adaptation on again
    {"op": "assign", "cpus": [0, 1, 2, 3], "plan": {...}, "reason": "...", "gain": 0.2}
                                              serve on these CPUs only (`packrat coordinate`); the plan
                                              (Plan.to_json) is optional: else the policy plans inside them
    {"op": "demand"}                          what a coordinator plans this model from (Colocation.demand)

The handler only checks and queues; `tick`, called from the daemon's loop, builds the plan and hands it
to the daemon's switch (the reconciler alone changes the pool), and answers once the new pool serves
(or at once when nothing changes or the request fails), with the measured reconfiguration. An `assign` is
answered once, besides, no worker is left on a CPU it gave away (shrink before grow: the coordinator grows the
other model only then). What it may read and change of the running daemon is the `Switchboard` (`control.board.Board`
is one) and, for a coordinator's requests, the `Colocation` (`coordinate.tenancy.Tenancy`). A request is checked
and parsed by `control.messages`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import zmq

from packrat_daemon.control.messages import (
    MAX_REQUEST_BYTES,
    ControlError,
    describe,
    error_reply,
    parse,
    plan_from_request,
)
from packrat_daemon.ops.hardening import claim_ipc, private_dir
from packrat_daemon.startup import distribution_for, policy_for
from packrat_daemon.wire import errors
from packrat_daemon.wire.endpoints import allow_ipv6
from packrat_daemon.wire.errors import ConfigError, PackratError, PolicyError
from policies.base import Plan, Policy, PolicySettings
from policies.registry import policy_from_settings

if TYPE_CHECKING:
    from packrat_daemon.config import ServeConfig
    from packrat_daemon.fleet.reconciler import Reconfiguration
    from policies.planning.distribution import BatchDistribution
    from policies.planning.profile import Profile
    from policies.planning.topology import Topology

log = logging.getLogger("packrat.control")

CONTROL_FILE = "control.ipc"
MAX_QUEUED = 16  # requests waiting for the loop; more are refused (a client in a loop, not an operator)


def control_endpoint(endpoint: str | None, run_dir: str | os.PathLike[str]) -> str:
    """The endpoint `packrat reconfigure` reaches: the given one, else ipc://RUN_DIR/control.ipc. Refused
    (ConfigError) unless it is an ipc socket in a private folder: only the daemon's user may reach it."""
    if endpoint is None:
        return f"ipc://{Path(run_dir) / CONTROL_FILE}"
    if endpoint.startswith("ipc://"):
        private_dir(Path(endpoint.removeprefix("ipc://")).parent)
        return endpoint
    # tcp, even on loopback, is refused: any local user could connect, and the control socket has no CURVE.
    raise ConfigError(
        f"the control endpoint {endpoint!r} would let other users change or stop the pool; leave --control out "
        "(the default ipc socket in the private run dir) or give ipc://PATH in a folder only this user may enter"
    )


@dataclass(frozen=True)
class Planning:
    """What a policy plans from, now: the offline profile, the usable cores, the live batch sizes (None
    before any batch was seen)."""

    profile: Profile | None
    topology: Topology
    live: BatchDistribution | None


class Switchboard(Protocol):
    """What the control channel may read and change of the running daemon."""

    @property
    def config(self) -> ServeConfig:
        """The configuration in force (a reload replaces it)."""
        ...

    @property
    def plan(self) -> Plan:
        """The plan served, or being switched to."""
        ...

    def planning(self) -> Planning: ...

    def switch(self, plan: Plan, reason: str) -> int:
        """Hand `plan` to the reconciler; returns the generation that will serve it."""
        ...

    def set_policy(self, policy: Policy) -> None:
        """Plan with `policy` from now on (online adaptation too)."""
        ...

    def reconfiguration(self, generation: int) -> Reconfiguration | None:
        """The record of the change to `generation`, while the history keeps it."""
        ...


class Colocation(Protocol):
    """What a coordinator's requests (`packrat coordinate`) read and change of the running daemon."""

    def assign(self, cpus: Sequence[int], plan: Plan | None, reason: str, gain: float | None = None) -> int | None:
        """Serve on `cpus` only (with `plan`, else the policy's plan inside them); the generation that will
        serve it, None when nothing changes. Raises before anything changed when it cannot be done."""
        ...

    def vacated(self) -> bool:
        """No worker is left (serving, parked or stopping) on a CPU outside the share."""
        ...

    def demand(self) -> dict[str, Any]:
        """The profile, live batch sizes, arrival rate and share a coordinator plans this model from."""
        ...


@dataclass
class Pending:
    identity: bytes
    request: dict[str, Any]
    what: str  # the request in words, for the log, the reply and the plan history
    vacate: bool = False  # an assign: answered once no worker is left outside the new share too


class Control:
    def __init__(self, board: Switchboard, colocation: Colocation, context: zmq.Context, endpoint: str) -> None:
        self.board, self.colocation = board, colocation
        self.endpoint = endpoint
        self.queue: deque[Pending] = deque()
        self.waiting: dict[int, list[Pending]] = {}  # generation -> requests answered once it serves
        self.override: str | None = None  # what the operator asked for, until `auto`
        if endpoint == board.config.endpoint:
            raise ConfigError("the control endpoint must not be the serving endpoint; choose another --control")
        self.socket = context.socket(zmq.ROUTER)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.setsockopt(zmq.MAXMSGSIZE, MAX_REQUEST_BYTES)
        if endpoint.startswith("ipc://"):
            claim_ipc(endpoint.removeprefix("ipc://"))
        allow_ipv6(self.socket, endpoint)
        self.socket.bind(endpoint)
        if endpoint.startswith("ipc://"):
            os.chmod(endpoint.removeprefix("ipc://"), 0o600)
        log.info("control: `packrat reconfigure --control %s`", endpoint)

    # -- the socket: check and queue only ----------------------------------------------------------
    def read(self) -> None:
        """Queue the requests waiting on the socket; a malformed one is answered at once."""
        while True:
            try:
                frames = self.socket.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            identity, body = frames[0], frames[-1]
            try:
                request = parse(body, len(frames))
                if len(self.queue) >= MAX_QUEUED:
                    raise ControlError(f"{MAX_QUEUED} control requests are already waiting; retry in a moment")
            except PackratError as exc:
                self._reply(identity, error_reply(exc))
                continue
            self.queue.append(Pending(identity, request, describe(request)))

    # -- the loop: act on the queue, answer finished changes ---------------------------------------
    def tick(self) -> None:
        while self.queue:
            self._act(self.queue.popleft())
        for generation in list(self.waiting):
            record = self.board.reconfiguration(generation)
            if record is None or record.done:
                vacating = record is not None and not record.superseded and not self.colocation.vacated()
                if vacating and any(pending.vacate for pending in self.waiting[generation]):
                    continue  # an assign: the workers that left the cores given away are still stopping
                for pending in self.waiting.pop(generation):
                    self._reply(pending.identity, self._finished(pending, record))

    def close(self) -> None:
        stopping = error_reply(ControlError("the daemon is stopping; the change was not made"))
        for pendings in self.waiting.values():
            for pending in pendings:
                self._reply(pending.identity, stopping)
        self.socket.close(linger=100)

    def _act(self, pending: Pending) -> None:
        board = self.board
        request = pending.request
        if request["op"] == "demand":
            self._reply(pending.identity, {"ok": True, "demand": self.colocation.demand()})
            return
        if request["op"] == "assign":
            self._assign(pending)
            return
        try:
            policy = self._policy(request)
            planning = board.planning()
            if policy.needs_profile and planning.profile is None:
                raise PolicyError(f"policy {policy.name!r} plans from a profile, and this daemon serves without one")
            plan = policy.plan(planning.profile, planning.topology, planning.live or distribution_for(board.config))
        except PackratError as exc:
            log.warning("control: %s refused: %s", pending.what, exc)
            self._reply(pending.identity, error_reply(exc))
            return
        self.override = None if request.get("auto") else pending.what
        log.info("control: %s → plan %s", pending.what, plan.describe())
        generation = board.switch(plan, f"control: {pending.what}") if plan != board.plan else None
        # After the switch: the history's predicted gain is the previous policy's view of the change.
        board.set_policy(policy)
        if generation is not None:
            self.waiting.setdefault(generation, []).append(pending)
        else:
            done = f"already serving {board.plan.describe()}; nothing to change"
            self._reply(pending.identity, {"ok": True, "done": done, "plan": board.plan.to_json()})

    def _assign(self, pending: Pending) -> None:
        request, board = pending.request, self.board
        try:
            plan = plan_from_request(request["plan"]) if "plan" in request else None
            generation = self.colocation.assign(
                request["cpus"], plan, request.get("reason", "assign"), request.get("gain")
            )
        except PackratError as exc:
            log.warning("control: %s refused: %s", pending.what, exc)
            self._reply(pending.identity, error_reply(exc))
            return
        if generation is None:
            share = self.colocation.demand()["share"]
            done = f"already serving {board.plan.describe()} on CPUs {share['cpus']}; nothing to change"
            self._reply(pending.identity, {"ok": True, "done": done, "plan": board.plan.to_json(), "share": share})
            return
        pending.vacate = True
        self.waiting.setdefault(generation, []).append(pending)

    def _policy(self, request: dict[str, Any]) -> Policy:
        config = self.board.config
        if request.get("auto"):
            return policy_for(config)
        # max_batch too: a plan's batch beyond it is refused (`--plan 1x100000` was accepted).
        if "plan" in request:
            return policy_from_settings(
                "fixed", dataclasses.replace(PolicySettings.from_config(config), plan=request["plan"])
            )
        settings = PolicySettings.from_config(config)
        return policy_from_settings(request["policy"], settings)

    def _finished(self, pending: Pending, record: Reconfiguration | None) -> dict[str, Any]:
        if record is None or record.superseded:
            return {"ok": True, "done": f"{pending.what}: asked for, but a later plan replaced it before it served",
                    "plan": self.board.plan.to_json()}  # fmt: skip
        seconds = record.seconds(record.serving) or 0.0
        reply = {
            "ok": True,
            "done": f"switched from {record.old.describe() if record.old else '-'} to {record.new.describe()}; "
            f"the new pool served {seconds * 1000:.0f} ms after the decision",
            "plan": record.new.to_json(),
            "reconfiguration": record.to_json(),
        }
        if pending.vacate:
            reply["share"] = self.colocation.demand()["share"]
            reply["vacated_s"] = time.monotonic() - record.decided
        return reply

    def _reply(self, identity: bytes, body: dict[str, Any]) -> None:
        try:
            self.socket.send_multipart([identity, json.dumps(body).encode()], zmq.NOBLOCK)
        except zmq.ZMQError as exc:
            log.debug("control: could not answer: %s", exc)


# -- the client side (`packrat reconfigure`) ---------------------------------------------------------
def request(endpoint: str, body: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    """Send one control request and wait for its answer; the daemon's refusal is raised as its own typed
    error (PolicyError for a plan that does not fit, …), silence as ControlError."""
    socket: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.DEALER)
    socket.setsockopt(zmq.LINGER, 0)
    try:
        allow_ipv6(socket, endpoint)
        socket.connect(endpoint)
        socket.send(json.dumps(body).encode())
        if not socket.poll(int(timeout_s * 1000)):
            raise ControlError(
                f"no answer from {endpoint} within {timeout_s:.0f} s: is the daemon running with this --control "
                "(its log names it at start), and does this user own its run dir?"
            )
        reply = json.loads(socket.recv())
    finally:
        socket.close()
    if not reply.get("ok"):
        error = reply.get("error") or {}
        kind = getattr(errors, str(error.get("type")), None)
        if not (isinstance(kind, type) and issubclass(kind, PackratError)):
            kind = ControlError
        raise kind(str(error.get("message", "the daemon refused the request")))
    return reply
