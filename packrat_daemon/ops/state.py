"""The learned profile kept across restarts, in the state directory (`--state-dir`; by default systemd's
StateDirectory=, else the user's state folder: `state_folder`).

One JSON file, `learned-profile.json`, holds what this daemon knows about its model on this machine:

- per (runtime, precision) it prepared: the cells measured at start (with samples and p90), the cells the
  adaptive search only estimated (kept apart, never served on), when they were measured, and the identity
  they hold for: the model (its spec, and a file model's SHA-256), the runtime and precision, the library
  versions that compute it, and the usable cores;
- the choice between the candidates: each one's verdict (served, slower, refused by the accuracy guard) and
  why, with the identity it was decided for, so that a restart whose candidates all match serves the one
  chosen without starting the others;
- for the runtime served: production's running estimates (latency, decayed sample weight, age), the
  live batch sizes, and the plan served.

It is written atomically (a temporary file, fsync, rename, fsync of the folder): periodically, on every
plan change and at stop, so a SIGKILL loses at most `SAVE_INTERVAL_S` of production's learning. At start
it is read back when the identity matches: the daemon then serves the saved plan without measuring. A
file whose identity does not match (another model, a library upgrade, fewer cores) or that cannot be read
is set aside, renamed with the time, and the log line says why; it never stops a start. The folder and
its file are held to the run dir's rules, and read bounded (`state_files`); a saved plan is checked against
this machine before a worker is forked for it.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import json
import logging
import math
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from packrat_daemon.adapt.production import LearnedCell
from packrat_daemon.config import ServeConfig
from packrat_daemon.measure.runtime_choice import SERVED, Verdict
from packrat_daemon.ops.state_files import (
    MAX_STATE_BYTES,
    StateError,
    check_folder,
    load_json,
    read_bounded,
    set_aside,
    write_atomically,
)
from packrat_daemon.wire.errors import ConfigError, PackratError
from policies.base import InstancePlan, Plan
from policies.planning.distribution import BatchDistribution
from policies.planning.profile import Cell, Profile
from policies.planning.topology import Topology
from workers.models.spec import EMULATED

if TYPE_CHECKING:
    from packrat_daemon.adapt.online import OnlineAdaptation

log = logging.getLogger("packrat.daemon")

STATE_FILE = "learned-profile.json"
FORMAT = 1
NO_STATE = "none"  # --state-dir none: keep nothing
APP = "packrat"
SAVE_INTERVAL_S = 60.0  # production's learning a SIGKILL may lose, against a write (and fsync) per interval

# The libraries whose version changes what a runtime measures (the ONNX and OpenVINO runtimes run models
# converted by torch's exporter).
LIBRARIES = {"torch": ("torch",), "onnxruntime": ("torch", "onnxruntime"), "openvino": ("torch", "openvino")}

CellKey = tuple[int, int]


def state_folder(setting: str | None, model: str, policy: str, environ: Mapping[str, str] | None = None) -> str | None:
    """Where the state is kept: `--state-dir` as given (None for `none`); unset, systemd's $STATE_DIRECTORY (the
    first, when it lists several), else a folder per model and policy under $XDG_STATE_HOME/packrat or
    ~/.local/state/packrat. Per model and policy because one user may run several daemons (the demo runs two),
    each of which writes its whole file: one folder for all would have each daemon set the others' file aside."""
    if setting is not None:
        return None if setting == NO_STATE else setting
    environ = os.environ if environ is None else environ
    if environ.get("STATE_DIRECTORY"):
        return environ["STATE_DIRECTORY"].split(":")[0]
    home = environ.get("HOME") or os.path.expanduser("~")
    base = environ.get("XDG_STATE_HOME") or os.path.join(home, ".local", "state")
    name = os.path.abspath(model) if os.path.exists(model) else model  # a file or folder: wherever it was named from
    slug = "".join(c if c.isalnum() or c in "-_." else "-" for c in os.path.basename(name.rstrip("/")))[:40]
    tag = hashlib.sha256(f"{name}\0{policy}".encode()).hexdigest()[:8]
    return os.path.join(base, APP, f"{slug.strip('-.') or 'model'}-{policy}-{tag}")


class Serving(Protocol):
    """What the state needs of the running daemon."""

    plan: Plan
    profile: Profile | None
    adaptation: OnlineAdaptation


def identity(
    config: ServeConfig, runtime: str, precision: str, cores: int, digest: Callable[[str], str] | None = None
) -> dict[str, Any]:
    """What a saved profile must match to be served again. `digest`: a file's SHA-256 (a cache of `_sha256`)."""
    digest = digest or _sha256
    model_file = None
    if os.path.isfile(config.model):
        model_file = digest(config.model)
    # A --profile file's cells are the offline half of what was learned: another file, another start.
    profile_file = digest(config.profile) if config.profile else None
    versions = {name: _version(name) for name in LIBRARIES.get(runtime, ())}
    if runtime == EMULATED and config.profile:
        # An emulation's "library" is the table its workers wait and the interference they add.
        versions = {
            "emulated profile": profile_file,
            "interference": config.emulate_interference or "default",
        }
    return {
        "model": config.model,
        "model_sha256": model_file,
        "profile_sha256": profile_file,
        "runtime": runtime,
        "precision": precision,
        "versions": versions,
        "usable_cores": cores,
    }


def mismatch(saved: dict[str, Any], current: dict[str, Any]) -> str | None:
    """Why a profile saved for `saved` cannot serve `current`, or None."""
    changed = {"model_sha256": "the model file changed", "profile_sha256": "the --profile file changed"}
    for key in ("model", "model_sha256", "profile_sha256", "runtime", "precision", "usable_cores"):
        if saved.get(key) != current[key]:
            return changed.get(key, f"{key} {saved.get(key)!r} → {current[key]!r}")
    old = saved.get("versions") or {}
    for name, version in current["versions"].items():
        if old.get(name) != version:
            return f"{name} {old.get(name)} → {version}"
    return None


@dataclass
class Entry:
    """One (runtime, precision)'s offline profile as kept in the file."""

    identity: dict[str, Any]
    profile: Profile
    estimated: dict[CellKey, float] = field(default_factory=dict)
    measured_unix: float = field(default_factory=time.time)
    # A reduced precision's accuracy guard: {"result": GuardResult.to_json(), "settings": what it was run under}.
    guard: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "identity": self.identity,
            "measured_unix": self.measured_unix,
            "guard": self.guard,
            "cells": [[t, b, c.latency_ms, c.samples, c.p90_ms] for (t, b), c in self.profile.items()],
            "estimated": [[t, b, ms] for (t, b), ms in sorted(self.estimated.items())],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Entry:
        ident = data["identity"]
        cells = {(int(t), int(b)): Cell(float(ms), int(n), None if p90 is None else float(p90))
                 for t, b, ms, n, p90 in data["cells"]}  # fmt: skip
        profile = Profile(cells, model=ident["model"], runtime=ident["runtime"], precision=ident["precision"])
        estimated = {(int(t), int(b)): float(ms) for t, b, ms in data.get("estimated", [])}
        guard = data.get("guard")
        if guard is not None and not (isinstance(guard, dict) and isinstance(guard.get("result"), dict)):
            raise StateError("a saved accuracy guard is not an object with a result")
        return cls(ident, profile, estimated, float(data["measured_unix"]), guard)


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
    def from_json(cls, data: dict[str, Any]) -> Choice:
        verdicts = [Verdict.from_json(item) for item in data["candidates"]]
        identities = {str(item["candidate"]): dict(item["identity"]) for item in data["candidates"]}
        return cls(verdicts, identities, dict(data.get("settings") or {}), float(data["decided_unix"]))

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


class StateKeeper:
    """The state file of one daemon: read at start, written while serving. Without a state folder (`--state-dir
    none`, or a default one that cannot be used) it keeps nothing and writes nothing, so the daemon calls it the
    same way either way. `default`: the folder is the default one (`state_folder`), not one the user gave; one
    that cannot be used is then logged and nothing kept, where a given one stops the start (ConfigError)."""

    def __init__(self, state_dir: str | None, default: bool = False) -> None:
        self.path = None if state_dir is None else Path(state_dir) / STATE_FILE
        self.entries: dict[str, Entry] = {}
        self.saved: dict[str, Entry] = {}  # entries read from the file, served again when they match
        self.resumed: Resumed | None = None
        self.restored_from: str | None = None  # the file a plan was restored from
        self.served_key: str | None = None
        self.last_saved = -math.inf  # the first tick writes: a SIGKILL right after start keeps the start-up profile
        self._digest = functools.cache(_sha256)  # the model is hashed once, not once per runtime candidate
        self.saved_choice: Choice | None = None  # the file's choice between the candidates
        self.choice: Choice | None = None  # this start's (or the file's, when served from it)
        self.choice_restored = False  # the choice is the file's: the other candidates were not started
        if self.path is not None:
            try:
                check_folder(self.path.parent)
            except ConfigError as exc:
                if not default:
                    raise
                log.warning("state: the default state folder cannot be used (%s); nothing is kept across "
                            "restarts: give --state-dir DIR, or --state-dir none to say so", exc)  # fmt: skip
                self.path = None
                return
            self._load()

    # -- start ----------------------------------------------------------------------------------
    def _load(self) -> None:
        assert self.path is not None
        try:
            raw = read_bounded(self.path)
        except StateError as exc:
            self.set_aside(str(exc))
            return
        except OSError as exc:
            log.warning("state: cannot read %s (%s); measuring again", self.path, exc.strerror)
            return
        if raw is None:
            log.info("state: no %s yet; the profile is measured and kept there", self.path)
            return
        try:
            data = load_json(raw)
            if not isinstance(data, dict) or data.get("format") != FORMAT:
                raise StateError(f"not a format-{FORMAT} state file")
            self.saved = {key: Entry.from_json(entry) for key, entry in data["entries"].items()}
            choice = data.get("choice")
            self.saved_choice = None if choice is None else Choice.from_json(choice)
            served = data.get("served")
            if served is not None:
                self.resumed = _resumed(served, float(data["saved_unix"]))
        except (ValueError, KeyError, TypeError, IndexError, AttributeError) as exc:
            self.saved, self.resumed, self.saved_choice = {}, None, None
            self.set_aside(f"it cannot be read ({type(exc).__name__}: {exc})")
            return
        except PackratError as exc:  # a bad cell (ProfileError): still never a reason not to start
            self.saved, self.resumed, self.saved_choice = {}, None, None
            self.set_aside(f"it holds an unusable profile ({exc})")

    def identity(self, config: ServeConfig, runtime: str, precision: str, cores: int) -> dict[str, Any]:
        """`identity` for this start; empty without --state-dir (nothing is kept to match, no file is hashed)."""
        return {} if self.path is None else identity(config, runtime, precision, cores, self._digest)

    def guard_settings(self, config: ServeConfig) -> dict[str, Any]:
        """What an accuracy guard's verdict holds for besides the identity: the same verdict comes only from the
        same tolerance, top-1 rule and calibration inputs."""
        calibration = None if not config.calibration else self._digest(config.calibration)
        return {"max_rel_error": config.max_rel_error, "accuracy_top1": config.accuracy_top1,
                "calibration_sha256": calibration}  # fmt: skip

    def restore(self, key: str, current: dict[str, Any]) -> Entry | None:
        """The saved profile of `key` when its identity matches `current`; a mismatch sets the file aside."""
        entry = self.saved.get(key)
        if entry is None:
            return None
        why = mismatch(entry.identity, current)
        if why is not None:
            self.saved, self.resumed, self.saved_choice = {}, None, None
            self.set_aside(f"it was measured for another setting ({key}: {why})")
            return None
        return entry

    def warm_choice(self, identities: dict[str, dict[str, Any]], settings: dict[str, Any]) -> str | None:
        """The candidate to serve without starting the others: the one the file says was chosen, when the file
        holds a choice between exactly these candidates (`identities`: each one's identity now, by label), each
        decided for the identity it has now and for these `settings` (Choice.settings), and the chosen one's
        profile and served plan. None otherwise (every candidate is then prepared; a mismatch of a profile is
        logged and set aside as it is restored)."""
        saved = self.saved_choice
        if saved is None or self.path is None:
            return None
        if saved.settings != settings:
            changed = ", ".join(f"{k} {saved.settings.get(k)!r} → {v!r}" for k, v in settings.items()
                                if saved.settings.get(k) != v)  # fmt: skip
            log.info("state: the choice was made for other settings (%s); choosing again", changed)
            return None
        if sorted(saved.identities) != sorted(identities):
            log.info("state: the candidates changed (%s at the last choice, %s now); choosing again",
                     ", ".join(sorted(saved.identities)), ", ".join(sorted(identities)))  # fmt: skip
            return None
        for key, current in identities.items():
            why = mismatch(saved.identities[key], current)
            if why is not None:
                log.info("state: the choice was made for another setting (%s: %s); choosing again", key, why)
                return None
        served = saved.served
        resumed = self.resumed
        if served is None or served not in self.saved or resumed is None or resumed.key != served:
            return None
        self.choice, self.choice_restored = saved, True
        return served

    def set_aside(self, why: str) -> None:
        """Rename the file out of the way (kept for a look), and say why."""
        assert self.path is not None
        try:
            aside = set_aside(self.path)
        except (OSError, PackratError) as exc:
            log.warning("state: %s is not used: %s; it could not be renamed either (%s)", self.path, why, exc)
            return
        log.warning("state: set %s aside as %s: %s; measuring again", self.path, aside, why)

    def resumed_plan(self, key: str, policy: str, topology: Topology, max_batch: int) -> Plan | None:
        """The plan the file says was served on `key`, if this daemon can serve it as it is: re-checked against
        this machine (a file may have been crafted, or saved under another max_batch), and why not logged."""
        resumed = self.resumed
        if resumed is None or resumed.key != key or resumed.plan is None or resumed.plan.policy != policy:
            return None
        why = resumed.plan.misfit(topology, max_batch)
        if why is not None:
            log.warning("state: the saved plan is not served here: %s", why)
            return None
        return resumed.plan

    def record(self, key: str, entry: Entry) -> None:
        """A (runtime, precision)'s offline profile, measured or restored, to keep in every later write."""
        self.entries[key] = entry

    def attach(self, adaptation: OnlineAdaptation) -> StateKeeper:
        """Hand production's saved estimates back to the running daemon's adaptation, aged by the downtime."""
        resumed = self.resumed
        if resumed is not None and resumed.key == self.served_key and self.restored_from is not None:
            downtime = max(0.0, time.time() - resumed.saved_unix)
            adaptation.production.restore(resumed.production, time.monotonic(), downtime)
        return self

    # -- serving --------------------------------------------------------------------------------
    def tick(self, serving: Serving, now: float) -> None:
        """The periodic write, every SAVE_INTERVAL_S."""
        if self.path is not None and now - self.last_saved >= SAVE_INTERVAL_S:
            self.save(serving, "periodic")

    def save(self, serving: Serving, why: str) -> None:
        """Write everything known now; an error is logged (the daemon keeps serving)."""
        if self.path is None or self.served_key is None:
            return
        now = time.monotonic()
        self.last_saved = now
        if serving.profile is not None and self.served_key in self.entries:
            self.entries[self.served_key].profile = serving.profile
        live = serving.adaptation.estimator.distribution(now)
        document = {
            "format": FORMAT,
            "saved_unix": time.time(),
            "why": why,
            "entries": {key: entry.to_json() for key, entry in self.entries.items()},
            "choice": None if self.choice is None else self.choice.to_json(),
            "served": {
                "key": self.served_key,
                "production": [
                    [*c.key, c.latency_ms, c.weight, c.age_s] for c in serving.adaptation.production.export(now)
                ],
                "distribution": None if live is None else [[b, w] for b, w in live.weights],
                "plan": serving.plan.to_json(),
            },
        }
        try:
            data = json.dumps(document, allow_nan=False).encode()
            if len(data) > MAX_STATE_BYTES:  # the next start would refuse to read it
                raise StateError(f"it would be {len(data)} bytes, more than the {MAX_STATE_BYTES} a start reads")
            write_atomically(self.path, data)
        except (OSError, ValueError, PackratError) as exc:  # a folder changed under the daemon: ConfigError
            log.error("state: could not write %s (%s); still serving", self.path, exc)

    def choice_status(self) -> dict[str, Any] | None:
        """The choice between the candidates, for `packrat status`: what is served, each candidate's verdict and
        why, and whether it was made at this start or at an earlier one whose file this start served from."""
        choice = self.choice
        if choice is None:
            return None
        return {
            "served": choice.served,
            "decided_at_this_start": not self.choice_restored,
            "decided_age_s": round(time.time() - choice.decided_unix, 1),
            "candidates": [verdict.to_json() for verdict in choice.verdicts],
        }

    def provenance(self, serving: Serving, now: float | None = None) -> dict[str, Any]:
        """Where the served profile's cells come from, for `packrat status`: measured at start (and when),
        estimated by the start-up search (never served on), and learned in production (with their ages)."""
        now = time.monotonic() if now is None else now
        entry = self.entries.get(self.served_key or "")
        learned = serving.adaptation.production.export(now)
        counted = serving.adaptation.production.learned(now)
        return {
            "measured_offline": 0 if serving.profile is None else len(serving.profile),
            "offline_age_s": None if entry is None else round(time.time() - entry.measured_unix, 1),
            "estimated": 0 if entry is None else len(entry.estimated),
            "learned_in_production": len(counted),
            "production": [
                {
                    "threads": c.key[0],
                    "batch": c.key[1],
                    "latency_ms": round(c.latency_ms, 4),
                    "weight": round(c.weight, 2),
                    "age_s": round(c.age_s, 1),
                    "counts": c.key in counted,
                }
                for c in learned
            ],  # fmt: skip
            "restored_from": self.restored_from,
            "state_file": None if self.path is None else str(self.path),
            "saved_age_s": None if self.path is None or self.last_saved < 0 else round(now - self.last_saved, 1),
        }


def plan_from_json(data: dict[str, Any]) -> Plan:
    """The inverse of Plan.to_json."""

    def instances(items: list[dict[str, Any]]) -> tuple[InstancePlan, ...]:
        return tuple(InstancePlan(int(i["threads"]), int(i["batch"])) for i in items)

    predicted = data.get("predicted_latency_ms")
    plan = Plan(
        instances=instances(data["instances"]),
        policy=str(data["policy"]),
        reason=_restored_reason(str(data.get("reason", ""))),
        predicted_latency_ms=None if predicted is None else float(predicted),
        oversubscribed=bool(data.get("oversubscribed", False)),
        split=str(data.get("split", "exact")),
        alternatives=tuple(instances(layout) for layout in data.get("alternatives", [])),
    )
    if not plan.instances or any(i.threads < 1 or i.batch < 1 for i in plan.instances):
        raise StateError("the saved plan has no instances")
    return plan


def _restored_reason(reason: str) -> str:
    """A restored plan's reason: the saved one, said to be restored once (a plan restored and saved again
    keeps its first reason, not one more "restored from" per restart)."""
    prefix = "restored from the state file ("
    return reason if reason.startswith(prefix) else f"{prefix}{reason})"


def _resumed(served: dict[str, Any], saved_unix: float) -> Resumed:
    production = [
        LearnedCell((int(t), int(b)), float(ms), float(w), float(age)) for t, b, ms, w, age in served["production"]
    ]
    if any(
        not (math.isfinite(c.latency_ms) and math.isfinite(c.weight) and math.isfinite(c.age_s)) for c in production
    ):
        raise StateError("a production estimate is not a finite number")
    sizes = served.get("distribution")
    distribution = None if not sizes else BatchDistribution.from_counts({int(b): float(w) for b, w in sizes})
    plan = None if served.get("plan") is None else plan_from_json(served["plan"])
    return Resumed(str(served["key"]), production, distribution, plan, saved_unix)


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None
