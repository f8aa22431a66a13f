"""Core allocation: disjoint CPU sets per instance, physical cores before siblings, one NUMA node each."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packrat_daemon.wire.errors import TopologyError
from policies.planning.cores import CoreAllocator
from policies.planning.topology import Topology


def ids(topology: Topology) -> list[int]:
    return [cpu.id for cpu in topology.cpus]


def cores_of(topology: Topology, cpus: Sequence[int]) -> list[int]:
    by_id = {cpu.id: cpu for cpu in topology.cpus}
    return [by_id[cpu].core for cpu in cpus]


def nodes_of(topology: Topology, cpus: Sequence[int]) -> set[int]:
    by_id = {cpu.id: cpu for cpu in topology.cpus}
    return {by_id[cpu].node for cpu in cpus}


def test_allocation_is_disjoint_sized_and_in_input_order() -> None:
    topology = Topology.synthetic(cores=8, smt=2, nodes=2)
    sets = CoreAllocator(topology).allocate([1, 4, 2, 0, 3])

    assert [len(s) for s in sets] == [1, 4, 2, 0, 3]
    flat = [cpu for s in sets for cpu in s]
    assert len(flat) == len(set(flat))


def test_physical_cores_before_siblings() -> None:
    topology = Topology.synthetic(cores=4, smt=2)
    sets = CoreAllocator(topology).allocate([2, 2])

    used = cores_of(topology, [cpu for s in sets for cpu in s])
    assert len(set(used)) == 4  # no instance shares a core while a core sits idle


def test_siblings_only_when_physical_cores_run_out() -> None:
    topology = Topology.synthetic(cores=4, smt=2)
    big, small = CoreAllocator(topology).allocate([4, 2])

    assert sorted(big) == [0, 1, 2, 3]
    assert sorted(small) == [4, 5]


def test_instances_stay_inside_one_numa_node() -> None:
    topology = Topology.synthetic(cores=8, smt=2, nodes=2)
    sets = CoreAllocator(topology).allocate([2, 4, 2])

    assert all(len(nodes_of(topology, s)) == 1 for s in sets)
    assert nodes_of(topology, sets[1]) != nodes_of(topology, sets[0])
    # Best fit: the two small instances share the node the big one did not take.
    assert nodes_of(topology, sets[0]) == nodes_of(topology, sets[2])


def test_instance_too_big_for_a_node_spills_onto_physical_cores() -> None:
    topology = Topology.synthetic(cores=8, smt=2, nodes=2)
    big, small = CoreAllocator(topology).allocate([6, 2])

    assert len(set(cores_of(topology, big))) == 6
    assert nodes_of(topology, small) == {1}
    assert len(set(cores_of(topology, big + small))) == 8


def test_plan_beyond_physical_cores_uses_siblings_within_the_node() -> None:
    topology = Topology.synthetic(cores=8, smt=2, nodes=2)
    sets = CoreAllocator(topology).allocate([4, 4, 4, 4])

    assert all(len(nodes_of(topology, s)) == 1 for s in sets)
    assert all(len(set(cores_of(topology, s))) == 4 for s in sets)


def test_single_instance_uses_every_physical_core_before_stacking_siblings() -> None:
    topology = Topology.synthetic(cores=10, smt=3, nodes=2)
    (cpus,) = CoreAllocator(topology).allocate([12])

    # One node has 15 CPUs but only 5 cores; spreading over both nodes gives the instance 10 cores.
    assert len(set(cores_of(topology, cpus))) == 10


def test_allocation_is_deterministic() -> None:
    topology = Topology.synthetic(cores=8, smt=2, nodes=2)

    assert CoreAllocator(topology).allocate([3, 1, 5]) == CoreAllocator(topology).allocate([3, 1, 5])


def test_over_allocation_says_how_many_cores() -> None:
    allocator = CoreAllocator(Topology.synthetic(cores=8, smt=2, nodes=2))

    with pytest.raises(TopologyError, match="needs 17 cores but only 16 are usable"):
        allocator.allocate([8, 9])


def test_oversubscribed_gives_everyone_everything() -> None:
    topology = Topology.synthetic(cores=4, smt=2)
    sets = CoreAllocator(topology).allocate_oversubscribed([1, 1, 1])

    assert sets == [tuple(ids(topology))] * 3


@st.composite
def machines_and_plans(draw: st.DrawFn) -> tuple[Topology, list[int]]:
    nodes = draw(st.integers(1, 4))
    cores = nodes * draw(st.integers(1, 6)) + draw(st.integers(0, nodes - 1))
    machine = Topology.synthetic(cores, smt=draw(st.integers(1, 3)), nodes=nodes)
    # A cpuset or affinity mask can cut any CPU out, leaving cores with fewer siblings than others.
    keep = draw(st.lists(st.booleans(), min_size=machine.logical_cpus, max_size=machine.logical_cpus))
    cpus = tuple(cpu for cpu, kept in zip(machine.cpus, keep, strict=True) if kept) or machine.cpus[:1]
    topology = Topology(cpus=cpus, quota_cores=None)
    counts = draw(st.lists(st.integers(0, topology.logical_cpus), max_size=12))
    # Keep the plan feasible: trim from the end until it fits.
    while sum(counts) > topology.logical_cpus:
        counts[-1] -= min(counts[-1], sum(counts) - topology.logical_cpus)
        if counts[-1] == 0:
            counts.pop()
    return topology, counts


@settings(max_examples=300, deadline=None)
@given(machines_and_plans())
def test_allocation_properties(case: tuple[Topology, list[int]]) -> None:
    topology, counts = case
    sets = CoreAllocator(topology).allocate(counts)

    assert [len(s) for s in sets] == counts
    flat = [cpu for s in sets for cpu in s]
    assert len(flat) == len(set(flat))
    assert set(flat) <= set(ids(topology))
    # Every physical core is used before any sibling: siblings appear only when the plan needs more
    # threads than there are physical cores.
    physical = len({cpu.core for cpu in topology.cpus})
    assert len(set(cores_of(topology, flat))) == min(sum(counts), physical)
