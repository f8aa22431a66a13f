"""The machine's cores as shares: whole cores in contiguous runs, and the order in which daemons are told
their new shares so that no CPU is ever held by two models (shrink before grow)."""

from __future__ import annotations

import pytest

from packrat_daemon.coordinate.shares import CoordinateError, cores_of, divide, even_split, move_order
from packrat_daemon.wire.errors import ConfigError, TopologyError
from policies.planning.topology import Cpu, Topology


def test_an_even_split_gives_the_remainder_to_the_first_models() -> None:
    assert even_split(16, 2) == (8, 8)
    assert even_split(10, 3) == (4, 3, 3)
    with pytest.raises(ConfigError, match="3 models cannot each have a core of their own on 2"):
        even_split(2, 3)
    with pytest.raises(ConfigError, match="--daemon NAME=CONTROL"):
        even_split(4, 0)


def test_shares_are_whole_cores_in_contiguous_runs() -> None:
    # 4 cores with SMT 2: CPU c and c + 4 are one core's two threads; a share never splits a core.
    topology = Topology.synthetic(4, smt=2)
    cores = cores_of(topology)
    assert cores == ((0, 4), (1, 5), (2, 6), (3, 7))
    assert divide(cores, (3, 1)) == ((0, 1, 2, 4, 5, 6), (3, 7))
    # Moving one core from the first model to the second shifts one boundary only.
    assert divide(cores, (2, 2)) == ((0, 1, 4, 5), (2, 3, 6, 7))
    with pytest.raises(CoordinateError, match="needs each model to have a core and 5 cores in all; 4 are usable"):
        divide(cores, (4, 1))


def test_the_cgroup_quota_caps_the_cores_handed_out() -> None:
    topology = Topology(tuple(Cpu(k, k, 0, 0) for k in range(8)), quota_cores=6, quota=6.5)
    assert len(cores_of(topology)) == 6


def test_a_share_is_a_subset_of_the_usable_cpus() -> None:
    machine = Topology.synthetic(4)
    assert machine.restricted([2, 3]).usable_cores == 2
    assert machine.share("1-2").cpu_ids == (1, 2)
    with pytest.raises(TopologyError, match=r"CPU\(s\) 7 are not usable here: this process may use 0-3"):
        machine.restricted([3, 7])
    with pytest.raises(TopologyError, match="empty CPU set"):
        machine.restricted([])


def F(*cpus: int) -> frozenset[int]:
    return frozenset(cpus)


def test_the_model_that_shrinks_is_told_before_the_one_that_grows() -> None:
    held = {"a": F(0, 1), "b": F(2, 3)}
    # b gives up CPU 2 to a: b first, whatever order the models are listed in.
    assert move_order(held, {"a": F(0, 1, 2), "b": F(3)}) == ["b", "a"]
    assert move_order({"b": held["b"], "a": held["a"]}, {"a": F(0, 1, 2), "b": F(3)}) == ["b", "a"]
    # Nothing changes: nobody is told.
    assert move_order(held, dict(held)) == []


def test_a_boundary_shift_across_three_models_is_ordered_down_the_line() -> None:
    held = {"a": F(0, 1, 2, 3), "b": F(4, 5, 6, 7), "c": F(8, 9, 10, 11)}
    # 4,4,4 → 3,4,5: b moves left (it gains 3, freed by a, and gives 7 to c).
    target = {"a": F(0, 1, 2), "b": F(3, 4, 5, 6), "c": F(7, 8, 9, 10, 11)}
    assert move_order(held, target) == ["a", "b", "c"]


def test_daemons_started_on_every_cpu_all_shrink_first() -> None:
    everything = F(0, 1, 2, 3)
    assert move_order({"a": everything, "b": everything}, {"a": F(0, 1), "b": F(2, 3)}) == ["a", "b"]


def test_a_model_that_is_not_moved_still_holds_its_cpus() -> None:
    # c is down and keeps 4-5 reserved: a may not grow onto them even though c is not being told anything.
    held = {"a": F(0, 1), "b": F(2, 3), "c": F(4, 5)}
    with pytest.raises(CoordinateError, match="no model can be moved first"):
        move_order(held, {"a": F(0, 1, 4)})


def test_two_models_that_each_wait_for_the_other_are_refused() -> None:
    with pytest.raises(CoordinateError, match=r"a \(to 1\), b \(to 0\) each wait for CPUs another holds"):
        move_order({"a": F(0), "b": F(1)}, {"a": F(1), "b": F(0)})
