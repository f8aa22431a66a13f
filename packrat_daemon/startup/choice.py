"""The choice between the prepared candidates (`--runtime auto`, `--precision auto`): the one whose plan
predicts the lowest latency, resumed on the state file's plan when it holds one, its splits checked on real
workers, and chosen again while the check made another candidate fastest (`runtime_choice.choose_checked`)."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from packrat_daemon.config import ServeConfig
from packrat_daemon.measure.profiling import check_splits
from packrat_daemon.measure.runtime_choice import RuntimeOption, choose_checked, choose_runtime
from packrat_daemon.startup.context import RuntimeCandidate, StartContext, distribution_for
from policies.base import Plan
from policies.planning.layouts import LayoutTable
from policies.planning.profile import Profile

log = logging.getLogger("packrat.daemon")


def settle(ctx: StartContext, candidates: list[RuntimeCandidate]) -> tuple[RuntimeCandidate, str]:
    """The candidate to serve and why: chosen, resumed from the state file, its splits checked, and chosen again
    while the check made another candidate fastest (runtime_choice.choose_checked). `candidates` is updated in
    place with what resuming and the split check made of each."""
    config, policy, topology, state = ctx.config, ctx.policy, ctx.topology, ctx.state
    at = {candidate.key: k for k, candidate in enumerate(candidates)}
    distribution = distribution_for(config)
    chosen: list[str] = []
    reasons: list[str] = []

    resumed: set[str] = set()

    def choose() -> str:
        picked, reason = _choose(candidates, config, chosen[-1] if chosen else None)
        reasons.append(reason)
        served = picked if picked.key in resumed else resume(ctx, picked)
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
            lambda p: policy.plan(p, topology, distribution), ctx.interrupted,
        )  # fmt: skip
        if ctx.profiles.save(profile):
            log.info("profile saved to %s", config.save_profile)
        candidates[at[key]] = dataclasses.replace(served, profile=profile, plan=plan)

    served = candidates[at[choose_checked(choose, check)]]
    return served, reasons[-1]


def resume(ctx: StartContext, served: RuntimeCandidate) -> RuntimeCandidate:
    """The state file's plan for the served runtime, when it holds one this daemon can serve as it is."""
    state = ctx.state
    state.served_key = served.key
    if not served.restored:
        return served
    plan = state.resumed_plan(served.key, ctx.policy.name, ctx.topology, ctx.config.max_batch)
    if plan is None:
        log.info("state: no saved plan fits this configuration; planning on the saved profile")
        return dataclasses.replace(served, restored=False)
    log.info("state: serving the learned plan %s; no profiling", plan.describe())
    return dataclasses.replace(served, plan=plan)


def choice_settings(config: ServeConfig) -> dict[str, Any]:
    """What the choice between candidates was planned for, besides their identities (ops.state.Choice)."""
    return {"policy": config.policy, "max_batch": config.max_batch, "batches": sorted(config.batches or [])}


def predictions(candidates: list[RuntimeCandidate]) -> dict[str, float]:
    """Each candidate's predicted latency, by its label, for the verdicts (runtime_choice.verdicts)."""
    return {candidate.key: predicted(candidate.plan, candidate.profile) for candidate in candidates}


def predicted(plan: Plan, profile: Profile | None) -> float:
    """A plan's predicted latency, for choosing between runtimes (unknown sorts last)."""
    if plan.predicted_latency_ms is not None:
        return plan.predicted_latency_ms
    if profile is not None and not plan.oversubscribed:
        lhats = [profile.lhat(i.threads, max(i.batch, 1)) for i in plan.instances]
        if None not in lhats:
            return max(x for x in lhats if x is not None)
    return float("inf")


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
    return RuntimeOption(candidate.key, predicted(plan, profile), batch_ms)
