"""Checking a plan's splits by measurement before serving them.

A start-up profile measures each cell a few times. On a shared machine a cell can be off by 5% or more,
so a near tie between one instance and a split can fall either way: a 2×1 plan predicted more than 5%
faster at batch 2 measured 2.4% slower than `single` (bench/e2e.py on two cores). So before the
daemon serves, every batch size its plan would split runs both ways side by side, split and one
instance, their rounds interleaved so that a noisy neighbour slows both alike. The measured cells
replace the profiled ones and the policy plans again on them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from packrat_daemon.measure.bench import Instances, PlanTiming
from policies.base import Plan
from policies.planning.distribution import BatchDistribution
from policies.planning.layouts import best_one_instance, fastest, split_on
from policies.planning.profile import Cell, Profile

Compare = Callable[[Mapping[str, Instances], int], Mapping[str, PlanTiming]]


@dataclass(frozen=True)
class SplitDecision:
    """At `batch`, the plan splits across `split` ((threads, rows) per worker) instead of `alone`."""

    batch: int
    split: tuple[tuple[int, int], ...]
    alone: tuple[int, int]  # (threads, batch): the best single instance the profile knows

    def describe(self) -> str:
        parts = " + ".join(f"{t}t×{b}" for t, b in self.split)
        return f"batch {self.batch}: {parts} against {self.alone[0]}t×{self.alone[1]}"


def dispatched_splits(
    profile: Profile, plan: Plan, distribution: BatchDistribution, min_split_gain: float
) -> Iterator[tuple[int, tuple[tuple[int, int], ...]]]:
    """Each batch size of `distribution` with the (threads, rows) of each busy instance `plan` runs it on,
    split on `profile` as the dispatcher splits it (the fastest of the plan's layouts); sizes no layout
    splits are left out."""
    for batch in distribution.batches:
        splits = [(threads, split_on(profile, threads, batch)) for threads in plan.layout_threads]
        options = [(threads, split) for threads, split in splits if split is not None]
        if not options:
            continue
        threads, split = options[fastest([split for _, split in options], min_split_gain)]
        yield batch, tuple((t, rows) for t, rows in zip(threads, split.rows, strict=True) if rows)


def split_decisions(
    profile: Profile, plan: Plan, distribution: BatchDistribution, cores: int, min_split_gain: float
) -> list[SplitDecision]:
    """The batch sizes of `distribution` that `plan` would split, each with its one-instance rival."""
    decisions = []
    for batch, chosen in dispatched_splits(profile, plan, distribution, min_split_gain):
        alone = best_one_instance(profile, cores, BatchDistribution.single(batch))
        if len(chosen) > 1 and alone is not None:
            decisions.append(SplitDecision(batch, chosen, (alone[0], batch)))
    return decisions


def measured_profile(
    profile: Profile, decisions: Sequence[SplitDecision], compare: Compare, rounds: int,
    on_measured: Callable[[SplitDecision, PlanTiming, PlanTiming], None] | None = None,
) -> Profile:  # fmt: skip
    """`profile` with every decision's cells replaced by a side-by-side measurement of both options.

    `compare` times named plans in one interleaved run (bench.Bench.compare). A cell that two
    instances of a split share keeps the slower of the two: the plan waits for its slowest instance.
    """
    cells: dict[tuple[int, int], Cell] = dict(profile.items())
    for decision in decisions:
        timings = compare({"split": decision.split, "alone": (decision.alone,)}, rounds)
        split, alone = timings["split"], timings["alone"]
        measured: dict[tuple[int, int], float] = {}
        for key, latency in zip(decision.split, split.per_instance_ms, strict=True):
            measured[key] = max(latency, measured.get(key, 0.0))
        measured[decision.alone] = alone.latency_ms
        for key, latency in measured.items():
            cells[key] = Cell(latency, split.rounds)
        if on_measured is not None:
            on_measured(decision, split, alone)
    return Profile(cells, model=profile.model, runtime=profile.runtime, precision=profile.precision)


def checked_plan(
    profile: Profile, plan: Plan, replan: Callable[[Profile], Plan], distribution: BatchDistribution, cores: int,
    min_split_gain: float, compare: Compare, rounds: int,
    on_measured: Callable[[SplitDecision, PlanTiming, PlanTiming], None] | None = None,
) -> tuple[Profile, Plan]:  # fmt: skip
    """Check each split `plan` makes, plan again (`replan`) on what was measured, and repeat for any split
    the new plan makes that was not run yet: the plan served never splits a batch size unmeasured, and a
    split measured slower than one instance is reverted (its cells now say so). Each round runs only new
    decisions, of which there are finitely many, so it ends."""
    checked: set[SplitDecision] = set()
    while True:
        decisions = [d for d in split_decisions(profile, plan, distribution, cores, min_split_gain) if d not in checked]
        if not decisions:
            return profile, plan
        profile = measured_profile(profile, decisions, compare, rounds, on_measured)
        checked.update(decisions)
        plan = replan(profile)
