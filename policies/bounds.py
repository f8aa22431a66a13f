"""What a latency bound λ allows, shared by the solver (`policies.solver`) and the per-batch split
(`policies.split`): each thread count's profiled row, the two algebras their recurrences run over, and
the binary search for the smallest feasible bound.

For a bound λ an instance with t threads may take any batch in S_λ(t) = ⋃ {(b_{j-1}, b_j] : L(t, b_j) ≤ λ}.
When the row is monotone up to λ that set is a prefix [1, cap_λ(t)] (`CapAlgebra`: sums of caps); a noisy,
non-monotone row makes it a union of intervals (`BitsetAlgebra`: the exact reachable input totals as
bitsets), which stays exact. `algebra_for` picks the one a bound needs. Nothing here imports torch or numpy.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence

Interval = tuple[int, int]  # inclusive [low, high] range of batch sizes


class Row:
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


# -- the two algebras the recurrences run over --------------------------------------------------
# A "value" summarises every selection of instances reaching a DP state. With monotone rows it is the
# largest Σ cap (any total in [instances, Σ cap] is reachable). With noisy rows it is the exact set of
# reachable input totals, as a Python int used as a bitset.

_NONE = -1  # cap algebra: state unreachable


class CapAlgebra:
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
        return balanced([self.caps[t] for t in chosen], batch)


class BitsetAlgebra:
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
            out |= smear(value << low, high - low + 1)
        return out & self.mask

    @staticmethod
    def join(a: int, b: int) -> int:
        return a | b

    @staticmethod
    def serves(value: int, instances: int, batch: int) -> bool:
        return bool((value >> batch) & 1)

    def step(self, previous: int, threads: int, need: int, remaining: int) -> int | None:
        """As CapAlgebra.step, over the exact reachable totals."""
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


Algebra = CapAlgebra | BitsetAlgebra


def algebra_for(rows: dict[int, Row], bound: float, batch: int) -> Algebra:
    """Sums of caps when every row is monotone up to `bound`, exact bitsets otherwise."""
    caps: dict[int, int] = {}
    monotone = True
    for t, row in rows.items():
        cap, is_prefix = row.prefix_cap(bound)
        caps[t] = min(cap, batch)
        monotone = monotone and is_prefix
    if monotone:
        return CapAlgebra(caps)
    return BitsetAlgebra({t: row.intervals(bound, batch) for t, row in rows.items()}, batch)


def smear(bits: int, width: int) -> int:
    """OR of bits << s for s in [0, width): all totals reachable by adding 0..width-1."""
    covered = 1
    while covered < width:
        step = min(covered, width - covered)
        bits |= bits << step
        covered += step
    return bits


def first_feasible(values: Sequence[float], feasible: Callable[[float], bool]) -> int:
    """The index of the smallest of the ascending `values` that is feasible (the largest one always is)."""
    low, high = 0, len(values) - 1
    while low < high:
        middle = (low + high) // 2
        if feasible(values[middle]):
            high = middle
        else:
            low = middle + 1
    return low


def balanced(caps: Sequence[int], batch: int) -> list[int]:
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
