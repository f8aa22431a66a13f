"""Interference per model: `--emulate-interference auto`, a model's own slow-down side by side on this machine.

The emulation's one unknown is how much slower an instance runs while others run beside it. `default`
is fitted to one compute-heavy model (Inception-v3); a model that streams more memory per unit of work
suffers more. `auto` measures the model itself: one instance of one thread alone, then the same call
while one instance runs on each of this machine's other cores (packrat_daemon.measure.corun, in a child
process that imports torch). Per batch, the median over paired rounds of side-by-side over alone CPU
time; the estimate is the median over the batches, never below 1, and it stands for the slow-down with
every core busy (f(T) of the linear model, read at the same fraction of cores busy at any T).

The measurement is made once per model and machine and cached beside the model's shapes
(workers.models.cache). Its limits (docs/emulation.md): a machine of few cores measures few co-runners,
and one whose cores are shared with other work runs the instances at once only part of the time, so the
estimate is a lower bound there; `Estimate.on_cpu` says how much of the time they did.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import statistics
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packrat_daemon.wire.errors import ConfigError, ModelSpecError

log = logging.getLogger(__name__)

AUTO_BATCHES = (1, 4)  # per instance: a latency-bound and a throughput-bound call
AUTO_ROUNDS = 5
MAX_CPUS = 16  # co-runners beyond this cost memory and minutes; the estimate is read per fraction busy
TIMEOUT_S = 1800.0
# Below this share of wall time on a core, the instances "side by side" were mostly not running at once.
BUSY_MACHINE_ON_CPU = 0.8
ESTIMATE_FORMAT = 2


@dataclass(frozen=True)
class Estimate:
    """A model's slow-down side by side on this machine, from paired rounds."""

    model: str
    cpus: tuple[int, ...]  # the logical CPUs the instances ran on, one each
    ratios: Mapping[int, tuple[float, ...]]  # batch → side-by-side / alone CPU time, per round
    wall_ratios: Mapping[int, tuple[float, ...]]  # the same in wall time, for the record
    on_cpu: float  # the least share of wall time on a core, over the co-runners, median over rounds
    machine: str  # the CPU model these were measured on
    load: float  # this machine's 1-minute load average just before
    niceness: int = 0  # the priority the measurement ran at (packrat_daemon.measure.corun.PRIORITY)

    @property
    def by_batch(self) -> dict[int, float]:
        return {batch: statistics.median(values) for batch, values in sorted(self.ratios.items())}

    @property
    def raw(self) -> float:
        """The median over batches of the per-batch medians (below 1 where the noise exceeds the effect)."""
        return statistics.median(self.by_batch.values())

    @property
    def factor(self) -> float:
        """f(T): co-runners never make an instance faster, so an estimate below 1 is taken as 1."""
        return max(1.0, self.raw)

    @property
    def busy_machine(self) -> bool:
        return self.on_cpu < BUSY_MACHINE_ON_CPU

    def describe(self) -> str:
        per_batch = ", ".join(f"batch {batch}: ×{ratio:.3f}" for batch, ratio in self.by_batch.items())
        text = (
            f"{self.model} measured side by side on {len(self.cpus)} cores of this machine ({per_batch}; "
            f"{min(len(r) for r in self.ratios.values())} paired rounds)"
        )
        if self.busy_machine:
            text += (
                f"; the machine was busy (co-runners on a core {self.on_cpu:.0%} of the time), so this "
                "understates the slow-down"
            )
        return text

    def to_json(self) -> dict[str, Any]:
        return {
            "format": ESTIMATE_FORMAT,
            "model": self.model,
            "cpus": list(self.cpus),
            "ratios": {str(b): list(r) for b, r in self.ratios.items()},
            "wall_ratios": {str(b): list(r) for b, r in self.wall_ratios.items()},
            "on_cpu": self.on_cpu,
            "machine": self.machine,
            "load": self.load,
            "niceness": self.niceness,
            "by_batch": {str(b): r for b, r in self.by_batch.items()},
            "raw": self.raw,
            "factor": self.factor,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Estimate:
        return cls(
            str(data["model"]),
            tuple(int(cpu) for cpu in data["cpus"]),
            {int(b): tuple(float(x) for x in r) for b, r in data["ratios"].items()},
            {int(b): tuple(float(x) for x in r) for b, r in data["wall_ratios"].items()},
            float(data["on_cpu"]),
            str(data["machine"]),
            float(data["load"]),
            int(data.get("niceness", 0)),
        )

    @classmethod
    def from_run(cls, run: Mapping[str, Any], machine: str, load: float) -> Estimate:
        """Fold corun's timings: per round, side by side over alone, in CPU time and in wall time."""
        ratios: dict[int, tuple[float, ...]] = {}
        walls: dict[int, tuple[float, ...]] = {}
        on_cpu: list[float] = []
        for batch, rounds in run["rounds"].items():
            ratios[int(batch)] = tuple(r["side"]["cpu_ms"] / r["alone"]["cpu_ms"] for r in rounds)
            walls[int(batch)] = tuple(r["side"]["wall_ms"] / r["alone"]["wall_ms"] for r in rounds)
            for r in rounds:
                on_cpu.append(min(r["side"]["cpu_ms"] / r["side"]["wall_ms"], r["side"]["others_on_cpu"]))
        if not ratios or not on_cpu:
            raise ModelSpecError(f"the side-by-side run of {run.get('model')} timed no round")
        on_core = statistics.median(on_cpu)
        niceness = int(run.get("niceness", 0))
        return cls(str(run["model"]), tuple(run["cpus"]), ratios, walls, on_core, machine, load, niceness)


def estimate(
    model: str,
    input_override: str | None = None,
    *,
    batches: Sequence[int] = AUTO_BATCHES,
    rounds: int = AUTO_ROUNDS,
    refresh: bool = False,
) -> Estimate:
    """The model's estimate on this machine: from the cache, else measured now (minutes) and cached."""
    from workers.models.cache import entry_dir
    from workers.models.spec import EMULATED

    cpus = side_by_side_cpus()
    path = entry_dir(model, input_override, EMULATED) / f"interference-{len(cpus)}cpus.json"
    if path.is_file() and not refresh:
        data = json.loads(path.read_text())
        if data.get("format") == ESTIMATE_FORMAT and data.get("machine") == machine_name():
            return Estimate.from_json(data)
    log.warning(
        "measuring the interference of %s side by side on %d cores of this machine, once (cached in %s)",
        model, len(cpus), path.parent,
    )  # fmt: skip
    found = measure(model, input_override, cpus, batches, rounds)
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False, suffix=".tmp") as handle:
        json.dump(found.to_json(), handle)
    os.replace(handle.name, path)  # in one step: a concurrent reader never sees half a file
    return found


def measure(
    model: str, input_override: str | None, cpus: Sequence[int], batches: Sequence[int], rounds: int
) -> Estimate:
    """Run corun in a child process and fold what it prints."""
    from workers.models.subprocesses import run_module

    args = ["--model", model, "--cpus", ",".join(map(str, cpus))]
    args += ["--batches", ",".join(map(str, batches)), "--rounds", str(rounds)]
    if input_override:
        args += ["--input", input_override]
    load = os.getloadavg()[0]
    try:
        done = run_module("packrat_daemon.measure.corun", args, TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise ModelSpecError(
            f"measuring the interference of {model} took over {TIMEOUT_S:.0f} s; give "
            "--emulate-interference default or a number instead"
        ) from None
    if done.returncode != 0:
        raise ModelSpecError(f"could not run {model} side by side: {done.stderr.strip()[-2000:]}")
    return Estimate.from_run(json.loads(done.stdout), machine_name(), load)


def side_by_side_cpus() -> tuple[int, ...]:
    """One logical CPU per usable physical core (SMT siblings share a core's units), at most MAX_CPUS."""
    from policies.planning.topology import Topology

    topology = Topology.detect()
    first: dict[int, int] = {}
    for cpu in topology.cpus:
        first.setdefault(cpu.core, cpu.id)
    cpus = tuple(sorted(first.values()))[: min(MAX_CPUS, topology.usable_cores)]
    if len(cpus) < 2:
        raise ConfigError(
            "--emulate-interference auto runs the model side by side, which takes two usable cores; this "
            f"process may use {len(cpus)}: give --emulate-interference default or a number instead"
        )
    return cpus


def machine_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
