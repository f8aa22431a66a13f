"""Whether a measurement had its cores to itself: its workers' on-CPU share, and the machine's load.

A profile measured while other work runs on its cores is slower than the machine alone, and unevenly so: a
multi-threaded step waits for its slowest thread, so a cell of many threads suffers more than one of one, and the
plan made on such a profile predicts speed-ups the machine never gives (issue 43: 2 074 ms predicted, 566 ms
served). The kernel says how much of it happened: each thread's /proc/PID/task/TID/schedstat holds the time it
ran on a CPU and the time it waited, ready, for one (the run queue). Of the time a cell's workers were ready to
run, the share they ran (`on_cpu`) is 1.0 on cores of their own; a CPU hog on one of them brings it to about a
half. A cell below `QUIET_ON_CPU` is measured again at once (the other work may have been a moment's), and a
profile that still has such cells is marked (`Contention`): logged, kept in the state file with the profile,
said by `packrat status`, the demo, the metrics and `packrat report`, and measured again at the next start when
the machine is quiet then (`quiet_now`).

Where the kernel keeps no schedstat (CONFIG_SCHED_INFO off), nothing is known and nothing is marked.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

QUIET_ON_CPU = 0.9  # below this share of their ready time on a CPU, a cell's workers were crowded out
QUIET_LOAD_PER_CPU = 0.5  # a 1-minute load average under half the CPUs: quiet enough to measure again
RETRIES = 1  # a crowded cell is measured again this many times before it is kept as it is
# Below this much ready time (all threads), a share says more about wake-up latency than about other work: a cell
# of a tiny model, or an emulated one whose workers sleep, is not judged.
MIN_READY_NS = 50_000_000

Times = dict[tuple[int, int], tuple[int, int]]  # (pid, tid) → (ns on a CPU, ns waiting for one)


def sched_times(pids: Iterable[int | None]) -> Times | None:
    """Every thread's run and wait time of the processes `pids`; None where the kernel does not keep them."""
    times: Times = {}
    for pid in pids:
        if pid is None:
            continue
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue  # gone: its cell fails on its own
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/schedstat", encoding="ascii") as handle:
                    ran, waited, _ = handle.read().split()
            except FileNotFoundError:
                continue  # the thread ended meanwhile
            except (OSError, ValueError):
                return None  # no schedstat on this kernel
            times[(pid, int(tid))] = (int(ran), int(waited))
    return times or None


def on_cpu_share(before: Times | None, after: Times | None) -> float | None:
    """Of the time the threads were ready to run between the two samples, the share they ran; None when
    unknown (no schedstat, or under MIN_READY_NS of it). A thread started between them counts from zero."""
    if before is None or after is None:
        return None
    ran = waited = 0
    for key, (run, wait) in after.items():
        run0, wait0 = before.get(key, (0, 0))
        ran, waited = ran + max(0, run - run0), waited + max(0, wait - wait0)
    return None if ran + waited < MIN_READY_NS else ran / (ran + waited)


class Sampler:
    """The on-CPU share of some processes over a stretch of time: sampled at creation, read by `share`."""

    def __init__(self, pids: Iterable[int | None]) -> None:
        self.pids = list(pids)
        self.before = sched_times(self.pids)

    def share(self) -> float | None:
        return on_cpu_share(self.before, sched_times(self.pids))


def load_now() -> tuple[float, int]:
    """The machine's 1-minute load average and its CPU count."""
    try:
        load = os.getloadavg()[0]
    except OSError:
        load = 0.0
    return load, os.cpu_count() or 1


def quiet_now() -> bool:
    """Whether the machine looks quiet now: its 1-minute load under QUIET_LOAD_PER_CPU per CPU."""
    load, cpus = load_now()
    return load < QUIET_LOAD_PER_CPU * cpus


@dataclass(frozen=True)
class Contention:
    """How crowded a profile's measurement was: its least on-CPU share over the cells, how many cells were
    below QUIET_ON_CPU (after their measurement again), and the machine's load when it ended."""

    on_cpu: float
    crowded: int
    cells: int
    load: float
    cpus: int

    @classmethod
    def of(cls, shares: Mapping[Any, float]) -> Contention | None:
        """From each cell's on-CPU share; None when none is known."""
        if not shares:
            return None
        load, cpus = load_now()
        crowded = sum(share < QUIET_ON_CPU for share in shares.values())
        return cls(round(min(shares.values()), 4), crowded, len(shares), round(load, 2), cpus)

    @property
    def contended(self) -> bool:
        return self.crowded > 0

    def describe(self) -> str:
        where = f"load {self.load:.1f} on {self.cpus} CPU(s)"
        if not self.contended:
            return f"measured on quiet cores (its workers ran ≥{QUIET_ON_CPU:.0%} of the time they were ready; {where})"
        return (
            f"measured while other work ran on its cores: {self.crowded} of {self.cells} cell(s) had their workers "
            f"on a CPU as little as {self.on_cpu:.0%} of the time they were ready to run ({where}), so its "
            "latencies are slower than this machine alone"
        )

    def to_json(self) -> dict[str, Any]:
        return {"on_cpu": self.on_cpu, "crowded": self.crowded, "cells": self.cells, "load": self.load,
                "cpus": self.cpus}  # fmt: skip

    @classmethod
    def from_json(cls, data: Any) -> Contention:
        """ValueError (or KeyError, TypeError) for what a daemon does not write."""
        on_cpu, load = float(data["on_cpu"]), float(data["load"])
        crowded, cells, cpus = int(data["crowded"]), int(data["cells"]), int(data["cpus"])
        if not (0.0 <= on_cpu <= 1.0 and 0 <= crowded <= cells and cpus >= 1 and 0.0 <= load < 1e6):
            raise ValueError(f"a contention record out of range: {data!r}")
        return cls(on_cpu, crowded, cells, load, cpus)
