"""What a look reads of a worker's process from /proc: its threads' time on a CPU and waiting for one, whether one
waits now, whether it is stopped. The readings go to the hang verdicts (`fleet.verdicts`), which are pure."""

from __future__ import annotations

import os

import psutil

from packrat_daemon.fleet import verdicts
from packrat_daemon.fleet.pool import WorkerHandle
from packrat_daemon.fleet.verdicts import Reading


def waiting_for_cpu(pid: int | None) -> bool:
    """True while a thread of the process is runnable or in uninterruptible sleep (a page fault, a disk read): it
    would advance given a CPU. A sleeping, blocked or stopped process has none."""
    if pid is None:
        return False
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return False
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/stat", "rb") as stat:
                state = stat.read().rsplit(b")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state in (b"R", b"D"):
            return True
    return False


def run_seconds(pid: int | None) -> float | None:
    """The time the process's threads have spent on a CPU, to the nanosecond (/proc/<pid>/task/*/schedstat); None
    where it cannot be read. /proc/<pid>/stat's CPU times are sampled at each timer tick: a thread that computes in
    bursts shorter than a tick between sleeps can show none for a long time, and would look stopped."""
    stats = schedstats(pid)
    return None if stats is None else sum(run for run, _ in stats.values())


def schedstats(pid: int | None) -> dict[str, tuple[float, float]] | None:
    """Each thread's (time on a CPU, time waiting for one) in seconds, to the nanosecond, by thread id
    (/proc/<pid>/task/*/schedstat); None where the process cannot be read."""
    if pid is None:
        return None
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    stats = {}
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/schedstat", "rb") as schedstat:
                run, waited = schedstat.read().split()[:2]
            stats[task] = (int(run) / 1e9, int(waited) / 1e9)
        except (OSError, ValueError):
            continue  # a thread that has just exited
    return stats


def stopped(pid: int | None) -> bool:
    """True for a process stopped by a signal or a tracer (SIGSTOP, a debugger): hung, but not by its input."""
    try:
        return pid is not None and psutil.Process(pid).status() in (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP)
    except psutil.Error:
        return False


def read(worker: WorkerHandle, now: float) -> Reading:
    """What a look at `worker`, holding an overdue slice, reads of its process at `now`."""
    cpu = worker.cpu_seconds()
    stats = schedstats(worker.pid)
    return Reading(now, cpu, stats, waiting_for_cpu(worker.pid), stopped(worker.pid))


def computing(worker: WorkerHandle, sent_at: float, cpu_at_send: float | None, now: float) -> bool:
    """Whether `worker` computes the late slice it was sent at `sent_at`, its CPU time then `cpu_at_send`
    (verdicts.computing, on what /proc says)."""
    cpu = worker.cpu_seconds()
    used = None if cpu is None or cpu_at_send is None else cpu - cpu_at_send
    return verdicts.computing(used, now - sent_at, waiting_for_cpu(worker.pid))
