"""The policy contract: a tiny base class; plans are frozen values.

A policy is a pure function of frozen inputs (as optuna's samplers are): it reads a Profile, a
Topology and a BatchDistribution and returns a Plan. It never touches processes; the reconciler
turns a Plan into a live pool.
"""

from __future__ import annotations

import abc
import math
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, Self

from policies.planning.distribution import BatchDistribution
from policies.planning.profile import Profile
from policies.planning.topology import Topology

# The main layout and up to two spares: each spare is another set of forked workers, so a plan from
# outside a policy (a state file) with more is refused rather than forking them.
MAX_LAYOUTS = 3
MAX_INSTANCE_COUNT = 1 << 20  # threads or inputs of one instance in a plan read back: far past any machine
SPLITS = ("exact", "even")


@dataclass(frozen=True)
class InstancePlan:
    threads: int
    batch: int  # inputs this instance is expected to take at the plan's reference batch


def format_ms(ms: float) -> str:
    """A latency with three significant digits: a small model's 0.0312 ms must not read "0.0 ms"."""
    return f"{ms:.3g} ms" if ms < 100 else f"{ms:.0f} ms"


@dataclass(frozen=True)
class Plan:
    instances: tuple[InstancePlan, ...]
    policy: str
    reason: str
    predicted_latency_ms: float | None = None
    # True when instances deliberately share cores (TorchServe's default); the allocator then gives
    # every instance the whole CPU set instead of disjoint cores.
    oversubscribed: bool = False
    # How each live batch is divided: "exact" uses the per-batch split on the profile's rows,
    # "even" spreads inputs evenly (what a round-robin server such as TorchServe does).
    split: str = "exact"
    # Further layouts of the same cores, kept warm beside `instances`: each batch runs on whichever
    # layout serves its size fastest (e.g. one 2-thread instance for a single input, two 1-thread
    # instances for sixteen). Workers are forked from one template, so a spare layout costs little memory.
    alternatives: tuple[tuple[InstancePlan, ...], ...] = ()

    @property
    def layouts(self) -> tuple[tuple[InstancePlan, ...], ...]:
        return (self.instances, *self.alternatives)

    @property
    def layout_threads(self) -> tuple[tuple[int, ...], ...]:
        """Each layout as the thread counts of its instances (what policies.planning.layouts reads)."""
        return tuple(tuple(instance.threads for instance in layout) for layout in self.layouts)

    @property
    def thread_counts(self) -> list[int]:
        return [instance.threads for instance in self.instances]

    @property
    def total_threads(self) -> int:
        return sum(self.thread_counts)

    def misfit(self, topology: Topology, max_batch: int | None) -> str | None:
        """Why this plan cannot run on `topology` as it is (a layout needing more cores than are usable, more
        layouts or oversubscribed workers than any policy makes, a batch over `max_batch`), or None. A plan
        from outside a policy (a state file) is checked so before a single worker is forked for it."""
        if len(self.layouts) > MAX_LAYOUTS:
            return f"it has {len(self.layouts)} layouts; a plan keeps at most {MAX_LAYOUTS} warm"
        cores = topology.usable_cores
        for layout in self.layouts:
            if not layout or any(i.threads < 1 or i.batch < 1 for i in layout):
                return "a layout has no instances, or an instance with fewer than 1 thread or input"
            widest = max(i.threads for i in layout)
            if self.oversubscribed:  # TorchServe's shape: one worker per logical CPU, each on every core
                if len(layout) > topology.logical_cpus or widest > cores:
                    return (
                        f"its {len(layout)} oversubscribed worker(s) of up to {widest} threads exceed this "
                        f"machine's {topology.logical_cpus} CPUs and {cores} usable cores"
                    )
            elif sum(i.threads for i in layout) > cores:
                return f"a layout needs {sum(i.threads for i in layout)} cores but only {cores} are usable"
            if max_batch is not None and max(i.batch for i in layout) > max_batch:
                return f"an instance takes {max(i.batch for i in layout)} inputs, more than max_batch {max_batch}"
        return None

    def describe(self) -> str:
        groups: dict[tuple[int, int], int] = {}
        for instance in self.instances:
            key = (instance.threads, instance.batch)
            groups[key] = groups.get(key, 0) + 1
        parts = [f"{n}×⟨{t} thread{'s' if t > 1 else ''}, batch {b}⟩" for (t, b), n in groups.items()]
        if self.predicted_latency_ms is not None:
            latency = f", predicted {format_ms(self.predicted_latency_ms)}"
        else:
            latency = ", latency not predicted (its instances share cores)" if self.oversubscribed else ""
        spare = f" (+{len(self.alternatives)} spare layout(s) for other batch sizes)" if self.alternatives else ""
        return f"{self.policy}: {' + '.join(parts)}{latency}{spare}"

    def to_json(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "instances": [{"threads": i.threads, "batch": i.batch} for i in self.instances],
            "predicted_latency_ms": self.predicted_latency_ms,
            "oversubscribed": self.oversubscribed,
            "split": self.split,
            "alternatives": [
                [{"threads": i.threads, "batch": i.batch} for i in layout] for layout in self.alternatives
            ],
            "reason": self.reason,
        }

    @classmethod
    def from_json(cls, data: Any, policy: str | None = None, reason: str = "") -> Plan:
        """The inverse of `to_json`, every field checked: ValueError naming what is wrong (a plan read back from a
        state file or a coordinator's assign). `policy` and `reason` stand for those keys where they are absent
        (without `policy` the key must be there). Whether the plan fits a machine is `misfit`'s to say."""
        if not isinstance(data, dict):
            raise ValueError(f"a plan is {_short(data)}, not an object")
        predicted = data.get("predicted_latency_ms")
        if predicted is not None and (not _is_number(predicted) or not 0 <= predicted < math.inf):
            raise ValueError(f"its predicted_latency_ms is {_short(predicted)}, not a number of milliseconds or null")
        oversubscribed, split = data.get("oversubscribed", False), data.get("split", "exact")
        if not isinstance(oversubscribed, bool):
            raise ValueError(f"its oversubscribed is {_short(oversubscribed)}, not true or false")
        if split not in SPLITS:
            raise ValueError(f"its split is {_short(split)}, neither 'exact' nor 'even'")
        alternatives = data.get("alternatives", [])
        if not isinstance(alternatives, list):
            raise ValueError(f"its spare layouts are {_short(alternatives)}, not a list")
        return cls(
            instances=_layout(data.get("instances")),
            policy=_text(data.get("policy", policy), "policy"),
            reason=_text(data.get("reason", reason), "reason"),
            predicted_latency_ms=None if predicted is None else float(predicted),
            oversubscribed=oversubscribed,
            split=split,
            alternatives=tuple(_layout(layout) for layout in alternatives),
        )


def _short(value: Any) -> str:
    """`value` for a message: a crafted plan's field may be megabytes."""
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:37]}..."


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _text(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"its {what} is {_short(value)}, not text")
    return value


def _count(item: dict[str, Any], key: str, low: int) -> int:
    value = item.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= MAX_INSTANCE_COUNT:
        raise ValueError(f"an instance's {key} is {_short(value)}, not an integer from {low} to {MAX_INSTANCE_COUNT}")
    return value


def _layout(items: Any) -> tuple[InstancePlan, ...]:
    """A layout as `to_json` writes it: a non-empty list of {"threads": T, "batch": B}. A batch may be 0: TorchServe's
    policy starts a worker with no share of the reference batch."""
    if not isinstance(items, list) or not items:
        raise ValueError(f"a layout is {_short(items)}, not a non-empty list of instances")
    if not all(isinstance(item, dict) for item in items):
        raise ValueError("an instance is not an object of threads and batch")
    return tuple(InstancePlan(_count(item, "threads", 1), _count(item, "batch", 0)) for item in items)


@dataclass(frozen=True)
class PolicySettings:
    """The serve options a policy may read when it is built for the daemon or `packrat solve`."""

    plan: str | None  # --plan: the user's own pool, for the fixed policy
    min_split_gain: float  # --min-split-gain: how much faster than one instance a split must be
    max_batch: int | None = None  # --max-batch where it is known: no instance of a user's plan may take more

    @classmethod
    def from_config(cls, config: PolicyOptions) -> PolicySettings:
        """The settings of a serve configuration (`packrat_daemon.config.ServeConfig`), or of anything that has
        its three options (`packrat solve`'s arguments)."""
        return cls(config.plan, config.min_split_gain, config.max_batch)


class PolicyOptions(Protocol):
    """What `PolicySettings.from_config` reads: the serve options of the same names."""

    @property
    def plan(self) -> str | None: ...
    @property
    def min_split_gain(self) -> float: ...
    @property
    def max_batch(self) -> int | None: ...


class Policy(abc.ABC):
    """Base class of every policy. Subclasses set `name` and implement `plan`.

    The daemon asks a policy what it can do instead of recognising it by name: `adapts` (re-plan online
    when the live batch sizes move; the tuner then needs `expected_latency`) and `checks_splits` (its
    splits rest on near ties in a noisy profile, so each is measured against one instance before serving).
    """

    name: ClassVar[str] = ""
    needs_profile: ClassVar[bool] = False
    adapts: ClassVar[bool] = False
    checks_splits: ClassVar[bool] = False

    @classmethod
    def from_settings(cls, settings: PolicySettings) -> Self:
        """The policy as the serve options configure it; a policy that reads none of them overrides nothing."""
        return cls()

    @abc.abstractmethod
    def plan(self, profile: Profile | None, topology: Topology, distribution: BatchDistribution) -> Plan:
        """Return the pool to run for this distribution. Must not mutate its inputs."""

    def expected_latency(self, profile: Profile, plan: Plan, distribution: BatchDistribution) -> float | None:
        """Predicted mean latency of `plan` over `distribution` (inf when it cannot serve some batch size),
        or None when this policy cannot predict it. A policy that `adapts` must answer."""
        return None
