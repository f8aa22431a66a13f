"""Start-up's checks, before any model loads: what can fail in a second fails first (keys and binds, the run
folder, the metrics port, the emulation settings, a plan or a profile beyond the cores), then which
(runtime, precision) candidates to prepare, and whether one answers first while the others are measured."""

from __future__ import annotations

import logging

import zmq

from packrat_daemon.config import ServeConfig
from packrat_daemon.measure import emulation
from packrat_daemon.ops.hardening import check_endpoint, private_dir, raise_fd_limit, warn_if_root
from packrat_daemon.ops.metrics import Metrics
from packrat_daemon.startup.context import distribution_for
from packrat_daemon.wire.curve import FrontendSecurity
from packrat_daemon.wire.errors import ConfigError, ProfileError
from policies.base import Policy
from policies.planning.profile import Profile, profile_key
from policies.planning.topology import Topology
from workers.models.precision import cpu_units
from workers.models.spec import (
    PRECISIONS,
    available_runtimes,
    check_model_runtime,
    check_precision,
    model_runtimes,
    runtime_precisions,
)

log = logging.getLogger("packrat.daemon")


def check_serving(config: ServeConfig, context: zmq.Context, metrics: Metrics) -> None:
    """Keys, a public bind and the run folder fail before minutes of profiling; so does a metrics port in use,
    which is opened here (the caller's to close)."""
    FrontendSecurity.check(config.endpoint, config.server_key, config.allowed_clients, config.insecure_public)
    check_endpoint(context, config.endpoint)
    if config.run_dir is not None:
        private_dir(config.run_dir)
    warn_if_root()
    raise_fd_limit()  # before any client connects or a template inherits the limit
    if config.metrics_port:  # first: a port clash should fail before minutes of profiling
        metrics.serve(config.metrics_port, config.metrics_address)
        log.info("metrics on http://%s:%d/metrics", config.metrics_address, config.metrics_port)


def machine(config: ServeConfig, topology: Topology | None) -> Topology:
    """The cores this model serves on (--cpus: its share of the machine, or of the emulated one); the emulate
    settings are refused here unless --runtime emulated, which needs a profile."""
    emulating = emulation.check(config)
    topology = (topology or emulation.topology(config)).share(config.cpus)
    log.info("machine: %s", topology.describe())
    if emulating:
        log.warning("%s", emulation.describe(config, topology.usable_cores)["note"])
    return topology


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
