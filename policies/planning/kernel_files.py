"""Reading the kernel's files: cpulists, single integers, and the cgroup limits on this process.

The cgroup cpuset (v2 ``cpuset.cpus.effective``, v1 ``cpuset.cpus``) restricts which CPUs may be used;
the CPU quota (v2 ``cpu.max``, v1 ``cpu.cfs_quota_us``) caps how many may run at once. Missing files
mean "no restriction"; a malformed one raises TopologyError naming it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from packrat_daemon.wire.errors import TopologyError


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
class CgroupLimits:
    cpuset: set[int] | None  # None = no cpuset restriction found
    cpuset_file: Path | None
    quota: float | None  # cores; None = no quota


def read_text(path: Path) -> str | None:
    try:
        return path.read_text()
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        return None
    except OSError as exc:
        raise TopologyError(f"Cannot read {path}: {exc}. Check its permissions.") from exc


def read_cpulist_file(path: Path) -> list[int] | None:
    text = read_text(path)
    if text is None:
        return None
    try:
        return parse_cpulist(text)
    except ValueError as exc:
        raise TopologyError(f"Malformed CPU list in {path}: {exc}. Expected a list like 0-3,8-11,14.") from exc


def read_int_file(path: Path) -> int | None:
    text = read_text(path)
    if text is None:
        return None
    try:
        return int(text.strip())
    except ValueError:
        raise TopologyError(f"Malformed {path}: expected one integer, found {text.strip()!r}.") from None


def read_cgroup_limits(root: Path, cgroup_file: Path) -> CgroupLimits:
    """Combine the v2 and v1 limits named in /proc/self/cgroup.

    Both are read: on a hybrid host the "0::" line names a unified hierarchy that carries no cpuset
    or cpu controller files, so it adds nothing, and on a pure v2 host there are no v1 lines.
    """
    text = read_text(cgroup_file)
    if text is None:
        return CgroupLimits(None, None, None)
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
    return CgroupLimits(cpuset, cpuset_file, min(quotas) if quotas else None)


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
            cpus = read_cpulist_file(file)
            # An empty cpuset.cpus means "inherit from the parent" (v2) or an unconfigured group.
            if cpus:
                return set(cpus), file
    return None


def _v2_quotas(base: Path, path: PurePosixPath) -> list[float]:
    # Every ancestor's cpu.max throttles the whole subtree, so the tightest one is the real limit.
    quotas = []
    for folder in _ancestors(base, path):
        file = folder / "cpu.max"
        text = read_text(file)
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
            quota_us = read_int_file(folder / "cpu.cfs_quota_us")
            if quota_us is None or quota_us < 0:  # -1 = no quota
                continue
            period_us = read_int_file(folder / "cpu.cfs_period_us")
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


def read_oom_kills(root: Path = Path("/"), cgroup_file: Path = Path("/proc/self/cgroup")) -> int | None:
    """How many processes the kernel's OOM killer has killed in this process's memory cgroup (the `oom_kill`
    line of v2 ``memory.events`` or v1 ``memory.oom_control``), or None where no file says (never raises:
    it only words a log line)."""
    try:
        text = read_text(cgroup_file)
        entries = [] if text is None else _parse_proc_cgroup(text, cgroup_file)
    except TopologyError:
        return None
    base = root / "sys/fs/cgroup"
    for hierarchy, controllers, path in entries:
        if hierarchy == "0" and controllers == [""]:
            folders, name = _ancestors(base, path), "memory.events"
        elif "memory" in controllers:
            folders, name = _ancestors(base / "memory", path), "memory.oom_control"
        else:
            continue
        for folder in folders:  # the deepest that has the file: this process's own cgroup
            try:
                lines = (folder / name).read_text().splitlines()
            except OSError:
                continue
            for line in lines:
                key, _, value = line.partition(" ")
                if key == "oom_kill" and value.strip().isdigit():
                    return int(value)
            break
    return None
