"""The state file's parts as Python objects, and the strict reading of each (docs/state.md, "What is kept").

The file is read back by a daemon that must start whatever it holds: edited by hand, written by another
version, or crafted. So every field is read by a typed reader that either returns a value this daemon can
use or raises StateError naming the field (the file is then set aside, and the log says why):

- what a measurement gives (a latency, a sample count, threads, a batch size) must be what the daemon
  writes: a number in its range, of its type;
- what a clock moves (a time of day, an age, a decayed weight) is clamped instead: a clock stepped back or
  forward, or a week's downtime, is no reason to measure again (production's learner clamps its ages and
  weights the same way, adapt.production).
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field
from typing import Any

from packrat_daemon.adapt.production import LearnedCell
from packrat_daemon.measure.contention import Contention
from packrat_daemon.measure.runtime_choice import SERVED, Verdict
from packrat_daemon.ops.state_files import StateError
from policies.base import MAX_INSTANCE_COUNT, Plan
from policies.planning.distribution import BatchDistribution
from policies.planning.profile import Cell, Profile

CellKey = tuple[int, int]

MAX_COUNT = MAX_INSTANCE_COUNT  # threads or inputs of one instance: far past any machine, far from a float's range
MAX_SAMPLES = 10**9
MAX_LATENCY_MS = 86_400_000.0  # a day for one batch: past it, not a measurement
MAX_UNIX = 1e11  # the year 5138: a later time of day is a clock's nonsense, clamped


@dataclass
class Entry:
    """One (runtime, precision)'s offline profile as kept in the file."""

    identity: dict[str, Any]
    profile: Profile
    estimated: dict[CellKey, float] = field(default_factory=dict)
    measured_unix: float = field(default_factory=time.time)
    # A reduced precision's accuracy guard: {"result": GuardResult.to_json(), "settings": what it was run under}.
    guard: dict[str, Any] | None = None
    contention: Contention | None = None  # how crowded its cores were while it was measured (None: unknown)
    measured_while: str | None = None  # the candidate that served meanwhile (a first answer's background), if any

    def to_json(self) -> dict[str, Any]:
        return {
            "identity": self.identity,
            "measured_unix": self.measured_unix,
            "guard": self.guard,
            "cells": [[t, b, c.latency_ms, c.samples, c.p90_ms] for (t, b), c in self.profile.items()],
            "estimated": [[t, b, ms] for (t, b), ms in sorted(self.estimated.items())],
            "contention": None if self.contention is None else self.contention.to_json(),
            "measured_while": self.measured_while,
        }

    @classmethod
    def from_json(cls, data: Any) -> Entry:
        data = _object(data, "an entry")
        ident = identity_from_json(data.get("identity"))
        cells = {}
        for row in _list(data.get("cells"), "an entry's cells"):
            t, b, ms, n, p90 = _row(row, 5, "a cell")
            cells[_key(t, b)] = Cell(_latency(ms), _integer(n, "a cell's samples", 1, MAX_SAMPLES),
                                     None if p90 is None else _latency(p90))  # fmt: skip
        if not cells:  # nothing to plan on: a daemon writes an entry only for a profile it has
            raise StateError("an entry has no cells")
        profile = Profile(cells, model=ident["model"], runtime=ident["runtime"], precision=ident["precision"])
        estimated = {}
        for row in _list(data.get("estimated", []), "an entry's estimated cells"):
            t, b, ms = _row(row, 3, "an estimated cell")
            estimated[_key(t, b)] = _latency(ms)
        crowding = data.get("contention")
        try:
            contention = None if crowding is None else Contention.from_json(crowding)
        except (ValueError, KeyError, TypeError) as exc:
            raise StateError(f"an entry's contention record cannot be read ({exc})") from None
        during = data.get("measured_while")
        during = None if during is None else _text(during, "what served while an entry was measured")
        return cls(ident, profile, estimated, unix(data.get("measured_unix")), _guard(data.get("guard")), contention,
                   during)  # fmt: skip


@dataclass
class Choice:
    """The choice between the candidates at a start: each one's verdict, and the identity it was decided for."""

    verdicts: list[Verdict]
    identities: dict[str, dict[str, Any]]
    # What the choice was planned for besides the identities: the policy and the batch sizes (another
    # distribution may have another fastest candidate).
    settings: dict[str, Any] = field(default_factory=dict)
    decided_unix: float = field(default_factory=time.time)

    def to_json(self) -> dict[str, Any]:
        return {
            "decided_unix": self.decided_unix,
            "settings": self.settings,
            "candidates": [v.to_json() | {"identity": self.identities.get(v.candidate, {})} for v in self.verdicts],
        }

    @classmethod
    def from_json(cls, data: Any) -> Choice:
        data = _object(data, "the choice")
        items = [_object(item, "a candidate") for item in _list(data.get("candidates"), "the candidates")]
        verdicts = [Verdict.from_json(item) for item in items]
        if any(v.predicted_ms is not None and not 0 <= v.predicted_ms < math.inf for v in verdicts):
            raise StateError("a candidate's predicted latency is not a number of milliseconds")
        identities = {
            v.candidate: identity_from_json(item.get("identity")) for v, item in zip(verdicts, items, strict=True)
        }
        settings = _object(data.get("settings") or {}, "the choice's settings")
        return cls(verdicts, identities, settings, unix(data.get("decided_unix")))

    @property
    def served(self) -> str | None:
        return next((v.candidate for v in self.verdicts if v.verdict == SERVED), None)


@dataclass
class Resumed:
    """What the file says about the runtime it served: production's estimates, the live sizes (for a reader
    of the file; a restart plans nothing on them), the plan."""

    key: str
    production: list[LearnedCell]
    distribution: BatchDistribution | None
    plan: Plan | None
    saved_unix: float


def resumed_from_json(served: Any, saved_unix: Any) -> Resumed:
    """The file's `served` part. Production's weights and ages are taken as any number (the learner clamps
    them: a week unseen, a clock stepped back); its latencies must be measurements."""
    served = _object(served, "the served runtime")
    production = []
    for row in _list(served.get("production"), "production's estimates"):
        t, b, ms, weight, age = _row(row, 5, "a production estimate")
        production.append(LearnedCell(_key(t, b), _latency(ms), _number(weight, "a weight"), _number(age, "an age")))
    counts = {}
    for row in _list(served.get("distribution") or [], "the live batch sizes"):
        b, share = _row(row, 2, "a live batch size")
        size, share = _integer(b, "a batch size", 1, MAX_COUNT), _number(share, "a batch size's share")
        if 0 < share <= 1:  # a share that faded to nothing (or is nonsense) is left out
            counts[size] = share
    distribution = BatchDistribution.from_counts(counts) if counts else None
    plan = None if served.get("plan") is None else plan_from_json(served["plan"])
    return Resumed(_text(served.get("key"), "the served key"), production, distribution, plan, unix(saved_unix))


def plan_from_json(data: Any) -> Plan:
    """The saved plan: `Plan.from_json`, its predicted latency a measurement's, its reason said to be restored."""
    try:
        plan = Plan.from_json(data)
    except ValueError as exc:
        raise StateError(f"the saved plan: {exc}") from None
    if plan.predicted_latency_ms is not None:
        _latency(plan.predicted_latency_ms)
    if any(instance.batch < 1 for layout in plan.layouts for instance in layout):
        raise StateError(f"the saved plan: an instance's batch is 0, not an integer from 1 to {MAX_COUNT}")
    return dataclasses.replace(plan, reason=_restored_reason(plan.reason))


def identity_from_json(data: Any) -> dict[str, Any]:
    """A saved identity: an object whose model, runtime and precision are text and whose versions, if any,
    an object; its other keys are only compared (ops.state_identity.mismatch), so any value is safe."""
    ident = _object(data, "an identity")
    for key in ("model", "runtime", "precision"):
        _text(ident.get(key), f"an identity's {key}")
    _object(ident.get("versions") or {}, "an identity's versions")
    return ident


def _guard(guard: Any) -> dict[str, Any] | None:
    """A saved accuracy guard: its result, with the relative error the start logs, and the settings it ran under."""
    if guard is None:
        return None
    if not (isinstance(guard, dict) and isinstance(guard.get("result"), dict)):
        raise StateError("a saved accuracy guard is not an object with a result")
    error = _number(guard["result"].get("max_rel_error"), "a saved accuracy guard's relative error")
    if not 0 <= error < math.inf:
        raise StateError(f"a saved accuracy guard's relative error is {error}, not a number from 0")
    return guard


def unix(value: Any) -> float:
    """A time of day from the file, clamped to [0, MAX_UNIX] (NaN: 0): a clock's nonsense ages what was kept
    (a time in the future counts as now), it never stops a start."""
    seconds = _number(value, "a time")
    return min(seconds, MAX_UNIX) if seconds > 0 else 0.0


def _restored_reason(reason: str) -> str:
    """A restored plan's reason: the saved one, said to be restored once (a plan restored and saved again
    keeps its first reason, not one more "restored from" per restart)."""
    prefix = "restored from the state file ("
    return reason if reason.startswith(prefix) else f"{prefix}{reason})"


def _object(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise StateError(f"{what} is {_short(value)}, not an object")
    return value


def _list(value: Any, what: str) -> list[Any]:
    if not isinstance(value, list):
        raise StateError(f"{what} is {_short(value)}, not a list")
    return value


def _row(value: Any, length: int, what: str) -> list[Any]:
    row = _list(value, what)
    if len(row) != length:
        raise StateError(f"{what} has {len(row)} fields, not {length}")
    return row


def _text(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise StateError(f"{what} is {_short(value)}, not text")
    return value


def _number(value: Any, what: str) -> float:
    """Any JSON number as a float (a huge integer as infinity); not a bool, not text."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise StateError(f"{what} is {_short(value)}, not a number")
    return float(value) if isinstance(value, float) or abs(value) < 2**1000 else math.copysign(math.inf, value)


def _integer(value: Any, what: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise StateError(f"{what} is {_short(value)}, not an integer from {low} to {high}")
    return value


def _key(threads: Any, batch: Any) -> CellKey:
    return _integer(threads, "a cell's threads", 1, MAX_COUNT), _integer(batch, "a cell's batch", 1, MAX_COUNT)


def _latency(value: Any) -> float:
    ms = _number(value, "a latency")
    if not 0 < ms <= MAX_LATENCY_MS:  # NaN fails too
        raise StateError(f"a latency is {_short(value)}, not a number of milliseconds above 0 and up to a day")
    return ms


def _short(value: Any) -> str:
    """`value` for a log line: a crafted file's field may be megabytes."""
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:37]}..."
