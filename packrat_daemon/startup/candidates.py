"""Candidate preparation: a template per (runtime, precision), its accuracy guard (`guard`), its profile (the
given file, the state file's, or measured) and the policy's plan on it. Several candidates to measure are first
screened at one cell, and one far slower than the fastest is neither guarded nor profiled."""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Callable

from packrat_daemon.fleet.backend import Backend
from packrat_daemon.measure import emulation
from packrat_daemon.measure.bench import Bench
from packrat_daemon.measure.contention import quiet_now
from packrat_daemon.measure.profiling import measure_profile
from packrat_daemon.measure.runtime_choice import SCREEN_MARGIN, ms_text, screened_slower
from packrat_daemon.ops.state import Entry
from packrat_daemon.startup import guard
from packrat_daemon.startup.context import Loaded, RuntimeCandidate, StartContext, distribution_for, read_profile
from policies.planning.profile import Profile, profile_key
from workers.models.calibration import template_precision
from workers.models.spec import EMULATED

log = logging.getLogger("packrat.daemon")


def prepare_runtime(
    ctx: StartContext,
    runtime: str,
    precision: str = "fp32",
    measure: bool = False,
    refused: dict[str, str] | None = None,
) -> RuntimeCandidate | None:
    """Start a template for `runtime` at `precision`, run the accuracy guard on a reduced precision (or take the
    state file's, run under the same settings), get the profile (file, state file or measured) and the policy's
    plan. None: `--precision auto` and the guard refused it (why goes into `refused`, by the candidate's label)."""
    loaded = load(ctx, runtime, precision, nice=0)
    try:
        if not guard.passes(ctx, loaded, refused):
            loaded.backend.close()
            return None
        return profile_and_plan(ctx, loaded, measure)
    except BaseException:
        loaded.backend.close()
        raise


def prepare_candidates(
    ctx: StartContext,
    pairs: list[tuple[str, str]],
    measure: bool,
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
    config = ctx.config
    loaded: list[Loaded] = []
    candidates: list[RuntimeCandidate] = []
    try:
        for runtime, precision in pairs:
            if ctx.interrupted():
                raise KeyboardInterrupt
            loaded.append(load(ctx, runtime, precision, nice))
        fresh = [each for each in loaded if each.saved is None and not (config.profile and not config.emulate_measure)]
        screens = {each.key: screen_cell(ctx, each) for each in fresh} if measure and len(fresh) > 1 else {}
        order = sorted(loaded, key=lambda each: screens.get(each.key, 0.0))  # the saved first: nothing to time
        fastest: tuple[str, float] | None = None
        for each in order:
            ms = screens.get(each.key)
            why = None if ms is None or fastest is None else screened_slower(ms, fastest[1], fastest[0], margin)
            if why is not None:
                screened[each.key] = why  # said with the verdicts, once the choice is made
            elif guard.passes(ctx, each, refused):
                candidates.append(profile_and_plan(ctx, each, measure))
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


def load(ctx: StartContext, runtime: str, precision: str, nice: int) -> Loaded:
    """The candidate's template started (at `nice`) and loaded, with what the state file holds for it."""
    config = ctx.config
    key = profile_key(runtime, precision)
    run_dir = None if config.run_dir is None else os.path.join(config.run_dir, key.replace("/", "-"))
    backend = Backend(ctx.context, run_dir)
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
    state = ctx.state
    ident = state.identity(config, info.runtime, info.precision, ctx.topology)
    saved = state.restore(key, ident)
    if saved is not None and saved.contention is not None and saved.contention.contended and quiet_now():
        log.info("state: %s's profile was %s; the machine is quiet now, so it is measured again", key,
                 saved.contention.describe())  # fmt: skip
        saved = None
    return Loaded(key, precision, backend, info, ident, saved, state)


def profile_and_plan(ctx: StartContext, loaded: Loaded, measure: bool) -> RuntimeCandidate:
    """The candidate's profile (file, state file or measured), recorded in the state file with its guard, and the
    policy's plan on it."""
    config, topology, policy, profiles = ctx.config, ctx.topology, ctx.policy, ctx.profiles
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
        profile, estimated, crowding = measure_profile(
            backend, info, config, topology, distribution, lambda p: policy.plan(p, topology, distribution),
            ctx.interrupted,
        )  # fmt: skip
        entry = Entry(loaded.identity, profile, estimated, contention=crowding)
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


def screen_cell(ctx: StartContext, loaded: Loaded) -> float:
    """One candidate timed at one cell before any is profiled: one worker on every usable core at the largest
    planned batch, the cell that tells runtimes apart most cheaply (one fork, and the batch the plan weighs most)."""
    if ctx.interrupted():
        raise KeyboardInterrupt
    topology = ctx.topology
    threads, batch = topology.usable_cores, distribution_for(ctx.config).max_batch
    bench = Bench(loaded.backend, topology, loaded.info, repeats=2)  # enough to tell a 1.5x gap
    try:
        ms = bench.measure_cell(threads, batch).latency_ms
    finally:
        bench.close()
    log.info("screening %s: t=%d b=%d: %s ms", loaded.key, threads, batch, ms_text(ms))
    return ms
