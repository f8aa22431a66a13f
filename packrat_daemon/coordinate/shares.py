"""The machine's cores as shares: contiguous runs of physical cores in topology order, and the order in which
daemons are told their new shares so that no CPU is ever held by two models.

Pure functions of frozen inputs. A share is whole physical cores (a core's SMT siblings go with it), so two
models never run on one core's two threads; a run of cores is contiguous, so that moving k cores from one
model to its neighbour shifts one boundary and leaves every other model where it was.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from packrat_daemon.wire.errors import ConfigError, PackratError
from policies.planning.topology import Topology, format_cpulist


class CoordinateError(PackratError):
    """A coordinator that cannot divide the machine as asked, or a move it cannot order."""


def cores_of(topology: Topology) -> tuple[tuple[int, ...], ...]:
    """The physical cores a coordinator hands out, in topology order, capped by the cgroup quota (a core
    beyond the quota would be throttled, not run)."""
    return topology.physical_cores()[: topology.usable_cores]


def even_split(cores: int, models: int) -> tuple[int, ...]:
    """`cores` divided as evenly as whole cores allow, the first models taking the remainder."""
    if models < 1:
        raise ConfigError("a coordinator needs at least one daemon: give --daemon NAME=CONTROL at least once")
    if cores < models:
        raise ConfigError(
            f"{models} models cannot each have a core of their own on {cores} usable core(s); give the coordinator "
            "more CPUs (--cpus) or co-locate fewer models"
        )
    base, extra = divmod(cores, models)
    return tuple(base + (1 if k < extra else 0) for k in range(models))


def divide(cores: Sequence[tuple[int, ...]], counts: Sequence[int]) -> tuple[tuple[int, ...], ...]:
    """Each model's CPU ids: `counts[k]` consecutive cores of `cores` for model k, models in order."""
    if any(count < 1 for count in counts) or sum(counts) > len(cores):
        raise CoordinateError(
            f"the split {list(counts)} needs each model to have a core and {sum(counts)} cores in all; "
            f"{len(cores)} are usable"
        )
    shares, start = [], 0
    for count in counts:
        shares.append(tuple(sorted(cpu for core in cores[start : start + count] for cpu in core)))
        start += count
    return tuple(shares)


def move_order(held: Mapping[str, frozenset[int]], target: Mapping[str, frozenset[int]]) -> list[str]:
    """The models to tell their `target` share, in an order where each one, when told, gains only CPUs no
    other model holds, or that one holds and is meant to keep sharing (`held`: what each model holds now, a
    model not in `target` keeps what it holds; targets that overlap by design, every model on all the cores,
    are shared).

    Shrinks come first, so a model gaining cores is told only once the model losing them has finished.
    Raises CoordinateError when no such order exists (two models each waiting for the other's CPUs)."""
    now = dict(held)
    pending = [name for name in target if now.get(name) != target[name]]
    order: list[str] = []
    while pending:
        ready = [
            name
            for name in pending
            if not any(
                (target[name] - now.get(name, frozenset())) & (cpus - target.get(other, frozenset()))
                for other, cpus in now.items()
                if other != name
            )
        ]
        if not ready:
            waiting = ", ".join(f"{name} (to {format_cpulist(target[name])})" for name in pending)
            raise CoordinateError(
                f"no model can be moved first: {waiting} each wait for CPUs another holds; give the daemons "
                "disjoint --cpus to start from, or restart the coordinator"
            )
        # A model that only gives CPUs up before one that gains any: the gainer's new cores are then free.
        name = min(ready, key=lambda n: (bool(target[n] - now.get(n, frozenset())), pending.index(n)))
        order.append(name)
        now[name] = target[name]
        pending.remove(name)
    return order
