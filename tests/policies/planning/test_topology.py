"""Topology detection against fake sysfs/cgroup trees (real files, real parsing), and the allocator.

The kernel files' own syntax (cpulists, cgroup limits) is in test_kernel_files.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from packrat_daemon.wire.errors import TopologyError
from policies.planning.cores import CoreAllocator
from policies.planning.topology import Cpu, Topology

ALL_16 = range(16)


def write(root: Path, relative: str, text: str) -> Path:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")
    return path


def make_machine(root: Path) -> None:
    """A 2-socket machine, 4 cores per socket, SMT 2, one NUMA node per socket, numbered as Linux
    does: cpu0-3 socket 0, cpu4-7 socket 1, then their siblings cpu8-11 and cpu12-15."""
    for cpu in ALL_16:
        package = (cpu % 8) // 4
        core_id = cpu % 4
        write(root, f"sys/devices/system/cpu/cpu{cpu}/topology/core_id", str(core_id))
        write(root, f"sys/devices/system/cpu/cpu{cpu}/topology/physical_package_id", str(package))
    write(root, "sys/devices/system/cpu/online", "0-15")
    write(root, "sys/devices/system/node/node0/cpulist", "0-3,8-11")
    write(root, "sys/devices/system/node/node1/cpulist", "4-7,12-15")


def ids(topology: Topology) -> list[int]:
    return [cpu.id for cpu in topology.cpus]


# --- detection ----------------------------------------------------------------------------------


def test_whole_machine_orders_physical_cores_first_per_node(tmp_path: Path) -> None:
    make_machine(tmp_path)
    topology = Topology.detect(tmp_path, affinity=ALL_16)

    assert ids(topology) == [0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 12, 13, 14, 15]
    assert topology.logical_cpus == 16
    assert topology.usable_cores == 8  # SMT siblings are not extra cores
    assert topology.quota_cores is None
    assert topology.nodes == (0, 1)
    by_id = {cpu.id: cpu for cpu in topology.cpus}
    assert by_id[8].core == by_id[0].core  # siblings share a core
    assert by_id[4].core != by_id[0].core  # core_id 0 on another socket is another core
    assert by_id[5] == Cpu(id=5, core=by_id[5].core, package=1, node=1)
    assert topology.describe() == "8 usable cores (16 logical CPUs, SMT 2, 2 NUMA nodes, no cgroup quota)"


def test_cgroup_v2_cpuset_and_quota(tmp_path: Path) -> None:
    make_machine(tmp_path)
    write(tmp_path, "proc/self/cgroup", "0::/packrat.slice/model.service")
    service = "sys/fs/cgroup/packrat.slice/model.service"
    write(tmp_path, f"{service}/cpuset.cpus.effective", "0-2,8-10,4")
    write(tmp_path, f"{service}/cpu.max", "250000 100000")
    write(tmp_path, "sys/fs/cgroup/packrat.slice/cpu.max", "max 100000")

    topology = Topology.detect(tmp_path, affinity=ALL_16)

    assert sorted(ids(topology)) == [0, 1, 2, 4, 8, 9, 10]
    assert topology.quota_cores == 2
    assert topology.usable_cores == 2  # 4 physical cores in the cpuset, but the quota allows 2.5
    assert topology.describe() == "2 usable cores (7 logical CPUs, SMT 2, 2 NUMA nodes, cgroup quota 2.5 cores)"


def test_cgroup_v2_takes_the_tightest_ancestor_quota_and_walks_up_for_the_cpuset(tmp_path: Path) -> None:
    make_machine(tmp_path)
    write(tmp_path, "proc/self/cgroup", "0::/outer/inner")
    write(tmp_path, "sys/fs/cgroup/outer/cpuset.cpus.effective", "4-7,12-15")
    write(tmp_path, "sys/fs/cgroup/outer/cpu.max", "300000 100000")
    write(tmp_path, "sys/fs/cgroup/outer/inner/cpu.max", "max 100000")

    topology = Topology.detect(tmp_path, affinity=ALL_16)

    assert sorted(ids(topology)) == [4, 5, 6, 7, 12, 13, 14, 15]
    assert topology.nodes == (1,)
    assert topology.quota_cores == 3
    assert topology.usable_cores == 3


def test_quota_below_one_core_still_leaves_one(tmp_path: Path) -> None:
    make_machine(tmp_path)
    write(tmp_path, "proc/self/cgroup", "0::/")
    write(tmp_path, "sys/fs/cgroup/cpu.max", "50000 100000")

    topology = Topology.detect(tmp_path, affinity=ALL_16)

    assert topology.quota_cores == 0
    assert topology.usable_cores == 1


def test_cgroup_v1_cpuset_and_cfs_quota(tmp_path: Path) -> None:
    make_machine(tmp_path)
    # A hybrid host: v1 controllers plus an empty unified hierarchy that must change nothing.
    write(tmp_path, "proc/self/cgroup", "5:cpuset:/docker/abc\n3:cpu,cpuacct:/docker/abc\n2:memory:/x\n0::/")
    write(tmp_path, "sys/fs/cgroup/cpuset/docker/abc/cpuset.cpus", "4-7,12-15")
    write(tmp_path, "sys/fs/cgroup/cpu,cpuacct/docker/abc/cpu.cfs_quota_us", "300000")
    write(tmp_path, "sys/fs/cgroup/cpu,cpuacct/docker/abc/cpu.cfs_period_us", "100000")
    write(tmp_path, "sys/fs/cgroup/unified/cgroup.controllers", "")

    topology = Topology.detect(tmp_path, affinity=ALL_16)

    assert ids(topology) == [4, 5, 6, 7, 12, 13, 14, 15]
    assert topology.quota_cores == 3
    assert topology.usable_cores == 3


def test_cgroup_v1_cpu_folder_no_quota_and_namespaced_path(tmp_path: Path) -> None:
    make_machine(tmp_path)
    # Inside a container the host path is shown, but the container's own group is the mount root.
    write(tmp_path, "proc/self/cgroup", "3:cpuset:/docker/abc\n1:cpu:/docker/abc")
    write(tmp_path, "sys/fs/cgroup/cpuset/cpuset.cpus", "0-3")
    write(tmp_path, "sys/fs/cgroup/cpu/cpu.cfs_quota_us", "-1")
    write(tmp_path, "sys/fs/cgroup/cpu/cpu.cfs_period_us", "100000")

    topology = Topology.detect(tmp_path, affinity=ALL_16)

    assert ids(topology) == [0, 1, 2, 3]
    assert topology.quota_cores is None
    assert topology.usable_cores == 4


def test_cgroup_v1_quota_in_plain_cpu_folder(tmp_path: Path) -> None:
    make_machine(tmp_path)
    write(tmp_path, "proc/self/cgroup", "1:cpu,cpuacct:/job")
    write(tmp_path, "sys/fs/cgroup/cpu/job/cpu.cfs_quota_us", "150000")
    write(tmp_path, "sys/fs/cgroup/cpu/job/cpu.cfs_period_us", "50000")

    assert Topology.detect(tmp_path, affinity=ALL_16).quota_cores == 3


def test_affinity_intersects_cpuset(tmp_path: Path) -> None:
    make_machine(tmp_path)
    write(tmp_path, "proc/self/cgroup", "0::/")
    write(tmp_path, "sys/fs/cgroup/cpuset.cpus.effective", "0-3,8-11")

    topology = Topology.detect(tmp_path, affinity=[0, 1, 4, 8, 9])

    assert ids(topology) == [0, 1, 8, 9]
    assert topology.usable_cores == 2


def test_offline_cpus_are_not_usable(tmp_path: Path) -> None:
    make_machine(tmp_path)
    write(tmp_path, "sys/devices/system/cpu/online", "0-7")

    assert Topology.detect(tmp_path, affinity=ALL_16).logical_cpus == 8


def test_no_common_cpu_says_what_to_do(tmp_path: Path) -> None:
    make_machine(tmp_path)
    write(tmp_path, "proc/self/cgroup", "0::/")
    write(tmp_path, "sys/fs/cgroup/cpuset.cpus.effective", "0-3")

    with pytest.raises(TopologyError, match=r"No usable CPU.*affinity mask 4-5.*cpuset 0-3.*taskset"):
        Topology.detect(tmp_path, affinity=[4, 5])


def test_missing_topology_files_make_each_cpu_its_own_core(tmp_path: Path) -> None:
    topology = Topology.detect(tmp_path, affinity=[0, 1, 2])

    assert ids(topology) == [0, 1, 2]
    assert len({cpu.core for cpu in topology.cpus}) == 3
    assert {(cpu.package, cpu.node) for cpu in topology.cpus} == {(0, 0)}
    assert topology.usable_cores == 3
    assert topology.quota_cores is None


def test_cgroup_file_argument_overrides_proc(tmp_path: Path) -> None:
    make_machine(tmp_path)
    cgroup_file = write(tmp_path, "elsewhere/cgroup", "0::/a")
    write(tmp_path, "sys/fs/cgroup/a/cpu.max", "200000 100000")

    assert Topology.detect(tmp_path, affinity=ALL_16, cgroup_file=cgroup_file).quota_cores == 2


@pytest.mark.parametrize(
    ("relative", "text", "expected"),
    [
        ("sys/fs/cgroup/g/cpuset.cpus.effective", "0-3,x", "cpuset.cpus.effective"),
        ("sys/devices/system/node/node1/cpulist", "4-", "node1/cpulist"),
        ("sys/devices/system/cpu/online", "all", "cpu/online"),
        ("sys/fs/cgroup/g/cpu.max", "lots 100000", "cpu.max"),
        ("sys/fs/cgroup/g/cpu.max", "0 100000", "cpu.max"),
        ("sys/devices/system/cpu/cpu3/topology/core_id", "three", "core_id"),
        ("proc/self/cgroup", "garbage", "proc/self/cgroup"),
    ],
)
def test_malformed_file_names_the_file(tmp_path: Path, relative: str, text: str, expected: str) -> None:
    make_machine(tmp_path)
    write(tmp_path, "proc/self/cgroup", "0::/g")
    write(tmp_path, relative, text)

    with pytest.raises(TopologyError, match=expected) as raised:
        Topology.detect(tmp_path, affinity=ALL_16)
    assert str(tmp_path) in str(raised.value)


def test_real_machine_has_a_usable_core() -> None:
    topology = Topology.detect()

    assert topology.usable_cores >= 1
    assert topology.logical_cpus >= 1
    assert {cpu.id for cpu in topology.cpus} <= os.sched_getaffinity(0)
    assert "usable core" in topology.describe()


# --- synthetic ----------------------------------------------------------------------------------


def test_synthetic_numbers_siblings_like_linux() -> None:
    topology = Topology.synthetic(cores=8, smt=2, nodes=2)

    assert ids(topology) == [0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 12, 13, 14, 15]
    by_id = {cpu.id: cpu for cpu in topology.cpus}
    assert all(by_id[cpu].core == by_id[cpu + 8].core for cpu in range(8))
    assert topology.usable_cores == 8
    assert topology.nodes == (0, 1)
    assert topology.describe() == "8 usable cores (16 logical CPUs, SMT 2, 2 NUMA nodes, no cgroup quota)"
    assert Topology.synthetic(1).describe() == "1 usable core (1 logical CPU, SMT 1, 1 NUMA node, no cgroup quota)"


def test_synthetic_matches_the_detected_machine(tmp_path: Path) -> None:
    make_machine(tmp_path)
    detected = Topology.detect(tmp_path, affinity=ALL_16)
    synthetic = Topology.synthetic(cores=8, smt=2, nodes=2)

    assert [(c.id, c.node, c.package) for c in detected.cpus] == [(c.id, c.node, c.package) for c in synthetic.cpus]


def test_quota_caps_usable_cores_and_shows_in_describe() -> None:
    topology = Topology(cpus=Topology.synthetic(8).cpus, quota_cores=8)

    assert topology.usable_cores == 8
    assert topology.describe().endswith("cgroup quota 8.0 cores)")
    assert Topology(cpus=Topology.synthetic(8).cpus, quota_cores=3).usable_cores == 3


@pytest.mark.parametrize(("cores", "smt", "nodes"), [(0, 1, 1), (4, 0, 1), (4, 1, 0), (2, 1, 3)])
def test_synthetic_rejects_impossible_machines(cores: int, smt: int, nodes: int) -> None:
    with pytest.raises(ValueError):
        Topology.synthetic(cores, smt, nodes)


def test_allocator_uses_detected_topology(tmp_path: Path) -> None:
    make_machine(tmp_path)
    write(tmp_path, "proc/self/cgroup", "0::/")
    write(tmp_path, "sys/fs/cgroup/cpuset.cpus.effective", "0-1,4-5,8-9,12-13")
    topology = Topology.detect(tmp_path, affinity=ALL_16)

    first, second = CoreAllocator(topology).allocate([2, 2])

    assert sorted(first) == [0, 1]
    assert sorted(second) == [4, 5]
