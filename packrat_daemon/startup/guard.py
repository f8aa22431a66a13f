"""The accuracy guard at start-up: a reduced precision is served only when its outputs stay within
--max-rel-error of fp32's on the same inputs (`measure.accuracy`), or when the state file says it passed at an
earlier start under the same settings. Under `--precision auto` a candidate that fails is left out; a precision
the user pinned that fails stops the start."""

from __future__ import annotations

import logging

from packrat_daemon.config import ServeConfig
from packrat_daemon.fleet.backend import ModelInfo
from packrat_daemon.measure import accuracy
from packrat_daemon.ops.metrics import Metrics
from packrat_daemon.startup.context import Loaded, StartContext
from policies.planning.profile import profile_key

log = logging.getLogger("packrat.daemon")


def passes(ctx: StartContext, loaded: Loaded, refused: dict[str, str] | None) -> bool:
    """The accuracy guard on a reduced precision, or the state file's run under the same settings; False: refused
    under `--precision auto` (why in `refused`). What passed is kept in `loaded.guarded`."""
    if loaded.precision == "fp32":
        return True
    settings = loaded.state.guard_settings(ctx.config)
    saved = loaded.saved
    if saved is not None and saved.guard is not None and saved.guard.get("settings") == settings:
        result = saved.guard["result"]
        log.info("accuracy guard: %s passed at an earlier start under the same settings (max relative "
                 "error %.2e); not run again", loaded.key, float(result["max_rel_error"]))  # fmt: skip
    else:
        guard = run_guard(ctx.config, loaded.info, loaded.precision, ctx.metrics, refused)
        if guard is None:
            return False
        result = guard.to_json()
    loaded.guarded = {"result": result, "settings": settings}
    return True


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
