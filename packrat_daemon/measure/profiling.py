"""Start-up's measurements on real workers: the profile, the split check of the plan made on it, and the
--save-profile file they are written to.

- `measure_profile`: the default grid (threads 1..cores × batches up to the largest planned), every cell
  when the grid is small, else the adaptive search within `--profile-budget` (`search/start_profile.py`:
  measured and estimated cells kept apart, the plan's own cells always measured). Cells are measured
  side by side, as many workers as the cores hold, so interference is in the profile.
- `check_splits`: each batch size the plan splits, run both ways side by side (`measure/split_check.py`).

A stop signal (`interrupted`) ends either between two measurements with KeyboardInterrupt.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from packrat_daemon.config import ServeConfig
from packrat_daemon.fleet.backend import Backend, ModelInfo
from packrat_daemon.measure.bench import Bench, PlanTiming, default_grid
from packrat_daemon.measure.contention import Contention
from packrat_daemon.measure.split_check import SplitDecision, checked_plan, split_decisions
from packrat_daemon.ops.progress import Progress
from packrat_daemon.search.budget import Budget, StepReport
from policies.base import Plan
from policies.planning.distribution import BatchDistribution
from policies.planning.profile import Cell, Profile, profile_key, write_profiles
from policies.planning.topology import Topology

log = logging.getLogger("packrat.daemon")

Interrupted = Callable[[], bool]  # True once a stop signal has arrived
PlanFor = Callable[[Profile], Plan]  # the policy's plan on a table, for the daemon's own batch sizes


def measure_profile(
    backend: Backend, info: ModelInfo, config: ServeConfig, topology: Topology, distribution: BatchDistribution,
    plan_for: PlanFor, interrupted: Interrupted,
) -> tuple[Profile, dict[tuple[int, int], float], Contention | None]:  # fmt: skip
    """Measure the start-up profile on workers forked from `backend`'s template. Returns the measured cells,
    the only ones planned and served on, the adaptive search's estimates of the others (none for a full grid),
    and how crowded the cores were (`measure.contention`; None where the kernel does not say)."""
    from packrat_daemon.search.start_profile import start_profile, uses_search  # scikit-optimize: only to measure

    threads, batches = default_grid(topology.usable_cores, distribution.max_batch)
    cells = [(t, b) for t in threads for b in batches]
    budget = Budget.parse(config.profile_budget, "--profile-budget")
    key = profile_key(info.runtime, info.precision)
    total = budget.max_cells(len(cells)) if uses_search(len(cells), budget) else len(cells)
    label = f"profiling {key}" + (f" adaptively (at most {total} of {len(cells)} cells)" if total < len(cells) else "")
    progress = Progress(total, label)
    profiler = Bench(backend, topology, info)

    def measure(t: int, b: int) -> Cell:
        if interrupted():  # SIGTERM or Ctrl-C: stop between cells
            raise KeyboardInterrupt
        return profiler.measure_cell(t, b)

    def step(report: StepReport) -> None:
        plans = "; ".join(f"B={b}: ≈{s.latency_ms:.1f} ms" for b, s in sorted(report.solutions.items()))
        t, b = report.cell
        progress.advance(f"t={t} b={b}: {report.latency_ms:.2f} ms" + (f" | {plans}" if plans else ""))

    def confirm(cell: tuple[int, int]) -> None:
        log.info("profiling %s: the plan rests on the estimated cell t=%d b=%d: measuring it", key, *cell)

    try:
        found = start_profile(measure, cells, distribution, topology.usable_cores, budget, plan_for, step, confirm)
    finally:
        profiler.close()
        progress.close()
    log.info("profile %s: %s", key, found.describe())
    crowding = Contention.of(profiler.on_cpu)
    if crowding is not None and crowding.contended:
        log.warning("profile %s: %s; the plan made on it may predict what this machine does not give. Production "
                    "timings correct it as it serves, and a start on a quiet machine measures it again", key,
                    crowding.describe())  # fmt: skip
    profile = found.profile(model=config.model, runtime=info.runtime, precision=info.precision)
    return profile, found.estimated, crowding


def check_splits(
    backend: Backend, info: ModelInfo, profile: Profile, plan: Plan, config: ServeConfig, topology: Topology,
    distribution: BatchDistribution, plan_for: PlanFor, interrupted: Interrupted,
) -> tuple[Profile, Plan]:  # fmt: skip
    """Run each batch size the plan would split both ways side by side; plan again on what was measured
    (and check the new plan's own new splits the same way). Returns the checked profile and its plan."""
    cores = topology.usable_cores
    decisions = split_decisions(profile, plan, distribution, cores, config.min_split_gain)
    if not decisions:
        return profile, plan
    bench = Bench(backend, topology, info)
    progress = Progress(len(decisions), "checking splits side by side")

    def measured(decision: SplitDecision, split: PlanTiming, alone: PlanTiming) -> None:
        slower = split.latency_ms > alone.latency_ms
        log.info(
            "split check at %s: split %.1f ms, one instance %.1f ms (medians of %d interleaved rounds)%s",
            decision.describe(), split.latency_ms, alone.latency_ms, split.rounds,
            ": the split is slower, so it is not served" if slower else "",
        )  # fmt: skip
        progress.advance(f"batch {decision.batch}: split {split.latency_ms:.1f} ms, alone {alone.latency_ms:.1f} ms")
        if interrupted():  # SIGTERM or Ctrl-C during start-up: stop between checks
            raise KeyboardInterrupt

    try:
        checked, new = checked_plan(
            profile, plan, plan_for, distribution, cores, config.min_split_gain, bench.compare,
            config.split_check_rounds, measured,
        )  # fmt: skip
    finally:
        bench.close()
        progress.close()
    if new.layouts != plan.layouts:
        log.info("split check changed the plan: %s → %s", plan.describe(), new.describe())
    return checked, new


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
        self.known[profile_key(profile.runtime, profile.precision)] = profile

    def save(self, profile: Profile) -> bool:
        """Write `profile` in place of its runtime's rows at its precision; False when no --save-profile was given."""
        self.known[profile_key(profile.runtime, profile.precision)] = profile
        if self.path is None:
            return False
        write_profiles(self.path, list(self.known.values()))
        return True
