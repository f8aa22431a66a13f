"""CPU topology: which logical CPUs this process may use, how they group into cores and NUMA nodes,
and an allocator that gives each serving instance its own disjoint set of them.

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
from pathlib import Path, PurePosixPath

from packrat_daemon.wire.errors import TopologyError

# Core keys must be unique across packages; core_id is only unique inside one package.
_CORE_KEY_STRIDE = 10000

_NODE_DIR = re.compile(r"node(\d+)")


def parse_cpulist(text: str) -> list[int]:
    """Parse the kernel's cpulist syntax ("0-3,8-11,14") into sorted, distinct CPU ids.

    An empty (or blank) list gives []. Raises ValueError on anything else that is not a cpulist.
    """
    cpus: set[int] = set()
    stripped = text.strip()
    if not stripped:
        return []
    for part in stripped.split(","):
        part = part.strip()
        match = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if match is None:
            raise ValueError(f"{part!r} is not a CPU number or a range like 0-3 (in cpulist {text.strip()!r})")
        first = int(match.group(1))
        last = int(match.group(2)) if match.group(2) is not None else first
        if last < first:
            raise ValueError(f"range {part!r} runs backwards (in cpulist {text.strip()!r})")
        cpus.update(range(first, last + 1))
    return sorted(cpus)


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
        limits = _read_cgroup_limits(root_path, cgroup_path)

        usable = set(affinity_set)
        if limits.cpuset is not None:
            usable &= limits.cpuset
        online = _read_cpulist_file(root_path / "sys/devices/system/cpu/online")
        if online is not None:
            usable &= set(online)
        if not usable:
            raise TopologyError(_no_cpu_message(affinity_set, limits, online))

        cpus = _read_cpus(root_path, sorted(usable))
        quota_cores = math.floor(limits.quota) if limits.quota is not None else None
        return cls(cpus=_ordered(cpus), quota_cores=quota_cores, quota=limits.quota)

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
        return cls(cpus=_ordered(cpus), quota_cores=None)

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
        self._cpus = _ordered(topology.cpus)
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


def _ordered(cpus: Iterable[Cpu]) -> tuple[Cpu, ...]:
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


@dataclass(frozen=True)
class _CgroupLimits:
    cpuset: set[int] | None  # None = no cpuset restriction found
    cpuset_file: Path | None
    quota: float | None  # cores; None = no quota


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text()
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        return None
    except OSError as exc:
        raise TopologyError(f"Cannot read {path}: {exc}. Check its permissions.") from exc


def _read_cpulist_file(path: Path) -> list[int] | None:
    text = _read_text(path)
    if text is None:
        return None
    try:
        return parse_cpulist(text)
    except ValueError as exc:
        raise TopologyError(f"Malformed CPU list in {path}: {exc}. Expected a list like 0-3,8-11,14.") from exc


def _read_int_file(path: Path) -> int | None:
    text = _read_text(path)
    if text is None:
        return None
    try:
        return int(text.strip())
    except ValueError:
        raise TopologyError(f"Malformed {path}: expected one integer, found {text.strip()!r}.") from None


def _read_cgroup_limits(root: Path, cgroup_file: Path) -> _CgroupLimits:
    """Combine the v2 and v1 limits named in /proc/self/cgroup.

    Both are read: on a hybrid host the "0::" line names a unified hierarchy that carries no cpuset
    or cpu controller files, so it adds nothing, and on a pure v2 host there are no v1 lines.
    """
    text = _read_text(cgroup_file)
    if text is None:
        return _CgroupLimits(None, None, None)
    base = root / "sys/fs/cgroup"
    cpuset: set[int] | None = None
    cpuset_file: Path | None = None
    quotas: list[float] = []
    for hierarchy, controllers, path in _parse_proc_cgroup(text, cgroup_file):
        if hierarchy == "0" and controllers == [""]:
            found = _nearest_cpulist(base, path, ("cpuset.cpus.effective",))
            quotas.extend(_v2_quotas(base, path))
        elif "cpuset" in controllers:
            found = _nearest_cpulist(base / "cpuset", path, ("cpuset.effective_cpus", "cpuset.cpus"))
        else:
            found = None
        if "cpu" in controllers:
            quotas.extend(_v1_quotas(base, ",".join(controllers), path))
        if found is not None:
            cpus, file = found
            cpuset = cpus if cpuset is None else cpuset & cpus
            cpuset_file = file
    return _CgroupLimits(cpuset, cpuset_file, min(quotas) if quotas else None)


def _parse_proc_cgroup(text: str, path: Path) -> list[tuple[str, list[str], PurePosixPath]]:
    entries = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        fields = line.split(":", 2)
        if len(fields) != 3 or not fields[0].isdigit() or not fields[2].startswith("/"):
            raise TopologyError(
                f"Malformed line {number} of {path}: {line!r}; expected 'ID:CONTROLLERS:/PATH' "
                f"(for example '0::/system.slice')."
            )
        entries.append((fields[0], fields[1].split(","), PurePosixPath(fields[2])))
    return entries


def _ancestors(base: Path, path: PurePosixPath) -> list[Path]:
    """`base/path`, then each parent folder up to `base` itself, deepest first.

    Walking up also finds the right files inside a container whose own cgroup is mounted at `base`
    while /proc/self/cgroup still shows its path on the host.
    """
    parts = [part for part in path.parts if part not in ("/", "", ".", "..")]
    return [base.joinpath(*parts[:depth]) for depth in range(len(parts), -1, -1)]


def _nearest_cpulist(base: Path, path: PurePosixPath, names: Sequence[str]) -> tuple[set[int], Path] | None:
    # The deepest cgroup that has the file wins: the kernel keeps a child's cpuset inside its parent's.
    for folder in _ancestors(base, path):
        for name in names:
            file = folder / name
            cpus = _read_cpulist_file(file)
            # An empty cpuset.cpus means "inherit from the parent" (v2) or an unconfigured group.
            if cpus:
                return set(cpus), file
    return None


def _v2_quotas(base: Path, path: PurePosixPath) -> list[float]:
    # Every ancestor's cpu.max throttles the whole subtree, so the tightest one is the real limit.
    quotas = []
    for folder in _ancestors(base, path):
        file = folder / "cpu.max"
        text = _read_text(file)
        if text is not None:
            quota = _parse_cpu_max(text, file)
            if quota is not None:
                quotas.append(quota)
    return quotas


def _parse_cpu_max(text: str, file: Path) -> float | None:
    fields = text.split()
    try:
        if len(fields) in (1, 2) and fields[0] == "max":
            return None
        if len(fields) == 2:
            quota, period = int(fields[0]), int(fields[1])
            if quota > 0 and period > 0:
                return quota / period
    except ValueError:
        pass
    raise TopologyError(
        f"Malformed {file}: {text.strip()!r}; expected 'max PERIOD' or 'QUOTA PERIOD' in microseconds "
        f"(for example '200000 100000')."
    )


def _v1_quotas(base: Path, controllers: str, path: PurePosixPath) -> list[float]:
    # The hierarchy's folder is named after its controllers ("cpu,cpuacct"), often with a "cpu" link.
    quotas: list[float] = []
    for mount in dict.fromkeys((controllers, "cpu,cpuacct", "cpu")):
        for folder in _ancestors(base / mount, path):
            quota_us = _read_int_file(folder / "cpu.cfs_quota_us")
            if quota_us is None or quota_us < 0:  # -1 = no quota
                continue
            period_us = _read_int_file(folder / "cpu.cfs_period_us")
            if period_us is None:
                period_us = 100000  # the kernel's default period
            if quota_us == 0 or period_us <= 0:
                raise TopologyError(
                    f"Malformed {folder}/cpu.cfs_quota_us or cpu.cfs_period_us: quota {quota_us}, "
                    f"period {period_us}; both must be positive (quota -1 = no limit)."
                )
            quotas.append(quota_us / period_us)
        if quotas:
            # Found the hierarchy; the other names are links to the same folder.
            break
    return quotas


def _read_cpus(root: Path, usable: Sequence[int]) -> list[Cpu]:
    cpu_base = root / "sys/devices/system/cpu"
    node_of = _read_nodes(root / "sys/devices/system/node")
    cpus = []
    for cpu_id in usable:
        topology = cpu_base / f"cpu{cpu_id}" / "topology"
        core_id = _read_int_file(topology / "core_id")
        package = _read_int_file(topology / "physical_package_id")
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
        for cpu in _read_cpulist_file(node_base / entry / "cpulist") or []:
            node_of.setdefault(cpu, int(match.group(1)))
    return node_of


def _no_cpu_message(affinity: set[int], limits: _CgroupLimits, online: list[int] | None) -> str:
    parts = [f"affinity mask {_format_cpus(affinity)}"]
    if limits.cpuset is not None:
        parts.append(f"cgroup cpuset {_format_cpus(limits.cpuset)} (from {limits.cpuset_file})")
    if online is not None:
        parts.append(f"online CPUs {_format_cpus(online)}")
    return (
        f"No usable CPU: {', '.join(parts)} have no CPU in common. Start Packrat with an affinity mask "
        f"(taskset -c) that overlaps the container's or unit's cpuset (--cpuset-cpus, AllowedCPUs=)."
    )


def _format_cpus(cpus: Iterable[int]) -> str:
    """The compact cpulist form of a set of CPU ids ("0-3,8")."""
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
