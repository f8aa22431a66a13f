"""Emulated service times: how long each slice of a batch takes, by the emulated workers' own rules.

The numbers and the slow-down are workers.runtimes.emulated's (`Numbers`: L̂(t, b) per thread count and batch,
and `slowdown(busy threads)`: the interference factor, times busy/cores once threads outnumber the
cores), built by packrat_daemon.measure.emulation from the profile and the interference model. So the simulation
and `packrat serve --runtime emulated` wait the same latencies; this module only does on a virtual clock
what the emulated workers do in real time: every busy slice progresses at 1/slowdown of the threads busy
at that moment, and when a slice finishes, the rest speed up.
"""

from __future__ import annotations

from packrat_daemon.measure.emulation import Interference, numbers
from packrat_daemon.wire.errors import ProfileError
from policies.planning.profile import Profile
from workers.runtimes.emulated import Numbers


class ServiceModel:
    def __init__(self, numbers: Numbers) -> None:
        self.numbers = numbers

    @classmethod
    def of(cls, profile: Profile, cores: int, max_batch: int, interference: Interference) -> ServiceModel:
        return cls(numbers(profile, cores, max_batch, interference))

    def batch_ms(
        self, slices: list[tuple[int, int]], lengths: list[int] | None = None, reference: int = 0
    ) -> list[float]:
        """When each (threads, rows) slice of one batch finishes, in ms after they all started together. `lengths`:
        each slice's padded length along a free axis, the profile's being `reference` (simulate.lengths)."""
        padded = lengths or [0] * len(slices)
        work = [self.alone_ms(t, rows, n, reference) for (t, rows), n in zip(slices, padded, strict=True)]
        finished = [0.0] * len(slices)
        active = sorted(range(len(slices)), key=work.__getitem__)  # the least work finishes first
        now = done = 0.0  # done: work every active slice has completed so far
        for k, index in enumerate(active):
            busy = sum(slices[j][0] for j in active[k:])
            now += (work[index] - done) * self.numbers.slowdown(busy)
            done = work[index]
            finished[index] = now
        return finished

    def alone_ms(self, threads: int, rows: int, length: int = 0, reference: int = 0) -> float:
        try:
            return self.numbers.latency_s(threads, rows, length, reference) * 1000.0
        except ValueError as exc:
            raise ProfileError(
                f"{exc}: the emulated workers could not serve this slice either; profile every thread count up to "
                "the cores and batches up to max_batch"
            ) from None
