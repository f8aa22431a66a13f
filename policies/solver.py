"""The exact ⟨instances, threads, batch⟩ solver.

The question: choose instances (t_k, b_k) with Σ t_k ≤ T, Σ b_k = B, b_k ≥ 1, minimising
max_k L̂(t_k, b_k), where L̂(t, b) is the latency of the smallest profiled batch b' ≥ b for t.

Method: for a latency bound λ each thread count's row allows a set of batch sizes S_λ(t) (`policies.bounds`),
and feasibility is an unbounded knapsack over thread counts with Σ t ≤ T whose allowed sets reach B: sums of
caps when every row is monotone up to λ, exact bitsets of reachable input sums when a noisy row has gaps. A
binary search over the sorted distinct latencies finds the smallest feasible λ; a second pass over
(instances, threads) breaks ties: fewer instances, then fewer threads.

The per-batch split (`policies.split`) answers the same question for a fixed pool of live instances; the
rows, the two algebras and the binary search both run on are `policies.bounds`', so a change to one is read
against the other there. Nothing here imports torch or numpy: `packrat solve` must start fast.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from packrat_daemon.wire.errors import InfeasibleError, ProfileError
from policies.bounds import Algebra, CapAlgebra, Row, algebra_for, first_feasible
from policies.planning.profile import Profile


@dataclass(frozen=True)
class Solution:
    """An optimal set of instances for one batch size, with its predicted latency (max over instances)."""

    batch: int
    latency_ms: float
    instances: tuple[tuple[int, int], ...]  # (threads, batch) pairs, largest first


class Solver:
    """Exact solver for one profile on `cores` usable cores. Reusable across batch sizes."""

    def __init__(self, profile: Profile, cores: int) -> None:
        if cores < 1:
            raise ProfileError(f"usable cores must be >= 1, got {cores}")
        self.cores = cores
        self.rows = {t: Row(t, profile.row(t)) for t in profile.threads() if t <= cores}
        if not self.rows:
            smallest = min(profile.threads()) if len(profile) else None
            raise InfeasibleError(
                f"the profile has no row for {cores} or fewer threads (smallest profiled: {smallest}); "
                "profile smaller thread counts or give more cores",
                largest_servable_batch=0,
            )
        self.latencies = sorted({lat for row in self.rows.values() for lat in row.latencies})
        self._largest: int | None = None  # largest_servable_batch, the same for every batch size

    def largest_servable_batch(self) -> int:
        if self._largest is None:
            algebra = CapAlgebra({t: row.batches[-1] for t, row in self.rows.items()})
            self._largest = _best_unbounded(algebra, self.cores, algebra.undominated(sorted(self.rows)))
        return self._largest

    def solve(self, batch: int) -> Solution:
        if batch < 1:
            raise ProfileError(f"batch must be >= 1, got {batch}")
        largest = self.largest_servable_batch()
        if batch > largest:
            raise InfeasibleError(
                f"batch {batch} cannot be served with {self.cores} cores: the profile's largest batches "
                f"carry at most {largest} inputs at once; profile larger batches or serve at most {largest}",
                largest_servable_batch=largest,
            )
        index = first_feasible(self.latencies, lambda bound: self._feasible(bound, batch))
        algebra = algebra_for(self.rows, self.latencies[index], batch)
        threads_order = algebra.undominated([t for t in sorted(self.rows) if algebra.usable(t)])
        chosen = _tie_break_unbounded(algebra, self.cores, threads_order, batch)
        sizes = algebra.sizes(chosen, batch)
        pairs = sorted(zip(chosen, sizes, strict=True), key=lambda p: (-p[0], -p[1]))
        latency = max(self.rows[t].lhat(b) for t, b in pairs)
        return Solution(batch, latency, tuple(pairs))

    # -- internals --------------------------------------------------------------------------
    def _feasible(self, bound: float, batch: int) -> bool:
        algebra = algebra_for(self.rows, bound, batch)
        threads = algebra.undominated([t for t in sorted(self.rows) if algebra.usable(t)])
        best = _best_unbounded(algebra, self.cores, threads)
        return algebra.serves(best, 1, batch)


def _best_unbounded(algebra: Algebra, cores: int, threads: Sequence[int]) -> int:
    """Join over every multiset of instances with Σ threads ≤ cores (unbounded knapsack)."""
    best = [algebra.empty] * (cores + 1)
    for used in range(1, cores + 1):
        value = best[used - 1]
        for t in threads:
            if t > used:
                break
            value = algebra.join(value, algebra.extend(best[used - t], t))
        best[used] = value
    return best[cores]


def _tie_break_unbounded(algebra: Algebra, cores: int, threads: Sequence[int], batch: int) -> list[int]:
    """Thread counts of a feasible multiset with the fewest instances, then the fewest threads.

    layer[used] joins every multiset of exactly `count` instances using exactly `used` threads.
    """
    layers = [[algebra.empty] + [algebra.none] * cores]
    for count in range(1, min(batch, cores) + 1):
        previous = layers[-1]
        layer = [algebra.none] * (cores + 1)
        for used in range(1, cores + 1):
            value = algebra.none
            for t in threads:
                if t > used:
                    break
                value = algebra.join(value, algebra.extend(previous[used - t], t))
            layer[used] = value
        layers.append(layer)
        for used in range(1, cores + 1):
            if algebra.serves(layer[used], count, batch):
                return _backtrack_unbounded(algebra, layers, used, threads, batch)
    raise AssertionError("a feasible bound always has a feasible multiset")


def _backtrack_unbounded(
    algebra: Algebra, layers: list[list[int]], used: int, threads: Sequence[int], batch: int
) -> list[int]:
    chosen: list[int] = []
    need = batch
    for count in range(len(layers) - 1, 0, -1):
        previous = layers[count - 1]
        for t in threads:
            if t > used:
                break
            step = algebra.step(previous[used - t], t, need, count - 1)
            if step is not None:
                chosen.append(t)
                used -= t
                need = step
                break
        else:
            raise AssertionError("backtracking lost the optimal path")
    return chosen


def solve(profile: Profile, cores: int, batch: int) -> Solution:
    """Convenience wrapper: the exact optimum for one batch size."""
    return Solver(profile, cores).solve(batch)
