"""Emulation: `packrat serve --runtime emulated`, a daemon at 16-128 cores on a machine that has two.

The daemon itself runs unchanged (frontend, batcher, splitter, policy, tuner, reconciler); only its
workers compute nothing (workers.runtimes.emulated): each call waits the profile's L̂(t, b) times an interference
factor, so every measurement of such a daemon is a measurement of the daemon, never of a model. This
module decides what the emulating daemon plans for and hands its workers:

- `check`: the emulate settings only with the emulated runtime, and the emulated runtime only with a profile;
- `topology`: `--emulate-cores T` plans for a made-up machine of T cores (`Topology.synthetic`);
- `Interference`: the slow-down for c of the T cores busy: `none`, `default`, `auto` (the model's own,
  measured side by side on this machine: packrat_daemon.measure.interference), a number F, or a FILE;
- `template_runtime`: writes the workers' numbers to the run folder and names them to the template;
- `describe`: what the log and `info` say, so that nobody mistakes an emulation for a measurement.

The default interference is fitted to Inception-v3 run side by side on a 16-core server (`fit_full_load`);
`speedup_errors` checks any full-load factor against the same runs. docs/emulation.md gives both and
their limits.
"""

from __future__ import annotations

import csv
import json
import statistics
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packrat_daemon.config import ServeConfig
from packrat_daemon.wire.errors import ConfigError, ProfileError
from policies.planning.profile import Profile
from policies.planning.topology import Topology
from workers.models.spec import EMULATED
from workers.runtimes.emulated import Numbers

# f(T): how much slower each instance runs with all T cores busy than alone, from fit_full_load on
# bench/profiles/multi-inception-fiddle16.csv and inception3-cloudlab16.csv (a test re-fits it).
DEFAULT_FULL_LOAD = 1.157
DEFAULT_SOURCE = "fitted to Inception-v3 side by side on a 16-core server (docs/emulation.md)"
NUMBERS_FILE = "emulation.json"


def check(config: ServeConfig) -> bool:
    """Whether `config` emulates; ConfigError when the emulate settings come without the emulated runtime
    or the emulated runtime without a profile."""
    names = ("emulate_cores", "emulate_interference", "emulate_measure")
    given = [f"--{name.replace('_', '-')}" for name in names if getattr(config, name) not in (None, False)]
    if config.runtime != EMULATED:
        if given:
            raise ConfigError(
                f"{' and '.join(given)} only work with --runtime emulated (workers that do not compute); "
                f"runtime {config.runtime} runs the model on this machine's own cores"
            )
        return False
    if not config.profile:
        raise ConfigError(
            "--runtime emulated waits the latencies of a profile: give one with --profile FILE "
            "(e.g. bench/profiles/inception3-cloudlab16.csv, or one measured with --save-profile)"
        )
    # A bad FILE fails now, not in the template; auto measures now (once per model and machine).
    Interference.named(config.emulate_interference, config.model, config.input)
    return True


def topology(config: ServeConfig) -> Topology:
    """The machine to plan for: T made-up cores with --emulate-cores T, else this one."""
    return Topology.synthetic(config.emulate_cores) if config.emulate_cores else Topology.detect()


def emulated_profile(path: str) -> Profile:
    """The profile an emulation waits and plans on, labelled as the emulated runtime's: the file's only
    runtime's rows (a file without a runtime column has one)."""
    profiles = Profile.read_all(path)
    if len(profiles) != 1:
        raise ProfileError(
            f"{path} holds the rows of several runtimes ({', '.join(sorted(profiles))}); an emulation waits "
            "one runtime's latencies: write that runtime's rows to a file of their own"
        )
    (profile,) = profiles.values()
    return Profile(dict(profile.items()), model=profile.model, runtime=EMULATED)


@dataclass(frozen=True)
class Interference:
    """The slow-down of every busy instance while c of the machine's T cores are busy.

    A profile's L(t, b) was measured with that instance's own t cores busy, so a call of t threads waits
    L̂(t, b) · f(c) / f(t) (`numbers`): alone it waits exactly its profiled latency, whatever the model.
    """

    name: str  # none, default, auto, the number given, or the file it was read from
    full_load: float | None = None  # the linear models: f(T), the factor with every core busy
    points: tuple[tuple[float, float], ...] = ()  # (busy cores, factor) from a FILE, by busy cores
    source: str = ""  # where full_load comes from, in words

    @classmethod
    def named(cls, text: str | None, model: str | None = None, input_override: str | None = None) -> Interference:
        """`none`, `default` (also when unset), `auto` (measured for `model`, or read from its cache), a
        number F >= 1 (f(T) = F, linear in the cores busy), or a CSV FILE of `busy_cores,factor` rows."""
        if text in (None, "default"):
            return cls("default", DEFAULT_FULL_LOAD, source=DEFAULT_SOURCE)
        if text == "none":
            return cls("none")
        if text == "auto":
            if not model:
                raise ConfigError(
                    "--emulate-interference auto measures a model's own slow-down side by side on this machine: "
                    "name the model with --model (e.g. builtin:bert-base), or give default or a number"
                )
            from packrat_daemon.measure.interference import estimate

            found = estimate(model, input_override)
            return cls("auto", found.factor, source=found.describe())
        given = _number(text)
        if given is not None:
            if not given >= 1.0:
                raise ConfigError(
                    f"--emulate-interference {text}: a factor is the slow-down with every core busy, at least 1 "
                    "(1: none; the default is 1.157)"
                )
            return cls(text, given, source="given")
        return cls(text, points=_read_points(text))

    def contention(self, cores: int) -> tuple[float, ...]:
        """f(1) … f(cores)."""
        return tuple(self.factor(busy, cores) for busy in range(1, cores + 1))

    def factor(self, busy: int, cores: int) -> float:
        if self.name == "none" or cores <= 1:
            return 1.0
        if self.full_load is not None:
            # Linear from 1 (alone) to the factor at full load, by the fraction of cores busy: the fit has
            # no point in between (docs/emulation.md).
            return 1.0 + (self.full_load - 1.0) * (min(busy, cores) - 1) / (cores - 1)
        return _interpolate(self.points, busy)

    def describe(self) -> str:
        if self.name == "none":
            return "none (each call waits exactly the profile's latency)"
        if self.full_load is not None:
            label = self.name if self.name in ("default", "auto") else "given"
            if label == "given":
                return f"×{self.full_load:g} with every core busy, linear in the cores busy (given)"
            return f"{label}: ×{self.full_load:.3f} with every core busy, linear in the cores busy ({self.source})"
        return f"from {self.name}"


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def _read_points(path: str) -> tuple[tuple[float, float], ...]:
    try:
        with open(path, newline="") as handle:
            rows = list(csv.DictReader(line for line in handle if not line.startswith("#")))
        points = sorted((float(row["busy_cores"]), float(row["factor"])) for row in rows)
    except (OSError, KeyError, ValueError, TypeError) as exc:
        raise ConfigError(
            f"--emulate-interference {path}: {exc}; give none, default, or a CSV with columns busy_cores,factor"
        ) from None
    if not points or any(busy < 1 or factor <= 0 for busy, factor in points):
        raise ConfigError(f"--emulate-interference {path}: needs at least one row, busy_cores >= 1 and factor > 0")
    return tuple(points)


def _interpolate(points: tuple[tuple[float, float], ...], busy: int) -> float:
    """Linear between the file's points; its first and last factors hold below and above them."""
    if busy <= points[0][0]:
        return points[0][1]
    for (low, f_low), (high, f_high) in zip(points, points[1:], strict=False):
        if busy <= high:
            return f_low + (f_high - f_low) * (busy - low) / (high - low)
    return points[-1][1]


def numbers(profile: Profile, cores: int, max_batch: int, interference: Interference) -> Numbers:
    """What each emulated worker waits: L̂(t, b) for every profiled t up to the cores and b up to max_batch.

    Handed as L̂(t, b) / f(t): the profile measured each cell with its own t cores busy, and the worker
    multiplies by f(cores busy), its own included, so a t-thread call alone waits L̂(t, b) itself.
    """
    latency = {
        threads: tuple(_over(profile.lhat(threads, batch), interference.factor(threads, cores))
                       for batch in range(1, max_batch + 1))
        for threads in profile.threads()
        if threads <= cores
    }  # fmt: skip
    return Numbers(latency, cores, interference.contention(cores), summary(cores, interference))


def _over(latency: float | None, factor: float) -> float | None:
    return None if latency is None else latency / factor


def template_runtime(config: ServeConfig, cores: int, run_dir: Path) -> str:
    """Write the workers' numbers into the run folder; the --runtime to start the template with."""
    assert config.profile is not None  # check() refused otherwise
    interference = Interference.named(config.emulate_interference, config.model, config.input)
    handed = numbers(emulated_profile(config.profile), cores, config.max_batch, interference)
    path = run_dir / NUMBERS_FILE
    path.write_text(json.dumps(handed.to_json()))
    return f"{EMULATED}:{path}"


def summary(cores: int, interference: Interference) -> str:
    return (
        f"EMULATING {cores} cores: workers compute nothing; each call of t threads waits the profile's L̂(t, b) "
        f"× f(cores busy) / f(t), interference {interference.describe()}"
    )


def describe(config: ServeConfig, cores: int) -> dict[str, Any]:
    """The `info` reply's `emulation` entry."""
    interference = Interference.named(config.emulate_interference, config.model, config.input)
    return {
        "emulated": True,
        "cores": cores,
        "interference": interference.name,
        "profile": config.profile,
        "note": summary(cores, interference),
    }


@dataclass(frozen=True)
class Group:
    """One group of the side-by-side table: an all-core instance alone, then n instances at once."""

    alone_batch: int
    alone_ms: float  # the all-core instance alone, on the side-by-side server
    threads: int  # of each instance side by side
    batch: int  # of each instance side by side
    side_ms: float  # the median latency of the instances side by side
    scale: float  # side-by-side server over the isolated table's server, at the all-core run
    isolated_ms: float  # the isolated table's L(threads, batch), unscaled

    @property
    def factor(self) -> float:
        """The instances' slow-down side by side, over the isolated table's L(t, b) (scaled)."""
        return self.side_ms / (self.isolated_ms * self.scale)


def side_by_side_groups(multi_csv: str | Path, isolated_csv: str | Path) -> list[Group]:
    """The fiddle table's groups of one shape each, with the isolated latencies they are read against.

    The side-by-side file holds groups: one all-core instance alone at batch n·b, then n instances of t
    threads at batch b, all at once, filling the cores. The isolated profile comes from another server of
    the same size; each group's all-core run, measured on both, scales it to the side-by-side server.
    """
    isolated = Profile.read_csv(isolated_csv)
    cores = max(isolated.threads())
    rows: list[tuple[tuple[int, float], list[tuple[int, int, float]]]] = []
    with open(multi_csv, newline="") as handle:
        for row in csv.DictReader(line for line in handle if not line.startswith("#")):
            threads, batch, latency = int(row["intraop_threads"]), int(row["batch_size"]), float(row["latency(avg)"])
            if threads == cores:
                rows.append(((batch, latency), []))
            elif rows:
                rows[-1][1].append((threads, batch, latency))
    groups = []
    for (alone_batch, alone_ms), instances in rows:
        by_shape: dict[tuple[int, int], list[float]] = defaultdict(list)
        for threads, batch, latency in instances:
            by_shape[(threads, batch)].append(latency)
        if len(by_shape) != 1:
            continue  # a group must run one shape side by side
        ((threads, batch), latencies), = by_shape.items()  # fmt: skip
        scale = alone_ms / isolated.latency(cores, alone_batch)
        isolated_ms = isolated.latency(threads, batch)
        groups.append(Group(alone_batch, alone_ms, threads, batch, statistics.median(latencies), scale, isolated_ms))
    if not groups:
        raise ProfileError(f"{multi_csv}: no group of instances side by side to fit")
    return groups


def fit_full_load(multi_csv: str | Path, isolated_csv: str | Path) -> float:
    """f(T) from instances run side by side (the fiddle table) against one instance alone (a profile): the
    median over groups of each group's factor (`Group.factor`)."""
    return statistics.median(group.factor for group in side_by_side_groups(multi_csv, isolated_csv))


def speedup_errors(multi_csv: str | Path, isolated_csv: str | Path, interference: Interference) -> list[float]:
    """Per group, how far the split's speed-up over the all-core instance, as the emulation predicts it
    from the isolated table, is from the side-by-side server's: predicted / measured − 1 (> 0: optimistic).

    Measured: L(alone) / L(side by side), both on the side-by-side server (the inputs per call scale alike).
    Predicted: L̂(T, n·b) / (L̂(t, b) · f(T) / f(t)), all from the isolated table, as `numbers` waits them.
    """
    isolated = Profile.read_csv(isolated_csv)
    cores = max(isolated.threads())
    errors = []
    for group in side_by_side_groups(multi_csv, isolated_csv):
        measured = group.alone_ms / group.side_ms
        slowdown = interference.factor(cores, cores) / interference.factor(group.threads, cores)
        predicted = isolated.latency(cores, group.alone_batch) / (group.isolated_ms * slowdown)
        errors.append(predicted / measured - 1.0)
    return errors
