"""The Packrat policy: the exact optimum ⟨i, t, b⟩ for the batch sizes being served.

For one batch size this is the solver's answer. For a distribution, each likely batch size proposes
its own optimal pool; every proposal is scored by its expected latency when each batch of the
distribution is split exactly across that pool, and the best proposal wins.
"""

from __future__ import annotations

from packrat_daemon.distribution import BatchDistribution
from packrat_daemon.errors import InfeasibleError, PolicyError
from packrat_daemon.profile import Profile
from packrat_daemon.topology import Topology
from policies.base import InstancePlan, Plan, Policy
from policies.solver import Solution, Solver, split_batch

CANDIDATE_BATCHES = 8  # how many of the most likely batch sizes propose a pool


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
            return _plan_from(best, best.latency_ms, f"exact optimum for batch {best.batch} on {cores} cores")
        scored = []
        for solution in solutions:
            expected = _expected_latency(profile, [t for t, _ in solution.instances], distribution)
            if expected is not None:
                key = (expected, len(solution.instances), solution.threads_used)
                scored.append((key, solution))
        if not scored:
            raise InfeasibleError(
                f"no pool on {cores} cores carries every batch size up to {distribution.max_batch}",
                largest_servable_batch=solver.largest_servable_batch(),
            )
        (expected, _, _), best = min(scored, key=lambda item: item[0])
        reason = (
            f"best expected latency over {len(distribution.weights)} batch sizes "
            f"(pool proposed by batch {best.batch}) on {cores} cores"
        )
        return _plan_from(best, expected, reason)


def _expected_latency(profile: Profile, pool: list[int], distribution: BatchDistribution) -> float | None:
    total = 0.0
    for batch, weight in distribution.weights:
        try:
            latency, _ = split_batch(profile, pool, batch)
        except InfeasibleError:
            return None
        total += weight * latency
    return total


def _plan_from(solution: Solution, predicted: float, reason: str) -> Plan:
    return Plan(
        instances=tuple(InstancePlan(t, b) for t, b in solution.instances),
        policy=PackratPolicy.name,
        reason=reason,
        predicted_latency_ms=predicted,
    )
