"""The Packrat policy: the exact optimum ⟨i, t, b⟩ for the batch sizes being served.

For one batch size this is the solver's answer. For a distribution, each likely batch size proposes
its own optimal pool. The main layout is the proposal with the best expected latency when every batch
of the distribution is split exactly across it; further proposals are kept as spare layouts (up to
MAX_LAYOUTS in all) when letting each batch size run on its best layout cuts the expected latency by
at least MIN_LAYOUT_GAIN. That expectation is of compute alone; under load a spare also shortens the
queue, so its end-to-end gain is larger, and the bar is low. The dispatcher then picks, per batch,
the layout predicted fastest (policies.planning.layouts).

Splitting must earn its keep: a plan with several instances is served only when it is predicted at
least ``min_split_gain`` faster than the best one-instance pool, the margin the dispatcher also applies
to each batch (policies.planning.layouts says why).
"""

from __future__ import annotations

from packrat_daemon.wire.errors import InfeasibleError, PolicyError
from policies.base import MAX_LAYOUTS, InstancePlan, Plan, Policy, PolicySettings
from policies.planning.distribution import BatchDistribution
from policies.planning.layouts import Layout, LayoutTable, best_one_instance, split_pays
from policies.planning.profile import Profile
from policies.planning.topology import Topology
from policies.solver import Solution, Solver

CANDIDATE_BATCHES = 8  # how many of the most likely batch sizes propose a pool
MIN_LAYOUT_GAIN = 0.01  # a spare layout must cut the expected latency by at least 1%
MIN_SPLIT_GAIN = 0.05  # several instances must beat one by at least 5% (as adaptation's --adapt-min-gain)


class PackratPolicy(Policy):
    name = "packrat"
    needs_profile = True
    adapts = True
    checks_splits = True

    def __init__(self, min_split_gain: float = MIN_SPLIT_GAIN) -> None:
        if not 0.0 <= min_split_gain < 1.0:
            raise PolicyError(f"min_split_gain must be in [0, 1), e.g. 0.05 for 5%; got {min_split_gain!r}")
        self.min_split_gain = min_split_gain

    @classmethod
    def from_settings(cls, settings: PolicySettings) -> PackratPolicy:
        return cls(min_split_gain=settings.min_split_gain)

    def expected_latency(self, profile: Profile, plan: Plan, distribution: BatchDistribution) -> float:
        """Each batch size on the fastest of the plan's layouts that carries it; inf when none does."""
        return LayoutTable(profile, plan.layout_threads, distribution).expected()

    def plan(self, profile: Profile | None, topology: Topology, distribution: BatchDistribution) -> Plan:
        plan = self._optimum(profile, topology, distribution)
        assert profile is not None  # _optimum raised otherwise
        if all(len(layout) == 1 for layout in plan.layouts) or plan.predicted_latency_ms is None:
            return plan
        one = best_one_instance(profile, topology.usable_cores, distribution)
        if one is None:
            return plan
        threads, latency = one
        if split_pays(plan.predicted_latency_ms, latency, self.min_split_gain):
            return plan
        gain = 1.0 - plan.predicted_latency_ms / latency
        reason = (
            f"one {threads}-thread instance: the best split ({_shape(plan)}) is predicted only {gain:.1%} "
            f"faster, under the {self.min_split_gain:.0%} a split must gain"
        )
        batch = distribution.max_batch
        return Plan(
            instances=(InstancePlan(threads, batch),), policy=self.name, reason=reason, predicted_latency_ms=latency
        )

    def _optimum(self, profile: Profile | None, topology: Topology, distribution: BatchDistribution) -> Plan:
        if profile is None:
            raise PolicyError("the packrat policy needs a latency profile; pass --profile or let serve profile")
        cores = topology.usable_cores
        solver = Solver(profile, cores)
        proposals = sorted(set(distribution.most_likely(CANDIDATE_BATCHES)) | {distribution.max_batch})
        solutions = [solver.solve(batch) for batch in proposals]
        if len(distribution.weights) == 1:
            best = solutions[0]
            return _plan_from(best, best.latency_ms, f"exact optimum for batch {best.batch} on {cores} cores", [])
        pools: dict[Layout, Solution] = {}
        for solution in solutions:
            pools.setdefault(tuple(sorted((t for t, _ in solution.instances), reverse=True)), solution)
        table = LayoutTable(profile, pools, distribution)
        carrying = [pool for pool in pools if table.carries(pool)]
        if not carrying:
            raise InfeasibleError(
                f"no pool on {cores} cores carries every batch size up to {distribution.max_batch}",
                largest_servable_batch=solver.largest_servable_batch(),
            )
        main = min(carrying, key=lambda pool: (table.expected([pool]), len(pool), sum(pool)))
        layouts = [main]
        alone = expected = table.expected(layouts)
        refused = ""  # the next spare's gain when it was too small: a near tie shows in the log
        while len(layouts) < MAX_LAYOUTS:
            spare = min((p for p in pools if p not in layouts), default=None,
                        key=lambda p: table.expected([*layouts, p]))  # fmt: skip
            if spare is None:
                break
            improved = table.expected([*layouts, spare])
            if improved > expected * (1 - MIN_LAYOUT_GAIN):
                refused = f"; another layout would cut {1 - improved / expected:.1%}, under {MIN_LAYOUT_GAIN:.0%}"
                break
            layouts.append(spare)
            expected = improved
        spares = f", {len(layouts) - 1} spare layout(s) cutting {1 - expected / alone:.1%}" if len(layouts) > 1 else ""
        reason = (
            f"best expected latency over {len(distribution.weights)} batch sizes on {cores} cores "
            f"(main layout: the optimum for batch {pools[main].batch}{spares}{refused})"
        )
        return _plan_from(pools[main], expected, reason, [pools[p] for p in layouts[1:]])


def _shape(plan: Plan) -> str:
    return " + ".join(str(i.threads) for i in plan.instances) + " threads"


def _plan_from(solution: Solution, predicted: float, reason: str, spares: list[Solution]) -> Plan:
    return Plan(
        instances=tuple(InstancePlan(t, b) for t, b in solution.instances),
        policy=PackratPolicy.name,
        reason=reason,
        predicted_latency_ms=predicted,
        alternatives=tuple(tuple(InstancePlan(t, b) for t, b in spare.instances) for spare in spares),
    )
