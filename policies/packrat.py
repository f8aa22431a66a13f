"""The Packrat policy: the exact optimum ⟨i, t, b⟩ for the batch sizes being served.

For one batch size this is the solver's answer. For a distribution, each likely batch size proposes
its own optimal pool. The main layout is the proposal with the best expected latency when every batch
of the distribution is split exactly across it; further proposals are kept as spare layouts (up to
MAX_LAYOUTS in all) when letting each batch size run on its best layout cuts the expected latency by
more than MIN_LAYOUT_GAIN. The dispatcher then picks, per batch, the layout predicted fastest.
"""

from __future__ import annotations

from packrat_daemon.distribution import BatchDistribution
from packrat_daemon.errors import InfeasibleError, PolicyError
from packrat_daemon.profile import Profile
from packrat_daemon.topology import Topology
from policies.base import InstancePlan, Plan, Policy
from policies.solver import Solution, Solver, split_batch

CANDIDATE_BATCHES = 8  # how many of the most likely batch sizes propose a pool
MAX_LAYOUTS = 3  # the main layout and up to two spares: each spare is another set of forked workers
MIN_LAYOUT_GAIN = 0.02  # a spare layout must cut the expected latency by at least 2%


class PackratPolicy(Policy):
    name = "packrat"
    needs_profile = True

    def plan(self, profile: Profile | None, topology: Topology, distribution: BatchDistribution) -> Plan:
        if profile is None:
            raise PolicyError("the packrat policy needs a latency profile; pass --profile or let serve profile")
        cores = topology.usable_cores
        solver = Solver(profile, cores)
        proposals = sorted(set(distribution.most_likely(CANDIDATE_BATCHES)) | {distribution.max_batch})
        solutions = [solver.solve(batch) for batch in proposals]
        if len(distribution.weights) == 1:
            best = solutions[0]
            return _plan_from(best, best.latency_ms, f"exact optimum for batch {best.batch} on {cores} cores", [])
        # Latency of each distinct proposed pool at each batch size (None: that pool cannot carry it).
        pools: dict[tuple[int, ...], Solution] = {}
        for solution in solutions:
            pools.setdefault(tuple(sorted((t for t, _ in solution.instances), reverse=True)), solution)
        table = {pool: _latencies(profile, list(pool), distribution) for pool in pools}
        carrying = [pool for pool, row in table.items() if None not in row.values()]
        if not carrying:
            raise InfeasibleError(
                f"no pool on {cores} cores carries every batch size up to {distribution.max_batch}",
                largest_servable_batch=solver.largest_servable_batch(),
            )
        main = min(carrying, key=lambda pool: (_expected([pool], table, distribution), len(pool), sum(pool)))
        layouts = [main]
        expected = _expected(layouts, table, distribution)
        while len(layouts) < MAX_LAYOUTS:
            spare = min((p for p in pools if p not in layouts), default=None,
                        key=lambda p: _expected([*layouts, p], table, distribution))  # fmt: skip
            if spare is None:
                break
            improved = _expected([*layouts, spare], table, distribution)
            if improved > expected * (1 - MIN_LAYOUT_GAIN):
                break
            layouts.append(spare)
            expected = improved
        reason = (
            f"best expected latency over {len(distribution.weights)} batch sizes on {cores} cores "
            f"(main pool proposed by batch {pools[main].batch}"
            + (f", {len(layouts) - 1} spare layout(s)" if len(layouts) > 1 else "")
            + ")"
        )
        return _plan_from(pools[main], expected, reason, [pools[p] for p in layouts[1:]])


def _latencies(profile: Profile, pool: list[int], distribution: BatchDistribution) -> dict[int, float | None]:
    row: dict[int, float | None] = {}
    for batch, _ in distribution.weights:
        try:
            row[batch] = split_batch(profile, pool, batch)[0]
        except InfeasibleError:
            row[batch] = None
    return row


def _expected(layouts: list[tuple[int, ...]], table: dict, distribution: BatchDistribution) -> float:
    """Expected latency when each batch runs on the fastest of `layouts` that can carry it."""
    total = 0.0
    for batch, weight in distribution.weights:
        options = [table[pool][batch] for pool in layouts if table[pool][batch] is not None]
        total += weight * (min(options) if options else float("inf"))
    return total


def _plan_from(solution: Solution, predicted: float, reason: str, spares: list[Solution]) -> Plan:
    return Plan(
        instances=tuple(InstancePlan(t, b) for t, b in solution.instances),
        policy=PackratPolicy.name,
        reason=reason,
        predicted_latency_ms=predicted,
        alternatives=tuple(tuple(InstancePlan(t, b) for t, b in spare.instances) for spare in spares),
    )


def plan_expected_latency(profile: Profile, plan: Plan, distribution: BatchDistribution) -> float:
    """Expected latency of a plan's layouts under `distribution` (inf when a batch size cannot be served)."""
    layouts = [tuple(i.threads for i in layout) for layout in plan.layouts]
    table = {pool: _latencies(profile, list(pool), distribution) for pool in set(layouts)}
    return _expected(layouts, table, distribution)
