"""The exact ⟨instances, threads, batch⟩ solver and the exact per-batch split.

The question: choose instances (t_k, b_k) with Σ t_k ≤ T, Σ b_k = B, b_k ≥ 1, minimising
max_k L̂(t_k, b_k), where L̂(t, b) is the latency of the smallest profiled batch b' ≥ b for t.

Method: for a latency bound λ an instance with t threads may take any batch in
S_λ(t) = ⋃ {(b_{j-1}, b_j] : L(t, b_j) ≤ λ}. When the row is monotone up to λ that set is a prefix
[1, cap_λ(t)] and feasibility is an unbounded knapsack "max Σ cap over Σ t ≤ T ≥ B". A noisy,
non-monotone row makes S_λ(t) a union of intervals; then the same recurrences run over bitsets of
reachable input sums, which stays exact. A binary search over the sorted distinct latencies finds the
smallest feasible λ; a second pass over (instances, threads) breaks ties: fewer instances, then fewer
threads.

The per-batch split answers the same question for a fixed pool of live instances, each usable once
(and allowed to stay idle). Nothing here imports torch or numpy: `packrat solve` must start fast.

This module is over 400 lines because it is one algorithm: the solver and the split share the rows,
the two algebras, the binary search and the backtracking step, and a change to one must be read
against the others.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from packrat_daemon.wire.errors import InfeasibleError, ProfileError
from policies.planning.profile import Profile

Interval = tuple[int, int]  # inclusive [low, high] range of batch sizes


@dataclass(frozen=True)
class Solution:
    """An optimal set of instances for one batch size, with its predicted latency (max over instances)."""

    batch: int
    latency_ms: float
    instances: tuple[tuple[int, int], ...]  # (threads, batch) pairs, largest first


class _Row:
    """One thread count's latencies, preprocessed so S_λ(t) is found with one bisection."""

    def __init__(self, threads: int, row: Sequence[tuple[int, float]]) -> None:
        self.threads = threads
        self.batches = [b for b, _ in row]
        self.latencies = [lat for _, lat in row]
        running = float("-inf")
        self.prefix_max: list[float] = []
        for lat in self.latencies:
            running = max(running, lat)
            self.prefix_max.append(running)
        running = float("inf")
        suffix_min = [0.0] * len(self.latencies)
        for j in range(len(self.latencies) - 1, -1, -1):
            running = min(running, self.latencies[j])
            suffix_min[j] = running
        self.suffix_min = suffix_min

    def prefix_cap(self, bound: float) -> tuple[int, bool]:
        """(cap, is_prefix): the largest batch of the monotone prefix under `bound`, and whether the
        allowed set is exactly [1, cap] (no isolated cheaper cell further along a noisy row)."""
        k = bisect.bisect_right(self.prefix_max, bound)
        cap = self.batches[k - 1] if k else 0
        is_prefix = k == len(self.latencies) or self.suffix_min[k] > bound
        return cap, is_prefix

    def lhat(self, batch: int) -> float:
        """L̂(t, batch): the latency of the smallest profiled batch that holds `batch` inputs."""
        return self.latencies[bisect.bisect_left(self.batches, batch)]

    def intervals(self, bound: float, limit: int) -> list[Interval]:
        """S_bound(t) ∩ [1, limit] as merged inclusive intervals."""
        result: list[Interval] = []
        previous = 0
        for batch, lat in zip(self.batches, self.latencies, strict=True):
            low, high = previous + 1, min(batch, limit)
            previous = batch
            if lat > bound or low > high:
                continue
            if result and result[-1][1] == low - 1:
                result[-1] = (result[-1][0], high)
            else:
                result.append((low, high))
        return result


# -- the two algebras the recurrences run over ---------------------------------------------------
# A "value" summarises every selection of instances reaching a DP state. With monotone rows it is the
# largest Σ cap (any total in [instances, Σ cap] is reachable). With noisy rows it is the exact set of
# reachable input totals, as a Python int used as a bitset.

_NONE = -1  # cap algebra: state unreachable


class _CapAlgebra:
    empty = 0
    none = _NONE

    def __init__(self, caps: dict[int, int]) -> None:
        self.caps = caps

    def usable(self, threads: int) -> bool:
        return self.caps[threads] > 0

    def undominated(self, threads: Sequence[int]) -> list[int]:
        """The ascending `threads` whose cap beats every smaller count's. A multiset of instances with a
        dominated count (some smaller count carries as much) swaps it for that one: as many instances,
        fewer threads, at least the same inputs. So no optimum, nor any tie-break, needs it, and the
        knapsacks over up to 128 thread counts run over the few that set a new cap."""
        kept: list[int] = []
        for t in threads:
            if not kept or self.caps[t] > self.caps[kept[-1]]:
                kept.append(t)
        return kept

    def extend(self, value: int, threads: int) -> int:
        return _NONE if value == _NONE else value + self.caps[threads]

    @staticmethod
    def join(a: int, b: int) -> int:
        return a if a >= b else b

    @staticmethod
    def serves(value: int, instances: int, batch: int) -> bool:
        return value != _NONE and instances <= batch <= value

    def step(self, previous: int, threads: int, need: int, remaining: int) -> int | None:
        """The input total still needed from `remaining` instances if one `threads` instance joins
        `previous`, or None when that cannot reach `need`."""
        if previous == _NONE:
            return None
        # This instance takes 1..cap inputs; the others need at least one each and their caps must
        # carry the rest. Sizes are balanced afterwards, so only feasibility is tracked here.
        rest = max(need - self.caps[threads], remaining)
        return rest if remaining <= need - 1 and rest <= previous else None

    def sizes(self, chosen: Sequence[int], batch: int) -> list[int]:
        return _balanced([self.caps[t] for t in chosen], batch)


class _BitsetAlgebra:
    empty = 1  # only the total 0 is reachable with no instance
    none = 0

    def __init__(self, allowed: dict[int, list[Interval]], batch: int) -> None:
        self.allowed = allowed
        self.mask = (1 << (batch + 1)) - 1

    def usable(self, threads: int) -> bool:
        return bool(self.allowed[threads])

    @staticmethod
    def undominated(threads: Sequence[int]) -> list[int]:
        """All of them: with gaps in the rows, a larger count may carry totals a smaller one cannot."""
        return list(threads)

    def extend(self, value: int, threads: int) -> int:
        if not value:
            return 0
        out = 0
        for low, high in self.allowed[threads]:
            out |= _smear(value << low, high - low + 1)
        return out & self.mask

    @staticmethod
    def join(a: int, b: int) -> int:
        return a | b

    @staticmethod
    def serves(value: int, instances: int, batch: int) -> bool:
        return bool((value >> batch) & 1)

    def step(self, previous: int, threads: int, need: int, remaining: int) -> int | None:
        """As _CapAlgebra.step, over the exact reachable totals."""
        for low, high in self.allowed[threads]:
            for size in range(min(high, need), low - 1, -1):
                if (previous >> (need - size)) & 1:
                    return need - size
        return None

    def sizes(self, chosen: Sequence[int], batch: int) -> list[int]:
        """Input counts for the chosen instances: each in its allowed set, summing to batch."""
        # Reachable totals of the first k chosen instances, then walk back to pick each size.
        prefixes = [self.empty]
        for t in chosen:
            prefixes.append(self.extend(prefixes[-1], t))
        sizes: list[int] = []
        need = batch
        for k in range(len(chosen) - 1, -1, -1):
            after = self.step(prefixes[k], chosen[k], need, k)
            assert after is not None
            sizes.append(need - after)
            need = after
        sizes.reverse()
        return sizes


Algebra = _CapAlgebra | _BitsetAlgebra


def _algebra_for(rows: dict[int, _Row], bound: float, batch: int) -> Algebra:
    """Sums of caps when every row is monotone up to `bound`, exact bitsets otherwise."""
    caps: dict[int, int] = {}
    monotone = True
    for t, row in rows.items():
        cap, is_prefix = row.prefix_cap(bound)
        caps[t] = min(cap, batch)
        monotone = monotone and is_prefix
    if monotone:
        return _CapAlgebra(caps)
    return _BitsetAlgebra({t: row.intervals(bound, batch) for t, row in rows.items()}, batch)


def _smear(bits: int, width: int) -> int:
    """OR of bits << s for s in [0, width): all totals reachable by adding 0..width-1."""
    covered = 1
    while covered < width:
        step = min(covered, width - covered)
        bits |= bits << step
        covered += step
    return bits


# -- the solver ----------------------------------------------------------------------------------
class Solver:
    """Exact solver for one profile on `cores` usable cores. Reusable across batch sizes."""

    def __init__(self, profile: Profile, cores: int) -> None:
        if cores < 1:
            raise ProfileError(f"usable cores must be >= 1, got {cores}")
        self.cores = cores
        self.rows = {t: _Row(t, profile.row(t)) for t in profile.threads() if t <= cores}
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
            algebra = _CapAlgebra({t: row.batches[-1] for t, row in self.rows.items()})
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
        index = _first_feasible(self.latencies, lambda bound: self._feasible(bound, batch))
        algebra = _algebra_for(self.rows, self.latencies[index], batch)
        threads_order = algebra.undominated([t for t in sorted(self.rows) if algebra.usable(t)])
        chosen = _tie_break_unbounded(algebra, self.cores, threads_order, batch)
        sizes = algebra.sizes(chosen, batch)
        pairs = sorted(zip(chosen, sizes, strict=True), key=lambda p: (-p[0], -p[1]))
        latency = max(self.rows[t].lhat(b) for t, b in pairs)
        return Solution(batch, latency, tuple(pairs))

    # -- internals --------------------------------------------------------------------------
    def _feasible(self, bound: float, batch: int) -> bool:
        algebra = _algebra_for(self.rows, bound, batch)
        threads = algebra.undominated([t for t in sorted(self.rows) if algebra.usable(t)])
        best = _best_unbounded(algebra, self.cores, threads)
        return algebra.serves(best, 1, batch)


def _first_feasible(values: Sequence[float], feasible: Callable[[float], bool]) -> int:
    low, high = 0, len(values) - 1
    while low < high:
        middle = (low + high) // 2
        if feasible(values[middle]):
            high = middle
        else:
            low = middle + 1
    return low


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


def _balanced(caps: Sequence[int], batch: int) -> list[int]:
    """Split `batch` inputs as evenly as the caps allow (each instance gets 1..cap)."""
    remaining = batch - len(caps)
    # Water-filling: raise the lowest level until the inputs run out; O(n log B) via bisection.
    low, high = 1, max(caps)
    while low < high:
        level = (low + high + 1) // 2
        if sum(min(cap, level) for cap in caps) - len(caps) <= remaining:
            low = level
        else:
            high = level - 1
    sizes = [min(cap, low) for cap in caps]
    remaining = batch - sum(sizes)
    for k, cap in enumerate(caps):
        if remaining == 0:
            break
        if sizes[k] < cap:
            sizes[k] += 1
            remaining -= 1
    assert remaining == 0, "caps cannot carry the batch"
    return sizes


# -- the per-batch split over a fixed pool -------------------------------------------------------
def split_batch(profile: Profile, pool_threads: Sequence[int], batch: int) -> tuple[float, list[int]]:
    """Split `batch` inputs across live instances with the given thread counts, exactly.

    Returns (predicted latency, inputs per instance in pool order; 0 means the instance stays idle).
    Ties: fewest busy instances, then fewest busy threads, then earliest in pool order.
    Raises InfeasibleError when the pool's profiled rows cannot carry the batch.
    """
    if batch < 1:
        raise ProfileError(f"batch must be >= 1, got {batch}")
    rows = {t: _Row(t, profile.row(t)) for t in set(pool_threads) if profile.row(t)}
    largest = sum(rows[t].batches[-1] for t in pool_threads if t in rows)
    if batch > largest:
        raise InfeasibleError(
            f"the pool {list(pool_threads)} can carry at most {largest} inputs under its profile; "
            f"batch {batch} is too large",
            largest_servable_batch=largest,
        )
    members = [k for k, t in enumerate(pool_threads) if t in rows]
    split = [0] * len(pool_threads)
    if len(members) == 1:  # one instance takes the whole batch: what the search below ends with, without it
        split[members[0]] = batch
        return rows[pool_threads[members[0]]].lhat(batch), split
    latencies = sorted({lat for row in rows.values() for lat in row.latencies})

    def feasible(bound: float) -> bool:
        algebra = _algebra_for(rows, bound, batch)
        value = algebra.empty
        for k in members:
            value = algebra.join(value, algebra.extend(value, pool_threads[k]))
        return algebra.serves(value, 1, batch)

    algebra = _algebra_for(rows, latencies[_first_feasible(latencies, feasible)], batch)
    chosen = _tie_break_bounded(algebra, [(k, pool_threads[k]) for k in members], batch)
    sizes = algebra.sizes([pool_threads[k] for k in chosen], batch)
    for k, size in zip(chosen, sizes, strict=True):
        split[k] = size
    latency = max(rows[pool_threads[k]].lhat(size) for k, size in enumerate(split) if size)
    return latency, split


def _tie_break_bounded(algebra: Algebra, members: Sequence[tuple[int, int]], batch: int) -> list[int]:
    """Pool indices of a feasible subset with the fewest instances, then the fewest threads.

    table[i][(count, used)]: join over subsets of the first i members with `count` members and `used`
    threads. Only reachable states are kept: a pool has few distinct thread counts, so few of the
    (count, used) pairs occur, and the daemon's adaptation splits thousands of batches per look. Members
    are visited in pool order so ties go to earlier instances.
    """
    limit = min(batch, len(members))
    table: list[dict[tuple[int, int], int]] = [{(0, 0): algebra.empty}]
    for _, t in members:
        previous = table[-1]
        current = dict(previous)
        for (count, used), value in previous.items():
            if count < limit:
                extended = algebra.extend(value, t)
                if extended != algebra.none:  # none is join's identity: an absent state is unreachable
                    key = (count + 1, used + t)
                    current[key] = algebra.join(current.get(key, algebra.none), extended)
        table.append(current)
    for count, used in sorted(table[-1]):
        if count and algebra.serves(table[-1][(count, used)], count, batch):
            return _backtrack_bounded(algebra, table, members, count, used, batch)
    raise AssertionError("a feasible bound always has a feasible subset")


def _backtrack_bounded(
    algebra: Algebra,
    table: list[dict[tuple[int, int], int]],
    members: Sequence[tuple[int, int]],
    count: int,
    used: int,
    batch: int,
) -> list[int]:
    chosen: list[int] = []
    need = batch
    for i in range(len(members), 0, -1):
        if count == 0:
            break
        index, t = members[i - 1]
        previous = table[i - 1]
        # Prefer leaving this (later) member out, so ties keep earlier instances busy.
        if algebra.serves(previous.get((count, used), algebra.none), count, need):
            continue
        if used >= t:
            step = algebra.step(previous.get((count - 1, used - t), algebra.none), t, need, count - 1)
            if step is not None:
                chosen.append(index)
                count, used, need = count - 1, used - t, step
                continue
        raise AssertionError("backtracking lost the optimal path")
    chosen.reverse()
    return chosen


def solve(profile: Profile, cores: int, batch: int) -> Solution:
    """Convenience wrapper: the exact optimum for one batch size."""
    return Solver(profile, cores).solve(batch)
