"""Reading the kernel's files on real files: the cpulist syntax, single integers, and the cgroup limits
(v2, v1 and a hybrid host) read straight from /proc/self/cgroup and the cgroup folders it names."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from packrat_daemon.wire.errors import TopologyError
from policies.planning.kernel_files import (
    CgroupLimits,
    parse_cpulist,
    read_cgroup_limits,
    read_cpulist_file,
    read_int_file,
    read_oom_kills,
    read_text,
)


def write(root: Path, relative: str, text: str) -> Path:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")
    return path


def limits(root: Path) -> CgroupLimits:
    return read_cgroup_limits(root, root / "proc/self/cgroup")


# --- parse_cpulist ------------------------------------------------------------------------------
def test_parse_cpulist_reads_ranges_and_singles() -> None:
    assert parse_cpulist("0-3,8-11,14\n") == [0, 1, 2, 3, 8, 9, 10, 11, 14]
    assert parse_cpulist("5") == [5]
    assert parse_cpulist("3,1-2,2") == [1, 2, 3]
    assert parse_cpulist("  \n") == []


@pytest.mark.parametrize("text", ["a", "1-", "-1", "3-1", "1,,2", "0x3", "1 2", "1-2-3"])
def test_parse_cpulist_rejects_garbage(text: str) -> None:
    with pytest.raises(ValueError):
        parse_cpulist(text)


def test_a_backwards_range_is_named_as_such() -> None:
    with pytest.raises(ValueError, match=r"range '3-1' runs backwards \(in cpulist '0,3-1'\)"):
        parse_cpulist("0,3-1")


@given(st.sets(st.integers(min_value=0, max_value=300)))
def test_parse_cpulist_round_trips(cpus: set[int]) -> None:
    ordered = sorted(cpus)
    # Write each maximal run as a range, the way the kernel does.
    parts: list[str] = []
    for cpu in ordered:
        if parts and cpu - 1 in cpus:
            first = parts[-1].split("-")[0]
            parts[-1] = f"{first}-{cpu}"
        else:
            parts.append(str(cpu))
    assert parse_cpulist(",".join(parts)) == ordered


# --- single files -------------------------------------------------------------------------------
def test_a_missing_file_or_a_folder_reads_as_no_file(tmp_path: Path) -> None:
    assert read_text(tmp_path / "absent") is None
    assert read_text(tmp_path) is None
    assert read_text(write(tmp_path, "plain", "x") / "below") is None  # a path through a file
    assert read_int_file(tmp_path / "absent") is None and read_cpulist_file(tmp_path / "absent") is None


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads a file whatever its mode")
def test_a_file_that_cannot_be_read_says_to_check_its_permissions(tmp_path: Path) -> None:
    locked = write(tmp_path, "cpu.max", "max 100000")
    locked.chmod(0)
    with pytest.raises(TopologyError, match=f"Cannot read {locked}: .*Check its permissions"):
        read_text(locked)


def test_an_integer_file_holds_one_integer(tmp_path: Path) -> None:
    assert read_int_file(write(tmp_path, "quota", "  -1 ")) == -1
    bad = write(tmp_path, "period", "100000 us")
    with pytest.raises(TopologyError, match=f"Malformed {bad}: expected one integer, found '100000 us'"):
        read_int_file(bad)


def test_a_cpulist_file_names_itself_when_malformed(tmp_path: Path) -> None:
    assert read_cpulist_file(write(tmp_path, "online", "0-3")) == [0, 1, 2, 3]
    bad = write(tmp_path, "cpuset.cpus", "0-3;8")
    with pytest.raises(TopologyError, match=f"Malformed CPU list in {bad}: .*Expected a list like 0-3,8-11,14"):
        read_cpulist_file(bad)


# --- cgroup limits ------------------------------------------------------------------------------
def test_without_proc_self_cgroup_nothing_is_limited(tmp_path: Path) -> None:
    assert limits(tmp_path) == CgroupLimits(None, None, None)


def test_v2_the_deepest_non_empty_cpuset_and_the_tightest_quota_on_the_way_up(tmp_path: Path) -> None:
    write(tmp_path, "proc/self/cgroup", "0::/outer/inner")
    outer = write(tmp_path, "sys/fs/cgroup/outer/cpuset.cpus.effective", "2-5")
    write(tmp_path, "sys/fs/cgroup/outer/inner/cpuset.cpus.effective", "")  # empty: inherits its parent's
    write(tmp_path, "sys/fs/cgroup/cpu.max", "max 100000")
    write(tmp_path, "sys/fs/cgroup/outer/cpu.max", "150000 100000")
    write(tmp_path, "sys/fs/cgroup/outer/inner/cpu.max", "400000 100000")
    assert limits(tmp_path) == CgroupLimits({2, 3, 4, 5}, outer, 1.5)


def test_a_hybrid_host_reads_v1_controllers_beside_an_empty_unified_hierarchy(tmp_path: Path) -> None:
    write(tmp_path, "proc/self/cgroup", "4:cpuset:/job\n2:cpu,cpuacct:/job\n0::/job")
    cpuset = write(tmp_path, "sys/fs/cgroup/cpuset/job/cpuset.cpus", "0-1")
    write(tmp_path, "sys/fs/cgroup/cpu,cpuacct/job/cpu.cfs_quota_us", "50000")  # the default period
    assert limits(tmp_path) == CgroupLimits({0, 1}, cpuset, 0.5)


@pytest.mark.parametrize(
    ("relative", "text", "complaint"),
    [
        ("proc/self/cgroup", "0:/no-controllers-field", "Malformed line 1 of .*expected 'ID:CONTROLLERS:/PATH'"),
        ("sys/fs/cgroup/cpu.max", "0 100000", "expected 'max PERIOD' or 'QUOTA PERIOD'"),
        ("sys/fs/cgroup/cpu/cpu.cfs_quota_us", "0", "both must be positive"),
    ],
)
def test_a_malformed_cgroup_file_is_named(tmp_path: Path, relative: str, text: str, complaint: str) -> None:
    write(tmp_path, "proc/self/cgroup", "1:cpu:/\n0::/")
    write(tmp_path, relative, text)
    with pytest.raises(TopologyError, match=complaint):
        limits(tmp_path)


# --- the OOM killer's count -------------------------------------------------------------------------
def test_the_oom_kill_count_is_read_from_the_v2_cgroup(tmp_path: Path) -> None:
    write(tmp_path, "proc/self/cgroup", "0::/system.slice/packrat.service")
    write(
        tmp_path, "sys/fs/cgroup/system.slice/packrat.service/memory.events", "low 0\nhigh 0\nmax 3\noom 2\noom_kill 2"
    )
    assert read_oom_kills(tmp_path, tmp_path / "proc/self/cgroup") == 2


def test_the_oom_kill_count_is_read_from_the_v1_memory_controller(tmp_path: Path) -> None:
    write(tmp_path, "proc/self/cgroup", "5:cpu,cpuacct:/x\n4:memory:/init.scope\n0::/init.scope")
    write(tmp_path, "sys/fs/cgroup/memory/init.scope/memory.oom_control", "oom_kill_disable 0\nunder_oom 0\noom_kill 7")
    assert read_oom_kills(tmp_path, tmp_path / "proc/self/cgroup") == 7


def test_no_oom_kill_count_is_none_never_an_error(tmp_path: Path) -> None:
    assert read_oom_kills(tmp_path, tmp_path / "proc/self/cgroup") is None  # no /proc/self/cgroup
    write(tmp_path, "proc/self/cgroup", "not a cgroup line")
    assert read_oom_kills(tmp_path, tmp_path / "proc/self/cgroup") is None
