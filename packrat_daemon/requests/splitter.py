"""Which live workers take a batch, and how many rows each: the layout and the exact split, cached.

The dispatcher asks it for every batch; `packrat simulate` runs the same code on a virtual clock.
"""

from __future__ import annotations

from collections.abc import Sequence

from packrat_daemon.fleet.pool import WorkerHandle
from policies.planning.layouts import Split, fastest, split_on
from policies.planning.profile import Profile
from policies.planning.tokens import cut_by_cost, split_by_cost, token_latency


class Splitter:
    """Which live workers take a batch, and how many rows each: exact, cached, per batch size.

    A plan may keep several layouts of the same cores warm (say one 2-thread worker and two 1-thread
    workers); each batch goes to the complete layout that policies.planning.layouts.fastest picks,
    with the packrat policy's `min_split_gain` applied per batch.
    """

    def __init__(
        self,
        profile: Profile | None,
        mode: str,
        layouts: Sequence[Sequence[tuple[int, tuple[int, ...]]]] = (),
        oversubscribed: bool = False,
        min_split_gain: float = 0.0,
    ) -> None:
        self.profile = profile
        self.mode = mode
        self.layouts = [list(layout) for layout in layouts]
        self.oversubscribed = oversubscribed
        self.min_split_gain = min_split_gain
        self._cache: dict[tuple[tuple[int, ...], int], Split] = {}
        # choose()'s answers for the last `workers` sequence, by batch size. The daemon passes a new list
        # whenever its pool changes (and never edits one in place), so the list's identity is the key.
        self._chosen_for: Sequence[WorkerHandle] | None = None
        self._chosen: dict[int, list[tuple[WorkerHandle, int]]] = {}

    def choose(self, workers: Sequence[WorkerHandle], batch: int) -> list[tuple[WorkerHandle, int]]:
        """The workers that take a batch of `batch` inputs, with their rows. `workers` must be a new
        sequence whenever the pool changes: answers are remembered per sequence object."""
        if workers is self._chosen_for:
            known = self._chosen.get(batch)
            if known is not None:
                return known
        else:
            self._chosen_for, self._chosen = workers, {}
        chosen = self._choose(workers, batch)
        self._chosen[batch] = chosen
        return chosen

    def _candidates(self, workers: Sequence[WorkerHandle]) -> list[list[WorkerHandle]]:
        """The plan's layouts whose every slot a ready worker fills."""
        candidates = [members for layout in self.layouts if (members := _match(layout, workers))]
        if not candidates:
            # Mid-reconfiguration no layout may be complete: use ready workers whose cores do not overlap.
            candidates = [list(workers) if self.oversubscribed else _disjoint(workers)]
        return candidates

    def _choose(self, workers: Sequence[WorkerHandle], batch: int) -> list[tuple[WorkerHandle, int]]:
        candidates = self._candidates(workers)
        splits = [self._split(tuple(w.threads for w in members), batch) for members in candidates]
        chosen = fastest(splits, self.min_split_gain)
        members, sizes = candidates[chosen], splits[chosen].rows
        return [(worker, rows) for worker, rows in zip(members, sizes, strict=True) if rows]

    def _split(self, threads: tuple[int, ...], batch: int) -> Split:
        key = (threads, batch)
        if key not in self._cache:
            self._cache[key] = self._compute(list(threads), batch)
        return self._cache[key]

    def predicted_ms(self, threads: int, rows: int, length: int = 0, reference: int = 0) -> float | None:
        """The profile's latency of `rows` inputs on a `threads`-thread worker (the smallest profiled batch
        that holds them); None without a profile or a row for those threads. `length`: the rows' padded length
        along a free axis, the profile's being `reference` (policies.planning.tokens)."""
        if self.profile is None:
            return None
        if length and reference and length != reference:
            return token_latency(self.profile, threads, rows, length, reference)
        return self.profile.lhat(threads, rows)

    def choose_by_cost(
        self, workers: Sequence[WorkerHandle], lengths: Sequence[int], reference: int
    ) -> list[tuple[WorkerHandle, int]]:
        """The workers that take a batch of `len(lengths)` rows, sorted by length, with their rows: each complete
        layout's rows cut by predicted cost (policies.planning.tokens.split_by_cost), and the layout whose cut is
        fastest by that cost (`fastest`, `min_split_gain` applied); `reference`: the profile's length. Without a
        profile, the layout the count chooses, cut by padded tokens over threads."""
        if self.profile is None:
            chosen = self.choose(workers, len(lengths))
            members = [worker for worker, _ in chosen]
            sizes = cut_by_cost(lengths, [w.threads for w in members], lambda t, rows, n: rows * n / t)
            return [(worker, rows) for worker, rows in zip(members, sizes, strict=True) if rows]
        profile = self.profile

        def cost(count: int, rows: int, length: int) -> float | None:
            return token_latency(profile, count, rows, length, reference)

        candidates = self._candidates(workers)
        splits = [split_by_cost(lengths, [w.threads for w in members], cost) for members in candidates]
        scored = [(members, split) for members, split in zip(candidates, splits, strict=True) if split is not None]
        if not scored:  # no layout's cost can be predicted (a batch past the profile): the count decides
            return self.choose(workers, len(lengths))
        best = fastest([split for _, split in scored], self.min_split_gain)
        members, sizes = scored[best][0], scored[best][1].rows
        return [(worker, rows) for worker, rows in zip(members, sizes, strict=True) if rows]

    def _compute(self, threads: list[int], batch: int) -> Split:
        if self.mode == "exact" and self.profile is not None:
            split = split_on(self.profile, threads, batch)
            if split is not None:
                return split
            # The profile does not cover this pool or batch: fall back to proportional.
        weights = threads if self.mode == "exact" else [1] * len(threads)
        return Split(float("inf"), _proportional(weights, batch))


def _match(layout: Sequence[tuple[int, tuple[int, ...]]], workers: Sequence[WorkerHandle]) -> list[WorkerHandle]:
    """Ready workers filling every slot of `layout`, or [] when one is missing."""
    free = [w for w in workers if w.pending is None]
    members = []
    for threads, cores in layout:
        found = next((w for w in free if w.threads == threads and w.cores == cores), None)
        if found is None:
            return []
        free.remove(found)
        members.append(found)
    return members


def _disjoint(workers: Sequence[WorkerHandle]) -> list[WorkerHandle]:
    taken: set[int] = set()
    chosen = []
    for worker in sorted(workers, key=lambda w: (-w.threads, w.id)):
        if taken.isdisjoint(worker.cores):
            chosen.append(worker)
            taken.update(worker.cores)
    return chosen


def _proportional(weights: Sequence[int], batch: int) -> list[int]:
    total = sum(weights)
    sizes = [batch * w // total for w in weights]
    for k in range(batch - sum(sizes)):
        sizes[k % len(sizes)] += 1
    return sizes
