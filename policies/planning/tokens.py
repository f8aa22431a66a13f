"""Planning by tokens: the predicted cost of a slice of sequences, and the cut of a batch of them by cost.

A batch of a text model's requests is padded, slice by slice, to the slice's longest sequence, so a slice of `rows`
sequences `length` long costs what `rows × length` padded tokens cost. The profile is measured at one length (the
model's longest, `reference`); a slice at another is predicted by the rule the 16-core length tables were made by
(docs/design.md, "Planning by tokens", and `packrat_daemon.wire.length_cost`, which the emulated workers share):
L(threads, rows, length) ≈ L(threads, rows · length / reference).

Sorted by length, a batch's rows are cut into contiguous slices, the longest to the instances of most threads,
so that the slowest slice is as fast as it can be (`cut_by_cost`): a long sequence and four short ones are not
"five samples". The layout a batch runs on is chosen by the same cost (`split_by_cost`, for
`policies.planning.layouts.fastest`): counted at the profile's length, two short queries look like two long ones
and win a split over one big instance that their real cost does not.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from packrat_daemon.wire.length_cost import equivalent_batch, interpolate
from policies.planning.layouts import Split
from policies.planning.profile import Profile

Cost = Callable[[int, int, int], "float | None"]  # (threads, rows, padded length) -> predicted ms


def token_latency(profile: Profile, threads: int, rows: int, length: int, reference: int) -> float | None:
    """The predicted ms of `rows` sequences padded to `length` on a `threads`-thread instance, from `profile`
    measured at `reference` tokens; None where the profile has no row for `threads` or the tokens pass its largest
    batch."""
    row = profile.row(threads)
    if not row or rows <= 0:
        return None if not row else 0.0
    return interpolate(row, equivalent_batch(rows, length, reference))


def cut_by_cost(lengths: Sequence[int], threads: Sequence[int], cost: Cost) -> list[int]:
    """Rows for each instance (in the order of `threads`) of a batch whose rows, sorted by length, are `lengths`:
    contiguous runs, the longest to the instances of most threads, cut so that the slowest run's predicted cost
    is least (bisection on that cost, each instance in turn taking every row that fits). Where the cost cannot
    be predicted, the rows are cut in proportion to the threads."""
    total = len(lengths)
    if len(threads) <= 1 or total == 0:
        return [total] + [0] * (len(threads) - 1)
    order = sorted(range(len(threads)), key=lambda k: threads[k])  # fewest threads first: they take the shortest
    whole = cost(threads[order[-1]], total, lengths[-1])
    if whole is None:
        return _proportional(threads, total)
    low, high = 0.0, whole
    best = _greedy(lengths, [threads[k] for k in order], cost, high)
    assert best is not None  # the biggest instance alone takes every row within `whole`
    for _ in range(24):
        middle = (low + high) / 2
        sizes = _greedy(lengths, [threads[k] for k in order], cost, middle)
        if sizes is None:
            low = middle
        else:
            high, best = middle, sizes
    rows = [0] * len(threads)
    for position, k in enumerate(order):
        rows[k] = best[position]
    return rows


def split_by_cost(lengths: Sequence[int], threads: Sequence[int], cost: Cost) -> Split | None:
    """`cut_by_cost`'s rows for each instance with the cut's predicted latency (its slowest slice's); None where a
    slice's cost cannot be predicted."""
    rows = cut_by_cost(lengths, threads, cost)
    start, slowest = 0, 0.0
    for k in sorted(range(len(threads)), key=lambda k: threads[k]):  # the order the cut takes the rows in
        if rows[k]:
            predicted = cost(threads[k], rows[k], lengths[start + rows[k] - 1])
            if predicted is None:
                return None
            slowest = max(slowest, predicted)
        start += rows[k]
    return Split(slowest, rows)


def _greedy(lengths: Sequence[int], threads: Sequence[int], cost: Cost, bound: float) -> list[int] | None:
    """Each instance in turn takes the longest run of the next rows it computes within `bound`; None if rows are
    left over. The last instance takes the longest rows, so it is checked from the end: every instance before it
    takes what fits, the last what is left."""
    sizes = []
    start, total = 0, len(lengths)
    for position, count in enumerate(threads):
        if position == len(threads) - 1:
            left = total - start
            if left and ((predicted := cost(count, left, lengths[-1])) is None or predicted > bound):
                return None
            sizes.append(left)
            return sizes
        taken = 0
        while start + taken < total:
            predicted = cost(count, taken + 1, lengths[start + taken])
            if predicted is None or predicted > bound:
                break
            taken += 1
        sizes.append(taken)
        start += taken
    return sizes


def _proportional(threads: Sequence[int], total: int) -> list[int]:
    whole = sum(threads)
    sizes = [total * t // whole for t in threads]
    for k in range(total - sum(sizes)):
        sizes[k % len(sizes)] += 1
    return sizes
