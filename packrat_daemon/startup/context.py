"""What start-up's steps share: one context (`StartContext`), the candidate being prepared (`Loaded`, then
`RuntimeCandidate`), and the planning inputs a configuration gives (`policy_for`, `distribution_for`, and a
profile file's rows for one runtime, `read_profile`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import zmq

from packrat_daemon.config import ServeConfig
from packrat_daemon.fleet.backend import Backend, ModelInfo
from packrat_daemon.measure import emulation
from packrat_daemon.measure.profiling import ProfileFile
from packrat_daemon.ops.metrics import Metrics
from packrat_daemon.ops.state import Entry, StateKeeper
from policies.base import Plan, Policy, PolicySettings
from policies.planning.distribution import BatchDistribution
from policies.planning.profile import Profile, profile_key
from policies.planning.topology import Topology
from policies.registry import policy_from_settings
from workers.models.spec import EMULATED

Interrupted = Callable[[], bool]  # True once a stop signal has arrived


@dataclass(frozen=True)
class StartContext:
    """What every step of start-up works with, known once the machine, the policy and the state file are: the
    background measurement runs on a copy with a state recorder and a stop of its own (`Measuring`), the first
    answer on one with a policy that needs no profile."""

    config: ServeConfig
    context: zmq.Context
    topology: Topology
    policy: Policy
    profiles: ProfileFile
    state: StateKeeper
    interrupted: Interrupted
    metrics: Metrics | None = None  # None: nothing to report the guard and the served candidate to (tests)


@dataclass(frozen=True)
class RuntimeCandidate:
    """One (runtime, precision)'s template, ready to fork workers, with its profile and the policy's plan on it."""

    backend: Backend
    info: ModelInfo
    profile: Profile | None
    plan: Plan
    restored: bool = False  # the plan is the one the state file says was served: no split check

    @property
    def key(self) -> str:
        return profile_key(self.info.runtime, self.info.precision)


@dataclass
class Loaded:
    """One candidate's template, loaded, before its guard and its profile, with what the state file holds for it."""

    key: str
    precision: str
    backend: Backend
    info: ModelInfo
    identity: dict[str, Any]
    saved: Entry | None
    state: StateKeeper
    guarded: dict[str, Any] | None = None  # the guard's result and settings, once it passed


def policy_for(config: ServeConfig) -> Policy:
    return policy_from_settings(config.policy, PolicySettings.from_config(config))


def distribution_for(config: ServeConfig) -> BatchDistribution:
    return BatchDistribution.from_counts({b: 1.0 for b in (config.batches or [config.max_batch])})


def read_profile(path: str, runtime: str, precision: str = "fp32") -> Profile:
    """`runtime`'s rows at `precision` of the profile file; a file that does not say which runtime measured it
    serves this one, and its rows are labelled so (a later --save-profile writes them under that runtime)."""
    if runtime == EMULATED:
        return emulation.emulated_profile(path)  # the latencies the emulated workers wait, whoever measured them
    loaded = Profile.read_csv(path, runtime=runtime, precision=precision)
    if loaded.runtime == runtime and loaded.precision == precision:
        return loaded
    return Profile(dict(loaded.items()), model=loaded.model, runtime=runtime, precision=precision)
