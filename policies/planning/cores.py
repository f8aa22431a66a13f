"""Core allocation: each serving instance gets its own disjoint set of logical CPUs."""

from __future__ import annotations

from collections.abc import Sequence

from packrat_daemon.wire.errors import TopologyError
from policies.planning.topology import Topology, ordered_cpus


class CoreAllocator:
    """Hands each instance its own disjoint set of logical CPUs.

    Distinct physical cores come before SMT siblings, and an instance stays inside one NUMA node
    when that costs it no physical core (see `_take` for the exact order of preference). The result is
    a pure function of the topology and the thread counts, so a replanned pool lands where the
    previous identical plan did.
    """

    def __init__(self, topology: Topology) -> None:
        self.topology = topology
        # Re-sorted so that a Topology built by hand in any order still fills cores before siblings.
        self._cpus = ordered_cpus(topology.cpus)
        if len({cpu.id for cpu in self._cpus}) != len(self._cpus):
            raise TopologyError(f"Topology lists a logical CPU twice: {[cpu.id for cpu in self._cpus]}")
        # Rank of each CPU inside its core: 0 for the first thread of a core, 1 for its sibling, ...
        self._rank: dict[int, int] = {}
        seen: dict[int, int] = {}
        for cpu in self._cpus:
            self._rank[cpu.id] = seen.get(cpu.core, 0)
            seen[cpu.core] = self._rank[cpu.id] + 1

    def allocate(self, thread_counts: Sequence[int]) -> list[tuple[int, ...]]:
        """One tuple of logical CPU ids per instance, disjoint, in the order of `thread_counts`.

        Each tuple lists physical-core CPUs before SMT siblings. Raises TopologyError when the plan
        needs more CPUs than are usable.
        """
        _check_counts(thread_counts)
        needed = sum(thread_counts)
        available = self.topology.logical_cpus
        if needed > available:
            raise TopologyError(
                f"The plan needs {needed} cores but only {available} are usable "
                f"({self.topology.describe()}). Plan fewer threads, or give the process more CPUs "
                f"(affinity mask, cgroup cpuset)."
            )
        # Free CPUs per node, in topology order: physical cores first, then siblings.
        free: dict[int, list[int]] = {node: [] for node in self.topology.nodes}
        for cpu in self._cpus:
            free[cpu.node].append(cpu.id)

        result: list[tuple[int, ...]] = [() for _ in thread_counts]
        # Largest first: big instances have the fewest nodes they fit in, small ones fill the gaps.
        for index in sorted(range(len(thread_counts)), key=lambda k: (-thread_counts[k], k)):
            result[index] = self._take(free, thread_counts[index])
        return result

    def allocate_oversubscribed(self, thread_counts: Sequence[int]) -> list[tuple[int, ...]]:
        """Every instance gets the whole usable CPU set, for policies that oversubscribe on purpose
        (TorchServe's default) and leave the scheduling to the kernel."""
        _check_counts(thread_counts)
        everything = tuple(cpu.id for cpu in self._cpus)
        return [everything for _ in thread_counts]

    def _take(self, free: dict[int, list[int]], count: int) -> tuple[int, ...]:
        """Take `count` CPUs for one instance, in order of preference:

        1. whole free cores inside one node (best fit, so big holes stay for later instances);
        2. whole free cores spread over the fewest nodes: a sibling on a busy core costs a thread
           far more than remote memory does (weights are shared from the template's node anyway);
        3. siblings are unavoidable: one node, if every whole core left lies in it (best fit);
        4. every whole core left, wherever it is, then siblings spread over the fewest nodes.

        Every node's free list is consumed from its front, and it is ordered first-thread-of-core
        before siblings, so a free first thread always marks a core none of whose CPUs is taken.
        """
        if count == 0:
            return ()
        whole = {node: self._free_whole_cores(cpus) for node, cpus in free.items()}
        node = _best_fit(whole, count)
        if node is not None:
            return tuple(_take_front(free, node, count))
        if sum(whole.values()) >= count:
            return tuple(self._spread(free, whole, count))
        # Staying local must not cost the instance a physical core it could have had elsewhere.
        whole_total = sum(whole.values())
        fits = [node for node in free if whole[node] == whole_total and len(free[node]) >= count]
        if fits:
            node = min(fits, key=lambda n: (len(free[n]), n))
            return tuple(_take_front(free, node, count))
        taken = [cpu for node in sorted(free) for cpu in _take_front(free, node, whole[node])]
        rest = {node: len(cpus) for node, cpus in free.items()}
        return tuple(taken + self._spread(free, rest, count - len(taken)))

    def _free_whole_cores(self, cpus: list[int]) -> int:
        return sum(1 for cpu in cpus if self._rank[cpu] == 0)

    @staticmethod
    def _spread(free: dict[int, list[int]], capacity: dict[int, int], count: int) -> list[int]:
        """Take `count` CPUs from the fronts of the nodes' lists, at most capacity[node] from each,
        touching few nodes: the rest goes to the best-fitting node, else the roomiest one is emptied."""
        capacity = dict(capacity)
        taken: list[int] = []
        while count > 0:
            node = _best_fit(capacity, count)
            if node is None:
                node = max(capacity, key=lambda n: (capacity[n], -n))
            share = min(count, capacity[node])
            taken += _take_front(free, node, share)
            capacity[node] -= share
            count -= share
        return taken


def _best_fit(capacity: dict[int, int], count: int) -> int | None:
    """The node with the least room that still holds `count`, lowest id on ties; None if none does."""
    fits = [node for node, room in capacity.items() if room >= count]
    return min(fits, key=lambda node: (capacity[node], node)) if fits else None


def _take_front(free: dict[int, list[int]], node: int, count: int) -> list[int]:
    taken = free[node][:count]
    del free[node][:count]
    return taken


def _check_counts(thread_counts: Sequence[int]) -> None:
    for count in thread_counts:
        if count < 0:
            raise ValueError(f"thread counts must be >= 0, got {list(thread_counts)}")
