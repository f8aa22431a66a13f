"""The daemons `packrat coordinate` drives, over their control sockets: the co-location loop's `Daemons`
(packrat_daemon.coordinate.core) for real daemons.

Each look asks every daemon for its demand (`{"op": "demand"}` on its control socket: profile, live batch
sizes, the inputs queued since start and the queue now, the CPUs it holds). A daemon that does not answer is
down: it is skipped, its share stays reserved for it, and no core moves while it is away (its cores are
neither planned for nor given away). When it answers again it is told its share at once. When cores move,
each daemon is told its new CPUs and plan (`{"op": "assign"}`) in `shares.move_order`: one that loses cores
finishes its switch (its reply comes once no worker of it is left on a CPU it gave away) before one that
gains them is told. Every control error is logged, and the next look retries.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from packrat_daemon.coordinate.core import finite, ms
from packrat_daemon.coordinate.readings import Reading
from packrat_daemon.coordinate.shares import CoordinateError, divide, even_split, move_order
from packrat_daemon.coordinate.watch import Decision
from packrat_daemon.wire.errors import ConfigError, PackratError, PolicyError, TopologyError
from policies.base import Plan
from policies.colocation import ModelDemand
from policies.planning.distribution import BatchDistribution
from policies.planning.profile import Profile
from policies.planning.topology import format_cpulist

log = logging.getLogger("packrat.coordinate")

MOVES_KEPT = 50  # moves listed in the status file
LOOK_TIMEOUT_S = 2.0  # the least a look waits for a daemon's demand before it counts as down
Request = Callable[[str, dict[str, Any], float], dict[str, Any]]
# What a daemon answers when it refuses an assign; any other error (silence above all) means it is down.
_REFUSALS = (PolicyError, TopologyError, ConfigError)


@dataclass
class Link:
    """One daemon as the coordinator sees it."""

    name: str
    endpoint: str  # its control socket
    target_ms: float | None = None
    up: bool = False
    answered: bool = False  # it has answered at least once
    holds: frozenset[int] = frozenset()  # the CPUs it may still have workers on (its share, plus any left)
    demand: dict[str, Any] | None = None  # its last demand reply
    error: str | None = None  # why the last request failed
    returned: bool = False  # it answered after being down (or for the first time): tell it its share

    def to_json(self, share: frozenset[int], offered: float | None = None) -> dict[str, Any]:
        demand = self.demand or {}
        return {
            "name": self.name,
            "control": self.endpoint,
            "up": self.up,
            "cpus": format_cpulist(share),
            "cores_assigned": None if not demand else (demand.get("share") or {}).get("cores"),
            "holds": format_cpulist(self.holds) if self.holds else None,
            "model": demand.get("model"),
            "batches_per_s": demand.get("batches_per_s"),
            "inputs_per_s": demand.get("inputs_per_s"),
            "offered_inputs_per_s": offered,  # the watch's rate of arrivals (what the joint plan is planned for)
            "queued_inputs": demand.get("queued_inputs"),
            "has_profile": demand.get("profile") is not None if demand else None,
            "error": self.error,
        }


@dataclass
class Move:
    """One move of cores: the split before and after, the joint plan's prediction, and each daemon's switch."""

    wall: float
    reason: str
    before: dict[str, str]  # model -> cpulist
    after: dict[str, str]
    predicted_ms: tuple[float | None, float | None]  # the joint plan's mean sojourn before and after
    steps: list[dict[str, Any]] = field(default_factory=list)  # each assign in order: model, seconds, ok, error

    @property
    def gain(self) -> float | None:
        before, after = self.predicted_ms
        if before is None or after is None or before <= 0:
            return None
        return 1.0 - after / before

    def to_json(self) -> dict[str, Any]:
        return {
            "time": self.wall,
            "reason": self.reason,
            "from": self.before,
            "to": self.after,
            "predicted_ms": list(self.predicted_ms),
            "predicted_gain": self.gain,
            "steps": self.steps,
        }


class ControlDaemons:
    """The daemons over their control sockets, as the co-location loop drives them (`core.Daemons`)."""

    def __init__(
        self,
        links: Sequence[Link],
        cores: Sequence[tuple[int, ...]],
        interval_s: float,
        timeout_s: float,
        request: Request,
        clock: Callable[[], float],
    ) -> None:
        self.links = list(links)
        self.by_name = {link.name: link for link in self.links}
        self.cores = tuple(cores)  # the physical cores handed out, in topology order
        self.interval_s, self.timeout_s = interval_s, timeout_s
        self.request = request
        self.clock = clock
        # The even division: what each daemon's own --cpus should say, and the share a restarted one comes back on.
        self.first = self.divide(even_split(len(self.cores), len(self.links)))
        # The start is the safe default, every model on all the cores: the joint strategy leaves it for a split
        # once the traffic asks for one (policies.colocation_choice).
        self.split = tuple(len(self.cores) for _ in self.links)
        self.shares = self.divide(self.split)
        self.plans: dict[str, Plan | None] = {link.name: None for link in self.links}
        self.declined = ""  # why the last look did not move cores
        self.moves: deque[Move] = deque(maxlen=MOVES_KEPT)
        self._profiles: dict[str, tuple[str, Profile]] = {}

    @property
    def names(self) -> list[str]:
        return [link.name for link in self.links]

    @property
    def down(self) -> list[str]:
        return [link.name for link in self.links if not link.up]

    # -- looking ------------------------------------------------------------------------------------
    def look(self) -> dict[str, Reading | None]:
        """Every daemon's demand; then the share of each that returned (or came for the first time) told it."""
        readings: dict[str, Reading | None] = {}
        for link in self.links:
            self._look(link, readings)
        returned = [link.name for link in self.links if link.up and link.returned]
        if returned:
            target = {name: self.shares[name] for name in returned}
            # Models that share those CPUs by design (every model on all the cores) keep sharing them.
            shared = {
                link.name: self.shares[link.name]
                for link in self.links
                if link.name not in target and any(self.shares[link.name] & cpus for cpus in target.values())
            }
            self._assign(returned, target | shared, "its share", None)
        return readings

    def _look(self, link: Link, readings: dict[str, Reading | None]) -> None:
        try:
            # A loaded machine may keep a live daemon's loop from answering for a second; two is not yet a flap.
            reply = self.request(
                link.endpoint, {"op": "demand"}, min(self.timeout_s, max(LOOK_TIMEOUT_S, self.interval_s))
            )
        except PackratError as exc:
            if link.up or (not link.answered and link.error is None):  # once, when it goes (or is never) up
                log.warning("%s is down (%s); its share %s stays reserved for it", link.name, exc,
                            format_cpulist(self.shares[link.name]))  # fmt: skip
            link.up, link.error = False, str(exc)
            link.holds = link.holds or self.shares[link.name]
            readings[link.name] = None
            return
        demand = reply["demand"]
        share = frozenset(int(cpu) for cpu in demand["share"]["cpu_ids"])
        if not link.up:
            link.returned = True  # back (or here for the first time): it starts on its --cpus, not its share
            log.info("%s is up on CPUs %s", link.name, format_cpulist(share))
        elif share != self.shares[link.name]:
            # Up at every look, yet not on its share: it restarted between two looks, on its --cpus.
            link.returned = True
            log.warning("%s serves on CPUs %s, not its share %s (restarted?); telling it its share", link.name,
                        format_cpulist(share), format_cpulist(self.shares[link.name]))  # fmt: skip
        # Its share is what it holds once its last switch has left every other CPU; until then, both.
        link.holds = share if demand.get("vacated", True) else share | link.holds
        link.up, link.answered, link.demand, link.error = True, True, demand, None
        if "arrived_inputs" in demand:
            requests = demand.get("arrived_requests")
            readings[link.name] = Reading(
                self.clock(),
                int(demand["arrived_inputs"]),
                int(demand.get("queued_inputs") or 0),
                None if requests is None else int(requests),
            )

    def away(self, down: Sequence[str]) -> None:
        """A daemon that is down comes back on its own --cpus, its first share: every model up that was moved
        onto some of those CPUs gives them up now, so that the restarted one finds them free; the down one's
        share is its first one again, and the joint plan may move cores once it is back."""
        taken = frozenset().union(*(self.first[name] for name in down))
        target = {}
        for link in self.links:
            keep = self.shares[link.name] - taken
            if link.up and keep != self.shares[link.name] and keep:
                target[link.name] = keep
        if target:
            self._assign(list(target), target, f"{', '.join(down)} down: its first share kept free", (None, None))
        for name in down:
            self.shares[name] = self.first[name]
        self.split = tuple(sum(1 for core in self.cores if set(core) & self.shares[link.name]) for link in self.links)

    def bases(self) -> list[ModelDemand | None]:
        return [self._demand(link) for link in self.links]

    def _demand(self, link: Link) -> ModelDemand | None:
        """The model's demand but its rate (the watch's, from its arrivals): profile, batch sizes, target."""
        demand = link.demand or {}
        if demand.get("profile") is None:
            return None
        text = demand["profile"]
        if self._profiles.get(link.name, (None,))[0] != text:  # parsed once per profile, not at every look
            self._profiles[link.name] = (text, Profile.parse_csv(text, source=f"{link.name}'s profile"))
        profile = self._profiles[link.name][1]
        sizes = {int(b): float(w) for b, w in demand.get("batch_sizes") or []}
        # A model without traffic yet: its plan for one input (no arrivals: no rate, it keeps the fewest cores).
        distribution = BatchDistribution.from_counts(sizes) if sizes else BatchDistribution.single(1)
        return ModelDemand(link.name, profile, distribution, 0.0, link.target_ms)

    # -- moving -------------------------------------------------------------------------------------
    def move(self, now: float, decision: Decision) -> bool:
        """Each daemon whose share changes told its share and plan of the joint plan; True once all took it."""
        current, proposed = decision.current, decision.proposed
        assert current is not None and proposed is not None  # a decision to move has both
        target = self.divide(proposed.split)
        plans = {share.name: share.plan for share in proposed.shares}
        names = [link.name for link in self.links if target[link.name] != self.shares[link.name]]
        predicted = (finite(current.predicted_ms), finite(proposed.predicted_ms))
        reason = "joint plan" if decision.rule == "gain" else f"joint plan, {', '.join(decision.backlogged)} backlogged"
        if decision.choice is not None:
            reason = f"{reason}: {decision.choice.mode}"
        move = self._assign(names, {name: target[name] for name in names}, reason, predicted, plans)
        if move is None or not all(step["ok"] for step in move.steps):
            return False
        self.split = proposed.split
        self.plans.update(plans)
        return True

    def hold(self, now: float, decision: Decision) -> None:
        """Nothing: a daemon re-plans inside its share by its own adaptation."""

    def decline(self, why: str) -> None:
        self.declined = why

    def _assign(
        self,
        names: Sequence[str],
        target: Mapping[str, frozenset[int]],
        reason: str,
        predicted: tuple[float | None, float | None] | None,
        plans: Mapping[str, Plan] | None = None,
    ) -> Move | None:
        """Tell `names` their `target` CPUs (and plans), shrinks first; a failure ends the move there."""
        held = {link.name: link.holds for link in self.links}
        try:
            # One that already holds its target is told too (a daemon back on its --cpus: the share is now ours).
            order = [name for name in names if held.get(name) == target[name]] + move_order(held, target)
        except CoordinateError as exc:
            log.error("coordinator: %s", exc)
            self.declined = str(exc)
            return None
        move = None if predicted is None else self._record(names, target, reason, predicted)
        for name in order:
            plan = None if plans is None else plans.get(name)
            if not self._tell(name, target[name], plan, reason, move):
                return move
        return move

    def _record(
        self,
        names: Sequence[str],
        target: Mapping[str, frozenset[int]],
        reason: str,
        predicted: tuple[float | None, float | None],
    ) -> Move:
        """A move begun: logged and listed in the status file."""
        before = {name: format_cpulist(self.shares[name]) for name in names}
        move = Move(time.time(), reason, before, {name: format_cpulist(target[name]) for name in names}, predicted)
        said = (
            ""
            if predicted == (None, None)
            else f"; the joint plan's mean sojourn {ms(predicted[0])} → {ms(predicted[1])}"
        )
        gain = "" if move.gain is None else f", predicted gain {move.gain:.1%}"
        log.info(
            "moving cores (%s): %s → %s%s%s",
            reason, describe({n: self.shares[n] for n in names}), describe(target), said, gain,
        )  # fmt: skip
        self.moves.append(move)
        return move

    def _tell(self, name: str, cpus: frozenset[int], plan: Plan | None, reason: str, move: Move | None) -> bool:
        """One assign: `name` told its CPUs (and plan); whether it took them."""
        link = self.by_name[name]
        body: dict[str, Any] = {"op": "assign", "cpus": sorted(cpus), "reason": f"coordinator: {reason}"}
        if plan is not None:
            body["plan"] = _compact(plan)
        if move is not None and move.gain is not None:
            body["gain"] = move.gain
        started = time.monotonic()
        try:
            reply = self.request(link.endpoint, body, self.timeout_s)
        except PackratError as exc:
            # Down mid-move, or it refused: the models after it wait for the next look (what it holds is
            # then read again), so none grows onto CPUs it may still use.
            log.warning("coordinator: %s refused or did not answer its share %s: %s", name,
                        format_cpulist(cpus), exc)  # fmt: skip
            link.error = str(exc)
            if not isinstance(exc, _REFUSALS):
                link.up = False
            if move is not None:
                move.steps.append({"model": name, "ok": False, "seconds": time.monotonic() - started,
                                   "error": str(exc)})  # fmt: skip
            return False
        seconds = time.monotonic() - started
        link.holds, link.returned = cpus, False
        self.shares[name] = cpus
        if plan is not None:
            self.plans[name] = plan
        log.info("%s serves on CPUs %s (%.0f ms): %s", name, format_cpulist(cpus), seconds * 1000,
                 reply.get("done", ""))  # fmt: skip
        if move is not None:
            move.steps.append({"model": name, "ok": True, "seconds": seconds})
        return True

    def divide(self, split: Sequence[int]) -> dict[str, frozenset[int]]:
        """Each model's CPUs for `split` (its cores, in order; more than the machine's in all: every model on
        all of them, the joint strategy's `every` choice)."""
        if sum(split) > len(self.cores) and all(count == len(self.cores) for count in split):
            every = frozenset(cpu for core in self.cores for cpu in core)
            return {link.name: every for link in self.links}
        cpus = divide(self.cores, split)
        return {link.name: frozenset(share) for link, share in zip(self.links, cpus, strict=True)}


def describe(shares: Mapping[str, frozenset[int]]) -> str:
    return ", ".join(f"{name} on CPUs {format_cpulist(cpus)}" for name, cpus in shares.items())


def _compact(plan: Plan) -> dict[str, Any]:
    """The plan for an assign request: Plan.to_json without its reason's prose (the request is bounded)."""
    body = plan.to_json()
    body["reason"] = "the coordinator's joint plan"
    return body
