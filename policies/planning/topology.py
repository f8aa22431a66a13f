"""CPU topology: which logical CPUs this process may use, and how they group into cores and NUMA nodes.

Usable CPUs are the process affinity mask ∩ the cgroup cpuset (v2 ``cpuset.cpus.effective`` or v1
``cpuset.cpus``) ∩ the online CPUs; the cgroup CPU quota (v2 ``cpu.max``, v1 ``cpu.cfs_quota_us``)
caps how many of them may run at once. Everything is read from plain files under a root folder, so
tests run the real parsing code against fake sysfs/cgroup trees.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from packrat_daemon.wire.errors import TopologyError
from policies.planning.kernel_files import (
    CgroupLimits,
    parse_cpulist,
    read_cgroup_limits,
    read_cpulist_file,
    read_int_file,
)

__all__ = ["Cpu", "Topology", "format_cpulist", "ordered_cpus", "parse_cpulist"]

# Core keys must be unique across packages; core_id is only unique inside one package.
_CORE_KEY_STRIDE = 10000

_NODE_DIR = re.compile(r"node(\d+)")


@dataclass(frozen=True)
class Cpu:
    """One logical CPU and where it sits."""

    id: int  # logical CPU number, as the kernel numbers it
    core: int  # physical core key, unique across packages (package * 10000 + core_id)
    package: int
    node: int  # NUMA node (0 when unknown)


@dataclass(frozen=True)
class Topology:
    """The logical CPUs this process may use, and the cgroup CPU quota that caps them."""

    # Ordered per NUMA node: first one CPU of each physical core, then the SMT siblings, so that
    # taking CPUs from the front spreads work over physical cores before doubling up on one.
    cpus: tuple[Cpu, ...]
    quota_cores: int | None  # floor of the cgroup CPU quota in cores (None = no quota)
    # The exact quota in cores (e.g. 2.5), kept only to show the user; quota_cores is what counts.
    quota: float | None = None

    @property
    def usable_cores(self) -> int:
        """How many threads, over all instances, we may run at once.

        One per physical core among the usable CPUs: an SMT sibling shares its core's execution
        units, so for compute-bound inference it adds little throughput and a lot of interference,
        and counting it as a core would make the solver oversubscribe. Capped by the cgroup quota,
        since threads beyond it are throttled rather than run. At least 1, so that a quota below one
        core still serves (slowly) instead of refusing to start.
        """
        cores = len({cpu.core for cpu in self.cpus})
        if self.quota_cores is not None:
            cores = min(cores, self.quota_cores)
        return max(1, cores)

    @property
    def logical_cpus(self) -> int:
        return len(self.cpus)

    @property
    def nodes(self) -> tuple[int, ...]:
        return tuple(sorted({cpu.node for cpu in self.cpus}))

    @property
    def smt(self) -> int:
        """The most logical CPUs any one usable physical core has (1 = no SMT in use)."""
        per_core: dict[int, int] = {}
        for cpu in self.cpus:
            per_core[cpu.core] = per_core.get(cpu.core, 0) + 1
        return max(per_core.values(), default=1)

    @classmethod
    def detect(
        cls,
        root: str | os.PathLike[str] = "/",
        affinity: Iterable[int] | None = None,
        cgroup_file: str | os.PathLike[str] | None = None,
    ) -> Topology:
        """Read the usable CPUs and their layout from sysfs, procfs and the cgroup filesystem.

        `root` prefixes every path read (tests pass a temporary folder); `affinity` defaults to this
        process's affinity mask; `cgroup_file` defaults to ``<root>/proc/self/cgroup``.
        Missing files mean "no restriction"; a malformed file raises TopologyError naming it.
        """
        root_path = Path(root)
        if affinity is None:
            affinity = os.sched_getaffinity(0)
        affinity_set = set(affinity)
        cgroup_path = Path(cgroup_file) if cgroup_file is not None else root_path / "proc/self/cgroup"
        limits = read_cgroup_limits(root_path, cgroup_path)

        usable = set(affinity_set)
        if limits.cpuset is not None:
            usable &= limits.cpuset
        online = read_cpulist_file(root_path / "sys/devices/system/cpu/online")
        if online is not None:
            usable &= set(online)
        if not usable:
            raise TopologyError(_no_cpu_message(affinity_set, limits, online))

        cpus = _read_cpus(root_path, sorted(usable))
        quota_cores = math.floor(limits.quota) if limits.quota is not None else None
        return cls(cpus=ordered_cpus(cpus), quota_cores=quota_cores, quota=limits.quota)

    @classmethod
    def synthetic(cls, cores: int, smt: int = 1, nodes: int = 1) -> Topology:
        """A made-up machine for the simulator and tests.

        `cores` physical cores with `smt` threads each, split as evenly as possible across `nodes`
        NUMA nodes (one package per node). CPU ids are numbered as Linux does: the first thread of
        every core is 0..cores-1, and the k-th sibling of core c is c + k * cores.
        """
        if cores < 1 or smt < 1 or nodes < 1:
            raise ValueError(f"synthetic topology needs cores, smt, nodes >= 1 (got {cores}, {smt}, {nodes})")
        if nodes > cores:
            raise ValueError(f"cannot split {cores} cores across {nodes} NUMA nodes")
        base, extra = divmod(cores, nodes)
        cpus: list[Cpu] = []
        first_core = 0
        for node in range(nodes):
            count = base + (1 if node < extra else 0)
            for core_id in range(count):
                core = first_core + core_id
                for thread in range(smt):
                    cpus.append(Cpu(core + thread * cores, node * _CORE_KEY_STRIDE + core_id, node, node))
            first_core += count
        return cls(cpus=ordered_cpus(cpus), quota_cores=None)

    @property
    def cpu_ids(self) -> tuple[int, ...]:
        """The usable logical CPUs' ids, in topology order."""
        return tuple(cpu.id for cpu in self.cpus)

    def physical_cores(self) -> tuple[tuple[int, ...], ...]:
        """Each physical core's usable CPU ids (its first thread, then its siblings), cores in topology order:
        what a coordinator hands out, so that an SMT sibling never lands in another model's share."""
        by_core: dict[int, list[int]] = {}
        for cpu in self.cpus:
            by_core.setdefault(cpu.core, []).append(cpu.id)
        return tuple(tuple(ids) for ids in by_core.values())

    def restricted(self, cpu_ids: Iterable[int]) -> Topology:
        """This machine on `cpu_ids` only: the share of it one model may use while others use the rest
        (docs/colocation.md). The cgroup quota still caps it. Raises TopologyError for an empty set or for a
        CPU that is not usable here, naming the usable ones."""
        wanted = set(cpu_ids)
        if not wanted:
            raise TopologyError(
                f"An empty CPU set leaves no core to serve on; give at least one of the usable CPUs "
                f"{format_cpulist(self.cpu_ids)}."
            )
        unknown = wanted - set(self.cpu_ids)
        if unknown:
            raise TopologyError(
                f"CPU(s) {format_cpulist(unknown)} are not usable here: this process may use "
                f"{format_cpulist(self.cpu_ids)} ({self.describe()}). Give a subset of those (the affinity mask, "
                "the cgroup cpuset and the online CPUs decide which)."
            )
        return Topology(tuple(cpu for cpu in self.cpus if cpu.id in wanted), self.quota_cores, self.quota)

    def share(self, cpulist: str | None) -> Topology:
        """`restricted` to a cpulist as `--cpus` gives it ("0-3,8"); None: all of this topology."""
        if cpulist is None:
            return self
        try:
            cpus = parse_cpulist(cpulist)
        except ValueError as exc:
            raise TopologyError(f"--cpus {cpulist!r}: {exc}; give a cpulist like 0-7 or 0,2,4") from None
        try:
            return self.restricted(cpus)
        except TopologyError as exc:
            raise TopologyError(f"--cpus {cpulist}: {exc}") from None

    def describe(self) -> str:
        """One human line, e.g.
        '8 usable cores (16 logical CPUs, SMT 2, 1 NUMA node, cgroup quota 8.0 cores)'."""
        usable = self.usable_cores
        node_count = len(self.nodes)
        parts = [
            f"{self.logical_cpus} logical CPU{'s' if self.logical_cpus != 1 else ''}",
            f"SMT {self.smt}",
            f"{node_count} NUMA node{'s' if node_count != 1 else ''}",
        ]
        if self.quota is not None:
            parts.append(f"cgroup quota {self.quota:.1f} cores")
        elif self.quota_cores is not None:
            parts.append(f"cgroup quota {float(self.quota_cores):.1f} cores")
        else:
            parts.append("no cgroup quota")
        return f"{usable} usable core{'s' if usable != 1 else ''} ({', '.join(parts)})"


def ordered_cpus(cpus: Iterable[Cpu]) -> tuple[Cpu, ...]:
    """Per NUMA node: one CPU of each physical core (lowest id first), then the second thread of
    each core, and so on."""
    by_core: dict[int, list[Cpu]] = {}
    for cpu in sorted(cpus, key=lambda c: c.id):
        by_core.setdefault(cpu.core, []).append(cpu)
    # A core's node is the node of its first CPU; sysfs never splits a core across nodes.
    ranked = [
        (siblings[0].node, rank, siblings[0].id, cpu)
        for siblings in by_core.values()
        for rank, cpu in enumerate(siblings)
    ]
    ranked.sort(key=lambda item: item[:3])
    return tuple(item[3] for item in ranked)


# --- reading the files ------------------------------------------------------------------------


def _read_cpus(root: Path, usable: Sequence[int]) -> list[Cpu]:
    cpu_base = root / "sys/devices/system/cpu"
    node_of = _read_nodes(root / "sys/devices/system/node")
    cpus = []
    for cpu_id in usable:
        topology = cpu_base / f"cpu{cpu_id}" / "topology"
        core_id = read_int_file(topology / "core_id")
        package = read_int_file(topology / "physical_package_id")
        package = 0 if package is None else package
        # Without topology files each CPU counts as its own core; a negative key cannot collide
        # with a real package * 10000 + core_id.
        core = -1 - cpu_id if core_id is None else package * _CORE_KEY_STRIDE + core_id
        cpus.append(Cpu(cpu_id, core, package, node_of.get(cpu_id, 0)))
    return cpus


def _read_nodes(node_base: Path) -> dict[int, int]:
    try:
        entries = sorted(os.listdir(node_base))
    except (FileNotFoundError, NotADirectoryError):
        return {}
    node_of: dict[int, int] = {}
    for entry in entries:
        match = _NODE_DIR.fullmatch(entry)
        if match is None:
            continue
        for cpu in read_cpulist_file(node_base / entry / "cpulist") or []:
            node_of.setdefault(cpu, int(match.group(1)))
    return node_of


def _no_cpu_message(affinity: set[int], limits: CgroupLimits, online: list[int] | None) -> str:
    parts = [f"affinity mask {format_cpulist(affinity)}"]
    if limits.cpuset is not None:
        parts.append(f"cgroup cpuset {format_cpulist(limits.cpuset)} (from {limits.cpuset_file})")
    if online is not None:
        parts.append(f"online CPUs {format_cpulist(online)}")
    return (
        f"No usable CPU: {', '.join(parts)} have no CPU in common. Start Packrat with an affinity mask "
        f"(taskset -c) that overlaps the container's or unit's cpuset (--cpuset-cpus, AllowedCPUs=)."
    )


def format_cpulist(cpus: Iterable[int]) -> str:
    """The compact cpulist form of a set of CPU ids ("0-3,8"): what `parse_cpulist` reads."""
    ordered = sorted(set(cpus))
    if not ordered:
        return "(none)"
    ranges: list[str] = []
    start = prev = ordered[0]
    for cpu in [*ordered[1:], None]:
        if cpu is not None and cpu == prev + 1:
            prev = cpu
            continue
        ranges.append(str(start) if start == prev else f"{start}-{prev}")
        if cpu is not None:
            start = prev = cpu
    return ",".join(ranges)
