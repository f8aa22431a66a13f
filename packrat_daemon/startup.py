"""Start-up: the policy, a template per runtime, each runtime's profile (read or measured) and plan,
the runtime to serve with, and the split check; also the re-planning a reload (SIGHUP) does.

Everything here runs before the main loop, or (reload) between two of its wakes. A stop signal
during the minutes of measuring is seen through `interrupted` and ends start-up between two
measurements with KeyboardInterrupt.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass

import zmq

from packrat_daemon.backend import Backend, ModelInfo
from packrat_daemon.config import ServeConfig
from packrat_daemon.measure.bench import Bench, PlanTiming, default_grid
from packrat_daemon.measure.split_check import SplitDecision, measured_profile, split_decisions
from packrat_daemon.metrics import Metrics
from packrat_daemon.progress import Progress
from packrat_daemon.runtime_choice import RuntimeOption, choose_runtime
from policies.base import Plan, Policy, PolicySettings
from policies.planning.distribution import BatchDistribution
from policies.planning.layouts import LayoutTable
from policies.planning.profile import Profile, write_profiles
from policies.planning.topology import Topology
from policies.registry import policy_from_settings
from workers.spec import available_runtimes

log = logging.getLogger("packrat.daemon")

Interrupted = Callable[[], bool]  # True once a stop signal has arrived

# What a reload cannot change in a running daemon: these take a restart.
RESTART_ONLY = ("model", "input", "endpoint", "runtime", "allocator", "run_dir")


@dataclass(frozen=True)
class RuntimeCandidate:
    """One runtime's template, ready to fork workers, with its profile and the policy's plan on it."""

    backend: Backend
    info: ModelInfo
    profile: Profile | None
    plan: Plan


class ProfileFile:
    """The --save-profile file: every runtime's rows this daemon knows, one runtime's rows replaced at a time.

    Start-up measurements, the split check and the timings learned in production all save through
    `save`, so writing one runtime's rows never drops another runtime's.
    """

    def __init__(self, path: str | None) -> None:
        self.path = path
        self.known: dict[str, Profile] = {}

    def know(self, profile: Profile) -> None:
        """Rows read from --profile: not written now, but kept in every later write."""
        self.known[profile.runtime] = profile

    def save(self, profile: Profile) -> bool:
        """Write `profile` in place of its runtime's rows; False when no --save-profile was given."""
        self.known[profile.runtime] = profile
        if self.path is None:
            return False
        write_profiles(self.path, list(self.known.values()))
        return True


@dataclass(frozen=True)
class Started:
    """What start-up hands the main loop."""

    topology: Topology
    policy: Policy
    served: RuntimeCandidate
    profiles: ProfileFile


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
    if config.metrics_port:  # first: a port clash should fail before minutes of profiling
        metrics.serve(config.metrics_port, config.metrics_address)
        log.info("metrics on http://%s:%d/metrics", config.metrics_address, config.metrics_port)
    topology = topology or Topology.detect()
    log.info("machine: %s", topology.describe())
    policy = policy_for(config)
    runtimes = available_runtimes() if config.runtime == "auto" else [config.runtime]
    measure = policy.needs_profile or len(runtimes) > 1
    profiles = ProfileFile(config.save_profile)
    candidates: list[RuntimeCandidate] = []
    try:
        for runtime in runtimes:
            candidates.append(
                prepare_runtime(runtime, config, topology, context, policy, profiles, measure, interrupted)
            )
        served = _choose(candidates, config)
    except BaseException:
        for candidate in candidates:
            candidate.backend.close()
        raise
    for candidate in candidates:
        if candidate is not served:
            candidate.backend.close()
    if policy.checks_splits and config.split_check_rounds > 0 and served.profile is not None:
        try:
            served = check_splits(served, policy, config, topology, profiles, interrupted)
        except BaseException:
            served.backend.close()
            raise
    return Started(topology, policy, served, profiles)


def prepare_runtime(
    runtime: str,
    config: ServeConfig,
    topology: Topology,
    context: zmq.Context,
    policy: Policy,
    profiles: ProfileFile,
    measure: bool,
    interrupted: Interrupted,
) -> RuntimeCandidate:
    """Start a template for `runtime`, get its profile (file or measured) and the policy's plan."""
    run_dir = None if config.run_dir is None else os.path.join(config.run_dir, runtime)
    backend = Backend(context, run_dir)
    try:
        log.info("loading %s in the %s template process", config.model, runtime)
        backend.start_template(config.model, input_override=config.input, runtime=runtime, allocator=config.allocator)
        info = backend.wait_template(config.startup_timeout_s)
        log.info("model %s: input %s %s per sample", config.model, info.dtype, list(info.shape))
        if config.profile:
            profile: Profile | None = read_profile(config.profile, info.runtime)
            log.info("profile %s: %d cells for %s", config.profile, len(profile), info.runtime)
            profiles.know(profile)
        elif measure:
            profile = measure_profile(backend, info, config, topology, interrupted)
            if profiles.save(profile):
                log.info("profile saved to %s", config.save_profile)
        else:
            profile = None
        plan = policy.plan(profile, topology, distribution_for(config))
    except BaseException:
        backend.close()
        raise
    return RuntimeCandidate(backend, info, profile, plan)


def measure_profile(
    backend: Backend, info: ModelInfo, config: ServeConfig, topology: Topology, interrupted: Interrupted
) -> Profile:
    """Measure every cell of the default grid on real workers forked from `backend`'s template."""
    threads, batches = default_grid(topology.usable_cores, max(config.batches or [config.max_batch]))
    cells = [(t, b) for t in threads for b in batches]
    progress = Progress(len(cells), f"profiling {info.runtime}")
    profiler = Bench(backend, topology, info)
    measured = {}
    try:
        for t, b in cells:
            if interrupted():  # SIGTERM or Ctrl-C during start-up: stop between cells
                raise KeyboardInterrupt
            measured[(t, b)] = profiler.measure_cell(t, b)
            progress.advance(f"t={t} b={b}: {measured[(t, b)].latency_ms:.1f} ms")
    finally:
        profiler.close()
        progress.close()
    return Profile(measured, model=config.model, runtime=info.runtime)


def check_splits(
    served: RuntimeCandidate,
    policy: Policy,
    config: ServeConfig,
    topology: Topology,
    profiles: ProfileFile,
    interrupted: Interrupted,
) -> RuntimeCandidate:
    """Run each batch size the plan would split both ways side by side; plan again on what was measured."""
    assert served.profile is not None
    distribution = distribution_for(config)
    cores = topology.usable_cores
    decisions = split_decisions(served.profile, served.plan, distribution, cores, config.min_split_gain)
    if not decisions:
        return served
    bench = Bench(served.backend, topology, served.info)
    progress = Progress(len(decisions), "checking splits side by side")

    def measured(decision: SplitDecision, split: PlanTiming, alone: PlanTiming) -> None:
        log.info(
            "split check at %s: split %.1f ms, one instance %.1f ms (medians of %d interleaved rounds)",
            decision.describe(), split.latency_ms, alone.latency_ms, split.rounds,
        )  # fmt: skip
        progress.advance(f"batch {decision.batch}: split {split.latency_ms:.1f} ms, alone {alone.latency_ms:.1f} ms")
        if interrupted():  # SIGTERM or Ctrl-C during start-up: stop between checks
            raise KeyboardInterrupt

    try:
        profile = measured_profile(served.profile, decisions, bench.compare, config.split_check_rounds, measured)
    finally:
        bench.close()
        progress.close()
    plan = policy.plan(profile, topology, distribution)
    if plan.layouts != served.plan.layouts:
        log.info("split check changed the plan: %s → %s", served.plan.describe(), plan.describe())
    if profiles.save(profile):
        log.info("profile saved to %s", config.save_profile)
    return dataclasses.replace(served, profile=profile, plan=plan)


@dataclass(frozen=True)
class Replanned:
    """A reload's outcome: the configuration in force from now on and the plan for it."""

    config: ServeConfig
    policy: Policy
    profile: Profile | None
    plan: Plan


def replan(
    running: ServeConfig, fresh: ServeConfig, runtime: str, profile: Profile | None, topology: Topology
) -> Replanned:
    """SIGHUP: `fresh`, less what takes a restart, with the profile re-read and a new plan.

    Raises PackratError when the new configuration cannot be planned; the caller keeps serving.
    """
    for name in RESTART_ONLY:
        if getattr(fresh, name) != getattr(running, name):
            log.warning("reload: %s changed; that takes a restart, the running value stays", name)
            setattr(fresh, name, getattr(running, name))
    if fresh.max_batch > running.max_batch:
        log.warning("reload: max_batch can only shrink without a restart; keeping %d", running.max_batch)
        fresh.max_batch = running.max_batch
    policy = policy_for(fresh)
    if fresh.profile:
        profile = read_profile(fresh.profile, runtime)
    return Replanned(fresh, policy, profile, policy.plan(profile, topology, distribution_for(fresh)))


def read_profile(path: str, runtime: str) -> Profile:
    """`runtime`'s rows of the profile file; a file that does not say which runtime measured it serves
    this one, and its rows are labelled so (a later --save-profile writes them under that runtime)."""
    loaded = Profile.read_csv(path, runtime=runtime)
    return loaded if loaded.runtime == runtime else Profile(dict(loaded.items()), model=loaded.model, runtime=runtime)


def policy_for(config: ServeConfig) -> Policy:
    return policy_from_settings(config.policy, PolicySettings(config.plan, config.min_split_gain))


def distribution_for(config: ServeConfig) -> BatchDistribution:
    return BatchDistribution.from_counts({b: 1.0 for b in (config.batches or [config.max_batch])})


def _choose(candidates: list[RuntimeCandidate], config: ServeConfig) -> RuntimeCandidate:
    """--runtime auto: the runtime whose plan predicts the lowest latency (see runtime_choice)."""
    choice = choose_runtime([_runtime_option(candidate, config) for candidate in candidates])
    served = next(c for c in candidates if c.info.runtime == choice.runtime)
    if len(candidates) > 1:
        log.info("runtime auto: chose %s (%s)", served.info.runtime, choice.reason)
    return served


def _runtime_option(candidate: RuntimeCandidate, config: ServeConfig) -> RuntimeOption:
    plan, profile = candidate.plan, candidate.profile
    batch_ms: dict[int, float | None] = {}
    if profile is not None and not plan.oversubscribed and plan.split == "exact":
        batch_ms = LayoutTable(profile, plan.layout_threads, distribution_for(config)).batch_latencies()
    return RuntimeOption(candidate.info.runtime, _predicted(plan, profile), batch_ms)


def _predicted(plan: Plan, profile: Profile | None) -> float:
    """A plan's predicted latency, for choosing between runtimes (unknown sorts last)."""
    if plan.predicted_latency_ms is not None:
        return plan.predicted_latency_ms
    if profile is not None and not plan.oversubscribed:
        lhats = [profile.lhat(i.threads, max(i.batch, 1)) for i in plan.instances]
        if None not in lhats:
            return max(x for x in lhats if x is not None)
    return float("inf")
