"""The learned profile kept across restarts, in the state directory (`--state-dir`; by default systemd's
StateDirectory=, else the user's state folder: `state_folder`).

One JSON file, `learned-profile.json`, holds what this daemon knows about its model on this machine:

- per (runtime, precision) it prepared: the cells measured at start (with samples and p90), the cells the
  adaptive search only estimated (kept apart, never served on), when they were measured, and the identity
  they hold for: everything that changes a measurement (`state_identity`: the model's spec and content,
  the input declared, the runtime and precision, the library versions that compute it, the CPU set);
- the choice between the candidates: each one's verdict (served, slower, refused by the accuracy guard) and
  why, with the identity it was decided for, so that a restart whose candidates all match serves the one
  chosen without starting the others;
- for the runtime served: production's running estimates (latency, decayed sample weight, age), the
  live batch sizes, and the plan served.

It is written atomically (a temporary file, fsync, rename, fsync of the folder): periodically, on every
plan change and at stop, so a SIGKILL loses at most `SAVE_INTERVAL_S` of production's learning. At start
it is read back when the identity matches: the daemon then serves the saved plan without measuring. A
file whose identity does not match (another model, a library upgrade, fewer cores) or that cannot be read
is set aside, renamed with the time, and the log line says why; it never stops a start, whatever it holds
(each field is read strictly, `state_document`; ages and weights a clock moved are clamped, never grown).
The folder and its file are held to the run dir's rules, and read bounded (`state_files`); a saved plan is
checked against this machine before a worker is forked for it.

The clocks are injected (`Clock`), as the simulation injects its own: a test runs a month of restarts, with
the wall clock stepped back and forward, in a second.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import math
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from packrat_daemon.adapt.production import MAX_AGE_S
from packrat_daemon.config import ServeConfig
from packrat_daemon.ops.state_document import (
    Choice,
    Entry,
    Resumed,
    plan_from_json,
    resumed_from_json,
)
from packrat_daemon.ops.state_files import (
    MAX_STATE_BYTES,
    StateError,
    check_folder,
    load_json,
    read_bounded,
    set_aside,
    write_atomically,
)
from packrat_daemon.ops.state_identity import content_sha256, identity, mismatch
from packrat_daemon.wire.errors import ConfigError, PackratError
from policies.base import Plan
from policies.planning.profile import Profile
from policies.planning.topology import Topology

if TYPE_CHECKING:
    from packrat_daemon.adapt.online import OnlineAdaptation

# Re-exported: what the daemon, the benches and the tests import from here.
__all__ = ["STATE_FILE", "Choice", "Clock", "Entry", "StateKeeper", "identity", "mismatch", "plan_from_json",
           "state_folder"]  # fmt: skip

log = logging.getLogger("packrat.daemon")

STATE_FILE = "learned-profile.json"
# 2: the identity holds the input declared and the CPU set, and production's estimates their weight as of the
# save; a format-1 file (keyed without them) is set aside rather than served to another input or CPUs.
FORMAT = 2
NO_STATE = "none"  # --state-dir none: keep nothing
APP = "packrat"
SAVE_INTERVAL_S = 60.0  # production's learning a SIGKILL may lose, against a write (and fsync) per interval


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


@dataclass(frozen=True)
class Clock:
    """The two clocks the state reads: `monotonic` (production's estimates are aged on it, as the daemon's loop
    times them) and `wall` (the time of day a file was saved, for the downtime across a restart)."""

    monotonic: Callable[[], float] = time.monotonic
    wall: Callable[[], float] = time.time


class StateKeeper:
    """The state file of one daemon: read at start, written while serving. Without a state folder (`--state-dir
    none`, or a default one that cannot be used) it keeps nothing and writes nothing, so the daemon calls it the
    same way either way. `default`: the folder is the default one (`state_folder`), not one the user gave; one
    that cannot be used is then logged and nothing kept, where a given one stops the start (ConfigError).
    `clock`: the clocks it reads (the system's, but for a simulated run)."""

    def __init__(self, state_dir: str | None, default: bool = False, clock: Clock | None = None) -> None:
        self.clock = clock or Clock()
        self.path = None if state_dir is None else Path(state_dir) / STATE_FILE
        self.entries: dict[str, Entry] = {}
        self.saved: dict[str, Entry] = {}  # entries read from the file, served again when they match
        self.resumed: Resumed | None = None
        self.restored_from: str | None = None  # the file a plan was restored from
        self.served_key: str | None = None
        self.last_saved = -math.inf  # the first tick writes: a SIGKILL right after start keeps the start-up profile
        self._digest = functools.cache(content_sha256)  # the model is hashed once, not once per runtime candidate
        self.saved_choice: Choice | None = None  # the file's choice between the candidates
        self.choice: Choice | None = None  # this start's (or the file's, when served from it)
        self.choice_restored = False  # the choice is the file's: the other candidates were not started
        self.not_reused: str | None = None  # why the file's choice was not served again (`warm_choice`)
        self.set_aside_why: str | None = None  # why the file was set aside at this start, if it was
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
                was = data.get("format") if isinstance(data, dict) else None
                said = f"a format-{was} state file" if isinstance(was, int) else "no state file"
                raise StateError(f"it is {said}, where this daemon reads format {FORMAT}")
            entries = data.get("entries")
            if not isinstance(entries, dict):
                raise StateError("its entries are not an object")
            self.saved = {str(key): Entry.from_json(entry) for key, entry in entries.items()}
            choice = data.get("choice")
            self.saved_choice = None if choice is None else Choice.from_json(choice)
            served = data.get("served")
            if served is not None:
                self.resumed = resumed_from_json(served, data.get("saved_unix"))
        except StateError as exc:
            self.saved, self.resumed, self.saved_choice = {}, None, None
            self.set_aside(str(exc))
            return
        # Beyond the typed reading (StateError), what the model's own readers raise (a verdict's, a profile's).
        except (ValueError, KeyError, TypeError, IndexError, AttributeError, ArithmeticError) as exc:
            self.saved, self.resumed, self.saved_choice = {}, None, None
            self.set_aside(f"it cannot be read ({type(exc).__name__}: {exc})")
            return
        except PackratError as exc:  # a bad cell (ProfileError): still never a reason not to start
            self.saved, self.resumed, self.saved_choice = {}, None, None
            self.set_aside(f"it holds an unusable profile ({exc})")

    def identity(self, config: ServeConfig, runtime: str, precision: str, topology: Topology) -> dict[str, Any]:
        """`identity` for this start; empty without --state-dir (nothing is kept to match, no file is hashed)."""
        return {} if self.path is None else identity(config, runtime, precision, topology, self._digest)

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
        why = self._not_warm(identities, settings)
        if why is not None:
            self.not_reused = why
            if self.saved_choice is not None:
                log.info("state: %s; choosing again", why)
            return None
        assert self.saved_choice is not None
        self.choice, self.choice_restored = self.saved_choice, True
        return self.saved_choice.served

    def _not_warm(self, identities: dict[str, dict[str, Any]], settings: dict[str, Any]) -> str | None:
        """Why the file's choice cannot be served again (`warm_choice`), in words for the log and the status."""
        saved = self.saved_choice
        if self.path is None:
            return "nothing is kept across starts (--state-dir none, or a state folder that cannot be used)"
        if saved is None:
            return self.set_aside_why or f"no choice was kept in {self.path} yet (this is its first start there)"
        if saved.settings != settings:
            changed = ", ".join(f"{k} {saved.settings.get(k)!r} → {v!r}" for k, v in settings.items()
                                if saved.settings.get(k) != v)  # fmt: skip
            return f"the kept choice was made for other settings ({changed})"
        if sorted(saved.identities) != sorted(identities):
            return (f"the candidates changed ({', '.join(sorted(saved.identities))} at the kept choice, "
                    f"{', '.join(sorted(identities))} now)")  # fmt: skip
        for key, current in identities.items():
            why = mismatch(saved.identities[key], current)
            if why is not None:
                return f"the kept choice was made for another setting ({key}: {why})"
        served, resumed = saved.served, self.resumed
        if served is None or served not in self.saved:
            return "the kept choice has no profile of the candidate it served"
        if resumed is None or resumed.key != served:
            return "the daemon that made the kept choice stopped before it saved its plan"
        return None

    def set_aside(self, why: str) -> None:
        """Rename the file out of the way (kept for a look), and say why."""
        assert self.path is not None
        self.set_aside_why = f"the state file was set aside: {why}"
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
            # Clamped: a wall clock stepped back is no downtime; one stepped years ahead ages by at most MAX_AGE_S.
            downtime = min(max(0.0, self.clock.wall() - resumed.saved_unix), MAX_AGE_S)
            adaptation.production.restore(resumed.production, self.clock.monotonic(), downtime)
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
        now = self.clock.monotonic()
        self.last_saved = now
        if serving.profile is not None and self.served_key in self.entries:
            self.entries[self.served_key].profile = serving.profile
        live = serving.adaptation.estimator.distribution(now)
        document = {
            "format": FORMAT,
            "saved_unix": self.clock.wall(),
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
            "decided_age_s": round(self._age(choice.decided_unix), 1),
            "candidates": [verdict.to_json() for verdict in choice.verdicts],
            "kept_choice_not_reused": None if self.choice_restored else self.not_reused,
        }

    def provenance(self, serving: Serving, now: float | None = None) -> dict[str, Any]:
        """Where the served profile's cells come from, for `packrat status`: measured at start (and when),
        estimated by the start-up search (never served on), and learned in production (with their ages)."""
        now = self.clock.monotonic() if now is None else now
        entry = self.entries.get(self.served_key or "")
        learned = serving.adaptation.production.export(now)
        counted = serving.adaptation.production.learned(now)
        return {
            "measured_offline": 0 if serving.profile is None else len(serving.profile),
            "offline_age_s": None if entry is None else round(self._age(entry.measured_unix), 1),
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
            "measured_while": None if entry is None else entry.measured_while,
            "contention": None
            if entry is None or entry.contention is None
            else {
                **entry.contention.to_json(),
                "contended": entry.contention.contended,
                "describe": entry.contention.describe(),
            },  # fmt: skip
            "restored_from": self.restored_from,
            "state_file": None if self.path is None else str(self.path),
            "saved_age_s": None if self.path is None or self.last_saved < 0 else round(now - self.last_saved, 1),
        }

    def _age(self, unix: float) -> float:
        """Seconds since `unix` on the wall clock, for `packrat status`: 0 for a time ahead of it (a clock
        stepped back since)."""
        return max(0.0, self.clock.wall() - unix)
