"""The exact per-batch split: a fixed pool of live instances, each usable once (and allowed to stay idle),
takes one batch at the smallest predicted latency.

The same question as the solver's (`policies.solver`) for a pool the daemon already runs, answered the same
way (`policies.bounds`): a binary search over the profile's latencies for the smallest feasible bound, then
a bounded knapsack over the pool's members that breaks ties (fewest busy instances, then fewest busy threads,
then earliest in pool order). Nothing here imports torch or numpy.
"""

from __future__ import annotations

from collections.abc import Sequence

from packrat_daemon.wire.errors import InfeasibleError, ProfileError
from policies.bounds import Algebra, Row, algebra_for, first_feasible
from policies.planning.profile import Profile


def split_batch(profile: Profile, pool_threads: Sequence[int], batch: int) -> tuple[float, list[int]]:
    """Split `batch` inputs across live instances with the given thread counts, exactly.

    Returns (predicted latency, inputs per instance in pool order; 0 means the instance stays idle).
    Ties: fewest busy instances, then fewest busy threads, then earliest in pool order.
    Raises InfeasibleError when the pool's profiled rows cannot carry the batch.
    """
    if batch < 1:
        raise ProfileError(f"batch must be >= 1, got {batch}")
    rows = {t: Row(t, profile.row(t)) for t in set(pool_threads) if profile.row(t)}
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
        algebra = algebra_for(rows, bound, batch)
        value = algebra.empty
        for k in members:
            value = algebra.join(value, algebra.extend(value, pool_threads[k]))
        return algebra.serves(value, 1, batch)

    algebra = algebra_for(rows, latencies[first_feasible(latencies, feasible)], batch)
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
