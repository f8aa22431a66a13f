"""Each model's best plan on each core count, and its service time's moments: what the joint planner
(policies.colocation) and the choice among splits (policies.colocation_choice) weigh.

For a model, a core count and its live batch sizes: the packrat policy's own plan on that many cores
(`policies.packrat`, the exact solver) and, over the batch distribution, its service time's mean E[S] and
second moment E[S²] (each batch on the fastest layout that carries it, as the policy's `expected_latency`)
and the threads a batch keeps busy on average (what a model planned for every core holds of the machine
while it serves). Memoised: a coordinator asks again with the same profiles and, mostly, the same sizes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from packrat_daemon.wire.errors import InfeasibleError, PackratError
from policies.base import Plan
from policies.packrat import PackratPolicy
from policies.planning.distribution import BatchDistribution
from policies.planning.layouts import LayoutTable, fastest
from policies.planning.profile import Profile
from policies.planning.topology import Topology

_CACHE_SIZE = 512  # (profile, distribution) pairs whose per-core-count plans are kept


@dataclass(frozen=True)
class Option:
    """One model's best plan on one core count, and its service time's first two moments (ms, ms²)."""

    plan: Plan
    mean_ms: float
    second_ms2: float
    busy_threads: float = 0.0  # threads a batch keeps busy, on average over the distribution


def sojourn_ms(mean_ms: float, second_ms2: float, rate_per_s: float) -> float:
    """The M/G/1 mean sojourn (Pollaczek–Khinchine) in ms; inf at ρ = λ·E[S] ≥ 1."""
    rate_per_ms = rate_per_s / 1000.0
    rho = rate_per_ms * mean_ms
    if rho >= 1.0:
        return math.inf
    return mean_ms + rate_per_ms * second_ms2 / (2.0 * (1.0 - rho))


def options(name: str, profile: Profile, distribution: BatchDistribution, most: int, least: int) -> dict[int, Option]:
    """The model's best plan on each core count from `least` to `most` that has one; InfeasibleError if none.

    Past 16 cores a plan is made on every other core count (every fourth past 32; `on_grid`), and a count in
    between holds the plan of the one below it (its extra cores headroom): a share of 34 cores rather than
    33 changes a plan by a few percent, and each plan on many cores costs the exact solver tens of ms. Asked
    for one count (`least == most`), the plan is made on exactly that many."""
    table = _table(profile, distribution)
    found: dict[int, Option] = {}
    below: Option | None = None
    for cores in range(least, most + 1):
        exact = least == most or on_grid(cores)
        if exact and cores not in table:
            table[cores] = _best_on(profile, distribution, cores)
        option = table[cores] if exact else below
        if exact and option is not None:
            below = option
        if option is not None:
            found[cores] = option
    if not found:
        raise InfeasibleError(
            f"model {name} has no plan on {least}..{most} cores for batches up to "
            f"{distribution.max_batch}: give it more cores, profile more thread counts or serve smaller batches",
            largest_servable_batch=0,
        )
    return found


def on_grid(cores: int) -> bool:
    """The core counts a model is planned on exactly: all up to 16, even ones to 32, multiples of 4 beyond."""
    return cores <= 16 or (cores <= 32 and cores % 2 == 0) or cores % 4 == 0


# (profile's rows, distribution) → cores → the option, or None when no plan fits: a memo of a pure function,
# since a coordinator asks again with the same profiles and, mostly, the same batch sizes.
_memo: dict[tuple[object, BatchDistribution], dict[int, Option | None]] = {}


def _table(profile: Profile, distribution: BatchDistribution) -> dict[int, Option | None]:
    key = (tuple((t, profile.row(t)) for t in profile.threads()), distribution)
    table = _memo.get(key)
    if table is None:
        if len(_memo) >= _CACHE_SIZE:
            _memo.pop(next(iter(_memo)))
        table = _memo[key] = {}
    return table


def _best_on(profile: Profile, distribution: BatchDistribution, cores: int) -> Option | None:
    try:
        plan = PackratPolicy().plan(profile, Topology.synthetic(cores), distribution)
    except PackratError:  # no row fits these cores, or the largest batch cannot be carried on them
        return None
    table = LayoutTable(profile, plan.layout_threads, distribution)
    mean = second = threads = 0.0
    for batch, weight in distribution.weights:
        runs = [(split, layout) for layout, splits in table.splits.items() if (split := splits[batch]) is not None]
        if not runs:
            return None
        split, layout = runs[fastest([split for split, _ in runs])]
        mean += weight * split.latency_ms
        second += weight * split.latency_ms**2
        threads += weight * sum(t for t, rows in zip(layout, split.rows, strict=True) if rows)
    return Option(plan, mean, second, threads)
