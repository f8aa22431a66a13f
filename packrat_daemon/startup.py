"""Start-up: the policy, a template per (runtime, precision) candidate, the accuracy guard for each reduced
precision, each candidate's profile (read or measured) and plan, the candidate to serve with, and the split
check; also the re-planning a reload (SIGHUP) does.

What a start measures is kept in the state folder (`ops.state`: `--state-dir`, or the default one): each
candidate's cells, the guard, and each candidate's verdict. A restart whose candidates all match what the file
was decided for starts only the one chosen, on its saved profile and plan, with no guard run and no profiling.

A first start with several candidates answers early (`--first-answer auto`): the first candidate (fp32, which
needs no conversion) is prepared alone and served on a plan that needs no profile, and `Measuring` prepares and
measures every candidate (the served one's runtime included, on a template of its own) in a thread of its own,
at a lower priority, while the main loop serves. Its outcome is handed to the main loop, which switches (the
reconciler's generation on the chosen candidate's template, no request failed).

Everything else here runs before the main loop, or (reload) between two of its wakes. A stop signal
during the minutes of measuring is seen through `interrupted` and ends start-up between two
measurements with KeyboardInterrupt.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import zmq

from packrat_daemon import reload
from packrat_daemon.config import ServeConfig
from packrat_daemon.fleet.backend import Backend, ModelInfo
from packrat_daemon.measure import accuracy, emulation
from packrat_daemon.measure.bench import Bench
from packrat_daemon.measure.profiling import ProfileFile, check_splits, measure_profile
from packrat_daemon.measure.runtime_choice import (
    MEASURING,
    SCREEN_MARGIN,
    RuntimeOption,
    choose_checked,
    choose_runtime,
    ms_text,
    screened_slower,
    verdicts,
)
from packrat_daemon.ops.hardening import check_endpoint, private_dir, raise_fd_limit, warn_if_root
from packrat_daemon.ops.metrics import Metrics
from packrat_daemon.ops.state import Choice, Entry, StateKeeper, state_folder
from packrat_daemon.wire.curve import FrontendSecurity
from packrat_daemon.wire.errors import ConfigError, ProfileError
from policies.base import Plan, Policy, PolicySettings
from policies.planning.distribution import BatchDistribution
from policies.planning.layouts import LayoutTable
from policies.planning.profile import Profile, profile_key
from policies.planning.topology import Topology
from policies.registry import policy_from_settings
from workers.models.calibration import template_precision
from workers.models.precision import cpu_units
from workers.models.spec import (
    EMULATED,
    PRECISIONS,
    available_runtimes,
    check_model_runtime,
    check_precision,
    model_runtimes,
    runtime_precisions,
)

log = logging.getLogger("packrat.daemon")

Interrupted = Callable[[], bool]  # True once a stop signal has arrived


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
    # First, like the metrics port below: keys, a public bind and the run dir should fail before minutes of profiling.
    FrontendSecurity.check(config.endpoint, config.server_key, config.allowed_clients, config.insecure_public)
    check_endpoint(context, config.endpoint)
    if config.run_dir is not None:
        private_dir(config.run_dir)
    warn_if_root()
    raise_fd_limit()  # before any client connects or a template inherits the limit
    if config.metrics_port:  # first: a port clash should fail before minutes of profiling
        metrics.serve(config.metrics_port, config.metrics_address)
        log.info("metrics on http://%s:%d/metrics", config.metrics_address, config.metrics_port)
    emulating = emulation.check(config)  # the emulate settings only with --runtime emulated, which needs a profile
    topology = (topology or emulation.topology(config)).share(config.cpus)  # --cpus: this model's share
    log.info("machine: %s", topology.describe())
    if emulating:
        log.warning("%s", emulation.describe(config, topology.usable_cores)["note"])
    policy = policy_for(config)
    check_cores(config, policy, topology)  # before the model loads: a plan or profile beyond the cores fails now
    pairs = candidate_pairs(config.runtime, config.precision, model=config.model)
    if config.profile and not config.emulate_measure:
        pairs = profiled_pairs(config.profile, pairs)
    measure = policy.needs_profile or len(pairs) > 1
    profiles = ProfileFile(config.save_profile)
    folder = state_folder(config.state_dir, config.model, config.policy)
    state = StateKeeper(folder, default=config.state_dir is None)
    if state.path is not None and config.state_dir is None:
        log.info("state: kept in %s (--state-dir DIR elsewhere, --state-dir none for nowhere)", folder)
    identities = {profile_key(r, p): state.identity(config, r, p, topology) for r, p in pairs}
    settings = choice_settings(config)
    warm = state.warm_choice(identities, settings) if len(pairs) > 1 and not config.profile else None
    if warm is not None and state.choice is not None:
        age = (time.time() - state.choice.decided_unix) / 3600
        log.info("state: serving %s, chosen among %s %.1f h ago; the other candidates are not started again",
                 warm, ", ".join(identities), age)  # fmt: skip
        pairs = [pair for pair in pairs if profile_key(*pair) == warm]
    refused: dict[str, str] = {}
    first = first_answer(config, pairs, warm)
    if first is not None:
        return _answer_first(first, pairs, identities, config, topology, context, policy, profiles, interrupted,
                             metrics, state)  # fmt: skip
    screened: dict[str, str] = {}
    candidates = prepare_candidates(pairs, config, topology, context, policy, profiles, measure, interrupted,
                                    metrics, state, refused, screened)  # fmt: skip
    try:
        # The split check runs before the other candidates' templates stop: it may make another one fastest.
        served, reason = _settle(candidates, config, policy, topology, profiles, state, interrupted)
        if not state.choice_restored:
            predicted = {candidate.key: _predicted(candidate.plan, candidate.profile) for candidate in candidates}
            state.choice = Choice(verdicts(served.key, reason, predicted, refused, screened), identities, settings)
    except BaseException:
        for candidate in candidates:
            candidate.backend.close()
        raise
    for candidate in candidates:
        if candidate is not served:
            candidate.backend.close()
    guard = "not needed" if served.info.guard is None else "passed"
    metrics.served(served.info.runtime, served.info.precision, guard)
    assert state.choice is not None
    when = "at this start" if not state.choice_restored else "at an earlier start (the state file)"
    for verdict in state.choice.verdicts:
        expected = "" if verdict.predicted_ms is None else f" (predicted {ms_text(verdict.predicted_ms)} ms)"
        log.info("candidate %s: %s%s %s: %s", verdict.candidate, verdict.verdict, expected, when, verdict.why)
    log.info("serving %s at %s (accuracy guard: %s)", served.info.runtime, served.info.precision, guard)
    return Started(topology, policy, served, profiles, state)


def first_answer(config: ServeConfig, pairs: list[tuple[str, str]], warm: str | None) -> tuple[str, str] | None:
    """The (runtime, fp32) to answer with while the candidates are measured in the background, or None: measure
    first (`--first-answer off`, a single candidate, a choice kept in the state file, or a --profile given)."""
    setting = config.first_answer
    if setting == "off" or warm is not None or config.profile:
        return None
    if setting == "auto":
        return pairs[0] if len(pairs) > 1 and pairs[0][1] == "fp32" else None
    if setting not in available_runtimes():
        raise ConfigError(
            f"--first-answer {setting}: not an installed runtime ({', '.join(available_runtimes())}); give one of "
            "them, auto (the first candidate) or off (measure every candidate before answering)"
        )
    check_model_runtime(config.model, setting)  # a runtime that cannot load this model: refused now
    return (setting, "fp32")


def _answer_first(
    first: tuple[str, str], pairs: list[tuple[str, str]], identities: dict[str, dict[str, Any]], config: ServeConfig,
    topology: Topology, context: zmq.Context, policy: Policy, profiles: ProfileFile, interrupted: Interrupted,
    metrics: Metrics, state: StateKeeper,
) -> Started:  # fmt: skip
    """Start-up's early answer: `first` prepared alone, on a plan that needs no profile (the policy's own when it
    plans without one, else `single`'s), and every candidate left to `Measuring`."""
    settings = PolicySettings(config.plan, config.min_split_gain, config.max_batch)
    fixed = policy if not policy.needs_profile else policy_from_settings("single", settings)
    served = prepare_runtime(first[0], config, topology, context, fixed, profiles, False, interrupted, first[1],
                             metrics, state)  # fmt: skip
    assert served is not None  # fp32 has no guard to refuse it
    state.served_key = served.key
    measuring = Measuring(pairs, served.key, identities, config, topology, context, policy, profiles, state, metrics)
    metrics.served(served.info.runtime, served.info.precision, "not needed")
    log.info("serving %s first, on %s (no profile needed); still measuring %s in the background, at a lower "
             "priority, to switch to the fastest", served.key, served.plan.describe(),
             ", ".join(measuring.remaining))  # fmt: skip
    return Started(topology, policy, served, profiles, state, measuring)


# The background measurement's templates (and the workers they fork, which inherit it) run at this niceness: the
# serving workers come first, by a little. Its weight is not its share: a multi-threaded step waits for its slowest
# thread, so under traffic that keeps every core busy nice 5 (a third of nice 0's weight) measured many times
# slower than alone, and a large model's first start reached its best candidate only after many minutes, serving
# the slow first answer meanwhile. Every candidate is measured so, the served runtime included, so that their
# profiles are compared under the same conditions.
MEASURE_NICE = 1


@dataclass(frozen=True)
class Measured:
    """The background measurement's outcome: the candidate to serve from now on and the choice made."""

    candidate: RuntimeCandidate  # its template ready at the daemon's priority (the served one's: `same_template`)
    same_template: bool  # the runtime answering now won: only its plan changes, on the template already serving
    choice: Choice
    entries: dict[str, Entry]  # what was measured, for the state file
    reason: str


class Measuring:
    """Every candidate prepared and measured in a thread of its own while the first answer serves.

    The thread owns every socket and template it starts (none is the main loop's); its one outcome, `Measured` or
    the error it ended with, is taken by the main loop (`take`), which alone switches the pool. Each candidate is
    measured on its own template at MEASURE_NICE, the runtime serving now included (on a second template of it),
    so that no profile is taken on a quieter machine than another. The winner, unless it is the runtime serving
    now, is started afresh at the daemon's priority (its profile and guard taken from what was just measured)."""

    def __init__(
        self, pairs: list[tuple[str, str]], served_key: str, identities: dict[str, dict[str, Any]],
        config: ServeConfig, topology: Topology, context: zmq.Context, policy: Policy, profiles: ProfileFile,
        state: StateKeeper, metrics: Metrics,
    ) -> None:  # fmt: skip
        self.pairs, self.served_key, self.identities = pairs, served_key, identities
        self.config, self.topology, self.context, self.policy = config, topology, context, policy
        self.profiles, self.metrics = profiles, metrics
        # The state file as the thread sees it: the saved entries to read, its own to record (handed over after).
        self.recorder = copy.copy(state)
        self.recorder.entries = {}
        self.remaining = [profile_key(*pair) for pair in pairs]  # read by `status` on the main thread
        self.done = False
        self._stop = threading.Event()
        self._finished = threading.Event()  # the outcome is there to take
        self._outcome: Measured | BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="packrat-measuring", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def take(self) -> Measured | None:
        """The outcome, once, when the thread has ended: None while it measures (or after). An error it ended with
        is logged and None returned: the first answer serves on."""
        if self.done or not self._finished.is_set() or self._outcome is None:
            return None
        self.done = True
        outcome, self._outcome = self._outcome, None
        if isinstance(outcome, BaseException):
            log.error("measuring the candidates failed, so %s serves on as it is: %s", self.served_key, outcome)
            return None
        return outcome

    def status(self) -> dict[str, Any]:
        """What `packrat status` says while measuring: what serves, and the candidates still being measured."""
        remaining = list(self.remaining)
        why = f"being measured in the background while {self.served_key} answers"
        candidates = [{"candidate": key, "verdict": MEASURING, "predicted_ms": None, "why": why} for key in remaining]
        # Every candidate measured, the choice not yet taken: its split check, or the winner's template starting.
        return {"served": self.served_key, "decided_at_this_start": True, "decided_age_s": 0.0,
                "candidates": candidates, "still_measuring": remaining, "switching": not remaining}  # fmt: skip

    def close(self) -> None:
        """Stop measuring (between two measurements), close what the thread started and nobody took, and let the
        thread end: after the pool has stopped its templates (one may be the thread's: see `_run`)."""
        self._stop.set()
        if self._thread.ident is not None:  # never started when the daemon failed before serving
            self._thread.join(timeout=60)
        outcome, self._outcome = self._outcome, None
        if isinstance(outcome, Measured) and not outcome.same_template:
            outcome.candidate.backend.close()

    def _run(self) -> None:
        try:
            self._outcome = self._measure()
        except KeyboardInterrupt:
            log.info("measuring the candidates stopped")
        except BaseException as exc:  # noqa: BLE001 - handed to the main loop, which serves on (take)
            self._outcome = exc
        finally:
            self.remaining = []
            self._finished.set()
        # A template dies with the thread that started it (its PR_SET_PDEATHSIG fires on the parent thread's exit,
        # not the process's), and the chosen candidate's was started here: this thread lives until the daemon closes.
        self._stop.wait()

    def _measure(self) -> Measured:
        config, state, stop = self.config, self.recorder, self._stop.is_set
        refused: dict[str, str] = {}
        screened: dict[str, str] = {}

        def decided(key: str) -> None:
            self.remaining = [each for each in self.remaining if each != key]

        candidates = prepare_candidates(
            self.pairs, config, self.topology, self.context, self.policy, self.profiles, True, stop, self.metrics,
            state, refused, screened, MEASURE_NICE, decided,
        )  # fmt: skip
        try:
            served, reason = _settle(candidates, config, self.policy, self.topology, self.profiles, state, stop)
        finally:
            for candidate in candidates:
                candidate.backend.close()
        predicted = {candidate.key: _predicted(candidate.plan, candidate.profile) for candidate in candidates}
        choice = Choice(verdicts(served.key, reason, predicted, refused, screened), self.identities,
                        choice_settings(config))  # fmt: skip
        for verdict in choice.verdicts:
            expected = "" if verdict.predicted_ms is None else f" (predicted {ms_text(verdict.predicted_ms)} ms)"
            log.info("candidate %s: %s%s, measured while %s served: %s", verdict.candidate, verdict.verdict,
                     expected, self.served_key, verdict.why)  # fmt: skip
        if served.key == self.served_key:
            return Measured(served, True, choice, state.entries, reason)
        # Started afresh at the daemon's priority, on what was just measured: nothing is measured or guarded again.
        state.saved = {**state.saved, **state.entries}
        runtime, _, precision = served.key.partition("/")
        fresh = prepare_runtime(
            runtime, config, self.topology, self.context, self.policy, self.profiles, False, stop,
            precision or "fp32", self.metrics, state,
        )  # fmt: skip
        assert fresh is not None  # its guard passed moments ago, under the same settings
        fresh = dataclasses.replace(fresh, profile=served.profile, plan=served.plan)  # as the split check left them
        return Measured(fresh, False, choice, state.entries, reason)


def _settle(
    candidates: list[RuntimeCandidate], config: ServeConfig, policy: Policy, topology: Topology,
    profiles: ProfileFile, state: StateKeeper, interrupted: Interrupted,
) -> tuple[RuntimeCandidate, str]:  # fmt: skip
    """The candidate to serve and why: chosen, resumed from the state file, its splits checked, and chosen again
    while the check made another candidate fastest (runtime_choice.choose_checked)."""
    at = {candidate.key: k for k, candidate in enumerate(candidates)}
    distribution = distribution_for(config)
    chosen: list[str] = []
    reasons: list[str] = []

    resumed: set[str] = set()

    def choose() -> str:
        picked, reason = _choose(candidates, config, chosen[-1] if chosen else None)
        reasons.append(reason)
        served = picked if picked.key in resumed else resume(picked, state, policy, config, topology)
        state.served_key = served.key  # each time: the choice may come back to a candidate resumed before
        resumed.add(served.key)
        candidates[at[served.key]] = served
        chosen.append(served.key)
        return served.key

    def check(key: str) -> None:
        served = candidates[at[key]]
        if not policy.checks_splits or config.split_check_rounds <= 0 or served.profile is None or served.restored:
            return
        profile, plan = check_splits(
            served.backend, served.info, served.profile, served.plan, config, topology, distribution,
            lambda p: policy.plan(p, topology, distribution), interrupted,
        )  # fmt: skip
        if profiles.save(profile):
            log.info("profile saved to %s", config.save_profile)
        candidates[at[key]] = dataclasses.replace(served, profile=profile, plan=plan)

    served = candidates[at[choose_checked(choose, check)]]
    return served, reasons[-1]


def choice_settings(config: ServeConfig) -> dict[str, Any]:
    """What the choice between candidates was planned for, besides their identities (ops.state.Choice)."""
    return {"policy": config.policy, "max_batch": config.max_batch, "batches": sorted(config.batches or [])}


def check_cores(config: ServeConfig, policy: Policy, topology: Topology) -> None:
    """What asks for more cores than are usable fails before the model loads (minutes): a plan the policy
    makes without a profile (a fixed plan), and a profile file none of whose rows fits."""
    if not policy.needs_profile:
        policy.plan(None, topology, distribution_for(config))  # raises, naming the cores asked for and usable
    cores = topology.usable_cores
    if config.profile and not config.emulate_measure:
        fitting = [t for p in Profile.read_all(config.profile).values() for t in p.threads() if t <= cores]
        if not fitting:
            raise ProfileError(
                f"every thread count in {config.profile} exceeds the {cores} usable cores; give a profile measured "
                f"with at most {cores} threads, or none (the daemon then measures one here)"
            )


def resume(
    served: RuntimeCandidate, state: StateKeeper, policy: Policy, config: ServeConfig, topology: Topology
) -> RuntimeCandidate:
    """The state file's plan for the served runtime, when it holds one this daemon can serve as it is."""
    state.served_key = served.key
    if not served.restored:
        return served
    plan = state.resumed_plan(served.key, policy.name, topology, config.max_batch)
    if plan is None:
        log.info("state: no saved plan fits this configuration; planning on the saved profile")
        return dataclasses.replace(served, restored=False)
    log.info("state: serving the learned plan %s; no profiling", plan.describe())
    return dataclasses.replace(served, plan=plan)


def profiled_pairs(path: str, pairs: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The candidates a given profile has rows for: a profile measured on one runtime (`packrat profile`'s) serves
    that runtime under `--runtime auto`, where every other candidate would fail for want of its rows. A profile
    that does not say which runtime measured it serves any. ProfileError, saying what to give, when none is left."""
    held = Profile.read_all(path)
    if "" in held:
        return pairs
    kept = [pair for pair in pairs if profile_key(*pair) in held]
    if not kept:
        wanted = ", ".join(profile_key(*pair) for pair in pairs)
        raise ProfileError(
            f"{path} holds profiles of {', '.join(sorted(held))}, none of the candidates ({wanted}); give "
            "--runtime and --precision it was measured with, or a profile measured for one of the candidates"
        )
    if len(kept) < len(pairs):
        log.info(
            "profile %s: candidates %s (the runtimes it has rows for)", path, ", ".join(profile_key(*p) for p in kept)
        )
    return kept


def candidate_pairs(
    runtime: str, precision: str, flags: frozenset[str] | None = None, model: str | None = None
) -> list[tuple[str, str]]:
    """The (runtime, precision) pairs to prepare for `--runtime` and `--precision`, fp32 first. `auto` adds a
    reduced precision only for runtimes that have it, where the CPU flags show its units (`flags`: a test's CPU).
    With `model`, only runtimes that can load it (an ONNX file: not torch); ConfigError when a pinned one cannot."""
    if model is not None:
        check_model_runtime(model, runtime)  # before any template starts: which runtimes can load it
    runtimes = available_runtimes() if runtime == "auto" else [runtime]
    runtimes = runtimes if model is None else model_runtimes(model, runtimes)
    if precision != "auto":
        pairs = [(r, precision) for r in runtimes if precision in runtime_precisions(r)]
        if not pairs:
            check_precision(runtimes[0], precision)  # raises, saying why and what to do
        return pairs
    pairs = [(r, "fp32") for r in runtimes]
    for reduced in PRECISIONS[1:]:
        units = cpu_units(reduced, flags)
        able = [r for r in runtimes if reduced in runtime_precisions(r)]
        if units and able:
            log.info("precision auto: the CPU has %s: %s at %s too", "+".join(units), ", ".join(able), reduced)
            pairs += [(r, reduced) for r in able]
        else:
            why = "the CPU flags show no units for it" if not units else "no runtime here has it"
            log.info("precision auto: %s left out (%s)", reduced, why)
    return pairs


def prepare_runtime(
    runtime: str,
    config: ServeConfig,
    topology: Topology,
    context: zmq.Context,
    policy: Policy,
    profiles: ProfileFile,
    measure: bool,
    interrupted: Interrupted,
    precision: str = "fp32",
    metrics: Metrics | None = None,
    state: StateKeeper | None = None,
    refused: dict[str, str] | None = None,
) -> RuntimeCandidate | None:
    """Start a template for `runtime` at `precision`, run the accuracy guard on a reduced precision (or take the
    state file's, run under the same settings), get the profile (file, state file or measured) and the policy's
    plan. None: `--precision auto` and the guard refused it (why goes into `refused`, by the candidate's label)."""
    loaded = _load(runtime, precision, config, topology, context, state or StateKeeper(None), nice=0)
    try:
        if not _guard(loaded, config, metrics, refused):
            loaded.backend.close()
            return None
        return _profile_and_plan(loaded, config, topology, policy, profiles, measure, interrupted)
    except BaseException:
        loaded.backend.close()
        raise


def prepare_candidates(
    pairs: list[tuple[str, str]],
    config: ServeConfig,
    topology: Topology,
    context: zmq.Context,
    policy: Policy,
    profiles: ProfileFile,
    measure: bool,
    interrupted: Interrupted,
    metrics: Metrics | None,
    state: StateKeeper,
    refused: dict[str, str],
    screened: dict[str, str],
    nice: int = 0,
    decided: Callable[[str], None] = lambda key: None,
    margin: float = SCREEN_MARGIN,
) -> list[RuntimeCandidate]:
    """Every (runtime, precision) of `pairs` prepared as `prepare_runtime` does, with one saving when several are
    measured: each candidate without a saved profile is first timed at one cell (every core, the largest batch:
    `screen_cell`), and one screened more than `margin` slower than the fastest the guard passed is neither
    guarded nor profiled (why goes into `screened`). The guard and the profile then go fastest first.
    `decided(key)` is told each candidate's fate as it is known (`Measuring.status`)."""
    loaded: list[Loaded] = []
    candidates: list[RuntimeCandidate] = []
    try:
        for runtime, precision in pairs:
            if interrupted():
                raise KeyboardInterrupt
            loaded.append(_load(runtime, precision, config, topology, context, state, nice))
        fresh = [each for each in loaded if each.saved is None and not (config.profile and not config.emulate_measure)]
        screening = measure and len(fresh) > 1
        screens = {each.key: screen_cell(each, topology, config, interrupted) for each in fresh} if screening else {}
        order = sorted(loaded, key=lambda each: screens.get(each.key, 0.0))  # the saved first: nothing to time
        fastest: tuple[str, float] | None = None
        for each in order:
            ms = screens.get(each.key)
            why = None if ms is None or fastest is None else screened_slower(ms, fastest[1], fastest[0], margin)
            if why is not None:
                screened[each.key] = why  # said with the verdicts, once the choice is made
            elif _guard(each, config, metrics, refused):
                candidates.append(_profile_and_plan(each, config, topology, policy, profiles, measure, interrupted))
                if ms is not None and fastest is None:
                    fastest = (each.key, ms)
                loaded.remove(each)
            decided(each.key)
    except BaseException:
        for candidate in candidates:
            candidate.backend.close()
        raise
    finally:
        for each in loaded:  # screened out, refused, or left when a failure or a stop came
            each.backend.close()
    return candidates


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


def _load(
    runtime: str, precision: str, config: ServeConfig, topology: Topology, context: zmq.Context, state: StateKeeper,
    nice: int,
) -> Loaded:  # fmt: skip
    key = profile_key(runtime, precision)
    run_dir = None if config.run_dir is None else os.path.join(config.run_dir, key.replace("/", "-"))
    backend = Backend(context, run_dir)
    try:
        log.info("loading %s in the %s template process", config.model, key)
        # An emulated template is handed the latencies its workers wait (a file in its run folder).
        started = (
            # The whole emulated machine's thread counts, not the --cpus share: a coordinator may grow it.
            emulation.template_runtime(config, emulation.topology(config).usable_cores, backend.run_dir)
            if runtime == EMULATED
            else runtime
        )
        backend.start_template(
            config.model, input_override=config.input, runtime=started, allocator=config.allocator,
            precision=template_precision(precision, config.calibration), nice=nice,
        )  # fmt: skip
        info = backend.wait_template(config.startup_timeout_s)
    except BaseException:
        backend.close()
        raise
    log.info("model %s: input %s %s per sample", config.model, info.dtype, list(info.shape))
    ident = state.identity(config, info.runtime, info.precision, topology)
    return Loaded(key, precision, backend, info, ident, state.restore(key, ident), state)


def _guard(loaded: Loaded, config: ServeConfig, metrics: Metrics | None, refused: dict[str, str] | None) -> bool:
    """The accuracy guard on a reduced precision, or the state file's run under the same settings; False: refused
    under `--precision auto` (why in `refused`)."""
    if loaded.precision == "fp32":
        return True
    settings = loaded.state.guard_settings(config)
    saved = loaded.saved
    if saved is not None and saved.guard is not None and saved.guard.get("settings") == settings:
        result = saved.guard["result"]
        log.info("accuracy guard: %s passed at an earlier start under the same settings (max relative "
                 "error %.2e); not run again", loaded.key, float(result["max_rel_error"]))  # fmt: skip
    else:
        guard = run_guard(config, loaded.info, loaded.precision, metrics, refused)
        if guard is None:
            return False
        result = guard.to_json()
    loaded.guarded = {"result": result, "settings": settings}
    return True


def _profile_and_plan(
    loaded: Loaded, config: ServeConfig, topology: Topology, policy: Policy, profiles: ProfileFile, measure: bool,
    interrupted: Interrupted,
) -> RuntimeCandidate:  # fmt: skip
    """The candidate's profile (file, state file or measured), recorded in the state file with its guard, and the
    policy's plan on it."""
    state, saved, key, backend = loaded.state, loaded.saved, loaded.key, loaded.backend
    guarded = loaded.guarded
    info = loaded.info if guarded is None else dataclasses.replace(loaded.info, guard=guarded["result"])
    entry = None
    if config.profile and not config.emulate_measure:
        read = read_profile(config.profile, info.runtime, info.precision)
        log.info("profile %s: %d cells for %s", config.profile, len(read), info.runtime)
        profiles.know(read)
        profile: Profile | None = read
    elif saved is not None:
        profile, entry = saved.profile, saved
        age = (time.time() - saved.measured_unix) / 3600
        log.info("state: %s profile from %s (%d cells measured %.1f h ago); not measured again",
                 key, state.path, len(profile), age)  # fmt: skip
        profiles.know(profile)
    elif measure:
        distribution = distribution_for(config)
        profile, estimated = measure_profile(
            backend, info, config, topology, distribution, lambda p: policy.plan(p, topology, distribution),
            interrupted,
        )  # fmt: skip
        entry = Entry(loaded.identity, profile, estimated)
        if profiles.save(profile):
            log.info("profile saved to %s", config.save_profile)
    else:
        profile = None
    if profile is not None:
        kept = entry or Entry(loaded.identity, profile)
        kept.guard = guarded
        state.record(key, kept)
    plan = policy.plan(profile, topology, distribution_for(config))
    if saved is not None:
        state.restored_from = str(state.path)
    return RuntimeCandidate(backend, info, profile, plan, restored=saved is not None)


def screen_cell(loaded: Loaded, topology: Topology, config: ServeConfig, interrupted: Interrupted) -> float:
    """One candidate timed at one cell before any is profiled: one worker on every usable core at the largest
    planned batch, the cell that tells runtimes apart most cheaply (one fork, and the batch the plan weighs most)."""
    if interrupted():
        raise KeyboardInterrupt
    threads, batch = topology.usable_cores, distribution_for(config).max_batch
    bench = Bench(loaded.backend, topology, loaded.info, repeats=2)  # enough to tell a 1.5x gap
    try:
        ms = bench.measure_cell(threads, batch).latency_ms
    finally:
        bench.close()
    log.info("screening %s: t=%d b=%d: %s ms", loaded.key, threads, batch, ms_text(ms))
    return ms


def run_guard(
    config: ServeConfig,
    info: ModelInfo,
    precision: str,
    metrics: Metrics | None,
    refused: dict[str, str] | None = None,
) -> accuracy.GuardResult | None:
    """The accuracy guard for `info.runtime` at `precision`: the result when it passed; None when it failed
    under `--precision auto` (logged, and said in `refused`); AccuracyError when it failed for a precision the
    user pinned."""
    log.info("accuracy guard: running %s at fp32 and %s on the same inputs", info.runtime, precision)
    guard = accuracy.check(
        config.model, info.input, info.runtime, precision,
        input_override=config.input, calibration=config.calibration, tolerance=config.max_rel_error,
        top1=config.accuracy_top1,
    )  # fmt: skip
    if metrics is not None:
        metrics.guarded(guard.runtime, guard.precision, guard.max_rel_error, guard.top1_agreement)
    if guard.passed:
        log.info("accuracy guard: %s", guard.describe())
        return guard
    if config.precision != "auto":
        raise accuracy.refused(guard)
    log.warning("accuracy guard: %s; %s is not served at %s", guard.describe(), info.runtime, precision)
    if refused is not None:
        refused[profile_key(info.runtime, precision)] = guard.describe()
    return None


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
    """SIGHUP: `fresh`, less what takes a restart (`reload.accept`, logged), with the profile re-read and a new plan.

    Raises PackratError when the new configuration cannot be planned; the caller keeps serving.
    """
    reload.accept(running, fresh, runtime)
    policy = policy_for(fresh)
    if fresh.profile:
        profile = read_profile(fresh.profile, runtime, profile.precision if profile is not None else "fp32")
    return Replanned(fresh, policy, profile, policy.plan(profile, topology, distribution_for(fresh)))


def read_profile(path: str, runtime: str, precision: str = "fp32") -> Profile:
    """`runtime`'s rows at `precision` of the profile file; a file that does not say which runtime measured it
    serves this one, and its rows are labelled so (a later --save-profile writes them under that runtime)."""
    if runtime == EMULATED:
        return emulation.emulated_profile(path)  # the latencies the emulated workers wait, whoever measured them
    loaded = Profile.read_csv(path, runtime=runtime, precision=precision)
    if loaded.runtime == runtime and loaded.precision == precision:
        return loaded
    return Profile(dict(loaded.items()), model=loaded.model, runtime=runtime, precision=precision)


def policy_for(config: ServeConfig) -> Policy:
    return policy_from_settings(config.policy, PolicySettings(config.plan, config.min_split_gain, config.max_batch))


def distribution_for(config: ServeConfig) -> BatchDistribution:
    return BatchDistribution.from_counts({b: 1.0 for b in (config.batches or [config.max_batch])})


def _choose(
    candidates: list[RuntimeCandidate], config: ServeConfig, checked: str | None = None
) -> tuple[RuntimeCandidate, str]:
    """--runtime auto, --precision auto: the candidate whose plan predicts the lowest latency (see runtime_choice),
    and why. `checked`: the candidate chosen before, whose splits were just checked (logged again only on a
    change)."""
    choice = choose_runtime([_runtime_option(candidate, config) for candidate in candidates])
    served = next(c for c in candidates if c.key == choice.runtime)
    if len(candidates) > 1 and served.key != checked:
        after = "" if checked is None else f"; after the split check of {checked}"
        log.info("runtime auto: chose %s (%s%s)", served.key, choice.reason, after)
    return served, choice.reason


def _runtime_option(candidate: RuntimeCandidate, config: ServeConfig) -> RuntimeOption:
    plan, profile = candidate.plan, candidate.profile
    batch_ms: dict[int, float | None] = {}
    if profile is not None and not plan.oversubscribed and plan.split == "exact":
        batch_ms = LayoutTable(profile, plan.layout_threads, distribution_for(config)).batch_latencies()
    return RuntimeOption(candidate.key, _predicted(plan, profile), batch_ms)


def _predicted(plan: Plan, profile: Profile | None) -> float:
    """A plan's predicted latency, for choosing between runtimes (unknown sorts last)."""
    if plan.predicted_latency_ms is not None:
        return plan.predicted_latency_ms
    if profile is not None and not plan.oversubscribed:
        lhats = [profile.lhat(i.threads, max(i.batch, 1)) for i in plan.instances]
        if None not in lhats:
            return max(x for x in lhats if x is not None)
    return float("inf")
