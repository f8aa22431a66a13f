"""`start_up`, in order: the checks that fail in a second (`checks`), the machine and the policy, the candidates
(narrowed to the state file's choice on a restart), then either the first answer while `Measuring` measures
every candidate in the background, or every candidate prepared (`candidates`), the choice and its split check
(`choice`) before serving."""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass
from typing import Any

import zmq

from packrat_daemon.config import ServeConfig
from packrat_daemon.measure.profiling import ProfileFile
from packrat_daemon.measure.runtime_choice import ms_text, verdicts
from packrat_daemon.ops.metrics import Metrics
from packrat_daemon.ops.state import Choice, StateKeeper, state_folder
from packrat_daemon.ops.tallies import profile_noise
from packrat_daemon.startup.candidates import prepare_candidates, prepare_runtime
from packrat_daemon.startup.checks import (
    candidate_pairs,
    check_cores,
    check_serving,
    first_answer,
    machine,
    profiled_pairs,
)
from packrat_daemon.startup.choice import choice_settings, predictions, settle
from packrat_daemon.startup.context import Interrupted, RuntimeCandidate, StartContext, policy_for
from packrat_daemon.startup.measuring import Measuring
from policies.base import Policy, PolicySettings
from policies.planning.profile import profile_key
from policies.planning.topology import Topology
from policies.registry import policy_from_settings

log = logging.getLogger("packrat.daemon")


@dataclass(frozen=True)
class Started:
    """What start-up hands the main loop."""

    topology: Topology
    policy: Policy
    served: RuntimeCandidate
    profiles: ProfileFile
    state: StateKeeper
    measuring: Measuring | None = None  # the candidates measured in the background while `served` answers


def start_up(
    config: ServeConfig,
    context: zmq.Context,
    metrics: Metrics,
    interrupted: Interrupted,
    topology: Topology | None = None,
) -> Started:
    """Open the metrics endpoint, prepare every candidate runtime, serve the one predicted fastest, check
    its splits. Whatever it started is closed again if it fails or is interrupted (the metrics endpoint
    is the caller's to close).
    """
    check_serving(config, context, metrics)  # keys, binds, the run dir and the metrics port: before any profiling
    topology = machine(config, topology)
    policy = policy_for(config)
    check_cores(config, policy, topology)  # before the model loads: a plan or profile beyond the cores fails now
    pairs = candidate_pairs(config.runtime, config.precision, model=config.model)
    if config.profile and not config.emulate_measure:
        pairs = profiled_pairs(config.profile, pairs)
    measure = policy.needs_profile or len(pairs) > 1
    profiles = ProfileFile(config.save_profile)
    ctx = StartContext(config, context, topology, policy, profiles, _state_keeper(config), interrupted, metrics)
    identities = {profile_key(r, p): ctx.state.identity(config, r, p, topology) for r, p in pairs}
    warm = _warm_choice(ctx, pairs, identities)
    if warm is not None:
        pairs = [pair for pair in pairs if profile_key(*pair) == warm]
    first = first_answer(config, pairs, warm)
    if first is not None:
        return _answer_first(ctx, metrics, first, pairs, identities)
    served = _prepare_and_choose(ctx, pairs, identities, measure)
    guard = "not needed" if served.info.guard is None else "passed"
    metrics.served(served.info.runtime, served.info.precision, guard)
    measured_profile(metrics, ctx.state, served)
    _log_verdicts(ctx.state)
    log.info("serving %s at %s (accuracy guard: %s)", served.info.runtime, served.info.precision, guard)
    return Started(topology, policy, served, profiles, ctx.state)


def measured_profile(metrics: Metrics, state: StateKeeper, served: RuntimeCandidate) -> None:
    """The metrics' account of the served profile's measurement: how crowded its cores were, and its noise."""
    entry = state.entries.get(served.key)
    crowding = None if entry is None else entry.contention
    metrics.profile_measured(None if crowding is None else crowding.on_cpu, profile_noise(served.profile))


def _state_keeper(config: ServeConfig) -> StateKeeper:
    """The state file of this model and policy: in --state-dir, or the default folder."""
    folder = state_folder(config.state_dir, config.model, config.policy)
    state = StateKeeper(folder, default=config.state_dir is None)
    if state.path is not None and config.state_dir is None:
        log.info("state: kept in %s (--state-dir DIR elsewhere, --state-dir none for nowhere)", folder)
    return state


def _warm_choice(ctx: StartContext, pairs: list[tuple[str, str]], identities: dict[str, dict[str, Any]]) -> str | None:
    """The candidate the state file chose among these same candidates, under the same settings: a restart starts
    it alone. None on a first start, a single candidate, or a --profile given."""
    config, state = ctx.config, ctx.state
    if len(pairs) <= 1 or config.profile:
        return None
    warm = state.warm_choice(identities, choice_settings(config))
    if warm is not None and state.choice is not None:
        age = (time.time() - state.choice.decided_unix) / 3600
        log.info("state: serving %s, chosen among %s %.1f h ago; the other candidates are not started again",
                 warm, ", ".join(identities), age)  # fmt: skip
    return warm


def _prepare_and_choose(
    ctx: StartContext, pairs: list[tuple[str, str]], identities: dict[str, dict[str, Any]], measure: bool
) -> RuntimeCandidate:
    """Every candidate prepared, the one to serve chosen (its splits checked) and the choice recorded in the state
    file; the other candidates' templates closed."""
    refused: dict[str, str] = {}
    screened: dict[str, str] = {}
    candidates = prepare_candidates(ctx, pairs, measure, refused, screened)
    state = ctx.state
    try:
        # The split check runs before the other candidates' templates stop: it may make another one fastest.
        served, reason = settle(ctx, candidates)
        if not state.choice_restored:
            found = verdicts(served.key, reason, predictions(candidates), refused, screened)
            state.choice = Choice(found, identities, choice_settings(ctx.config))
    except BaseException:
        for candidate in candidates:
            candidate.backend.close()
        raise
    for candidate in candidates:
        if candidate is not served:
            candidate.backend.close()
    return served


def _log_verdicts(state: StateKeeper) -> None:
    assert state.choice is not None
    when = "at this start" if not state.choice_restored else "at an earlier start (the state file)"
    for verdict in state.choice.verdicts:
        expected = "" if verdict.predicted_ms is None else f" (predicted {ms_text(verdict.predicted_ms)} ms)"
        log.info("candidate %s: %s%s %s: %s", verdict.candidate, verdict.verdict, expected, when, verdict.why)


def _answer_first(
    ctx: StartContext,
    metrics: Metrics,
    first: tuple[str, str],
    pairs: list[tuple[str, str]],
    identities: dict[str, dict[str, Any]],
) -> Started:
    """Start-up's early answer: `first` prepared alone, on a plan that needs no profile (the policy's own when it
    plans without one, else `single`'s), and every candidate left to `Measuring`."""
    config, policy = ctx.config, ctx.policy
    settings = PolicySettings.from_config(config)
    fixed = policy if not policy.needs_profile else policy_from_settings("single", settings)
    served = prepare_runtime(dataclasses.replace(ctx, policy=fixed), first[0], first[1])
    assert served is not None  # fp32 has no guard to refuse it
    ctx.state.served_key = served.key
    measuring = Measuring(pairs, served.key, identities, ctx)
    metrics.served(served.info.runtime, served.info.precision, "not needed")
    log.info("serving %s first, on %s (no profile needed); still measuring %s in the background, at a lower "
             "priority, to switch to the fastest", served.key, served.plan.describe(),
             ", ".join(measuring.remaining))  # fmt: skip
    return Started(ctx.topology, policy, served, ctx.profiles, ctx.state, measuring)
