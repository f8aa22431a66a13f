"""Emulated service times: how long a worker would take for its slice of a batch.

A slice of `rows` inputs on a `threads`-thread instance takes the profile's L̂(threads, rows) — the rule
the solver plans with — times an interference factor for the number of instances busy at that moment
(1 with no interference model: the table is taken as the truth).

Instances that share cores (TorchServe's oversubscribed default) share the CPU: with n of them busy on
T cores, each is timed as an instance with its fair share of T/n cores (L̂ at that many threads, at least
one), and slower by n/T once there are more busy instances than cores. That is an ideal scheduler with no
cost for the surplus threads (no spinning, no migrations, no cache thrash), so it is the most favourable
case for oversubscription: a bound the real thing can only be slower than, which the profile, measured one
instance alone, cannot narrow.
"""

from __future__ import annotations

from collections.abc import Callable

from packrat_daemon.wire.errors import ProfileError
from policies.planning.profile import Profile

Interference = Callable[[int], float]  # busy instances → slowdown factor (≥ 1)


def no_interference(busy: int) -> float:
    return 1.0


class ServiceModel:
    def __init__(self, profile: Profile, cores: int, interference: Interference = no_interference) -> None:
        self.profile = profile
        self.cores = cores
        self.interference = interference
        self._largest = {threads: max(profile.batches(threads)) for threads in profile.threads()}

    def batch_ms(self, slices: list[tuple[int, int]]) -> list[float]:
        """The compute time of each (threads, rows) slice of one batch, all started together."""
        busy = len(slices)
        factor = self.interference(busy)
        if sum(threads for threads, _ in slices) <= self.cores:
            return [self.alone_ms(threads, rows) * factor for threads, rows in slices]
        share = self.cores / busy  # oversubscribed: each busy instance gets its fair share of the cores
        slowdown = max(1.0, 1.0 / share)
        return [
            self.alone_ms(self._threads_for(min(threads, share)), rows) * factor * slowdown for threads, rows in slices
        ]

    def _threads_for(self, cores: float) -> int:
        """The profiled thread count closest below `cores` (at least the smallest profiled)."""
        fitting = [threads for threads in self._largest if threads <= max(1.0, cores)]
        return max(fitting) if fitting else min(self._largest)

    def alone_ms(self, threads: int, rows: int) -> float:
        """L̂(threads, rows); past the largest profiled batch, that batch's latency scaled by the rows
        (a slice the profile does not cover still gets a time, as a proportional split can make one)."""
        latency = self.profile.lhat(threads, rows)
        if latency is not None:
            return latency
        largest = self._largest.get(threads)
        if largest is None:
            raise ProfileError(
                f"the profile has no row for {threads} threads, which the plan uses; profile every thread count "
                "up to the cores simulated"
            )
        latency = self.profile.lhat(threads, largest)
        assert latency is not None
        return latency * rows / largest
