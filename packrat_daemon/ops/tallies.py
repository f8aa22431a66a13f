"""The request path's tallies: plain counts the daemon's loop updates and the metrics export at scrape time.

`Tally` is one histogram; `LayoutTimes` keeps, per layout (the workers' thread counts), the measured
compute of each batch and the profile's prediction for it; `OwnTimes` sums where the daemon's own time
goes (its loop's phases, and the trip to the workers). They live apart from metrics.py, which turns
them into Prometheus families, so that the loop's side stays small and cheap.
"""

from __future__ import annotations

import logging
import statistics
from bisect import bisect_left
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from prometheus_client.utils import floatToGoString

from policies.planning.profile import Profile

if TYPE_CHECKING:
    from packrat_daemon.ops.records import Answer

debug = logging.getLogger("packrat.metrics")


class Tally:
    """A histogram the loop updates with one bisect and two additions: no lock, no label lookup.

    prometheus_client's Histogram takes a lock per bucket and per sum on every observation; on the
    request path that was a measurable share of a tiny model's round trip. Only the daemon's loop
    writes; the scrape thread copies the counts in one step (atomic under the GIL) when it reads.
    """

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)  # the last one: above every bound (+Inf)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1  # buckets are "less or equal"
        self.sum += value

    def cumulative(self) -> list[tuple[str, float]]:
        counts = list(self.counts)
        buckets: list[tuple[str, float]] = []
        total = 0
        for bound, count in zip((*self.bounds, float("inf")), counts, strict=True):
            total += count
            buckets.append((floatToGoString(bound), total))
        return buckets


# A plan has a few layouts, but mid-reconfiguration the dispatcher may run a batch on whatever disjoint
# workers are ready: past this many distinct layouts the rest share the label "other", so a long-lived
# daemon that adapts often cannot grow the series without bound.
MAX_LAYOUT_LABELS = 8
OTHER_LAYOUT = "other"


def layout_label(threads: Sequence[int]) -> str:
    """A layout as its workers' thread counts, largest first ("2+1+1"): the same cores split the same way
    get one label whichever worker ids hold them."""
    return "+".join(str(t) for t in sorted(threads, reverse=True))


class LayoutTimes:
    """Per layout: the measured compute of each batch it ran, and the profile's prediction for it.

    A batch's compute is its slowest slice (the slices run side by side), and so is its prediction; both
    are what the profile's L(t, b) describes, so their ratio says whether the plan's numbers still hold.
    """

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        self.observed: dict[str, Tally] = {}
        self.predicted_s: dict[str, float] = {}
        self.predicted_batches: dict[str, int] = {}
        # The workers' thread counts as the batch came (one int for one worker) -> label: this runs on the
        # daemon's loop once per batch, and building the label each time cost more than the rest together.
        self._labels: dict[Any, str] = {}

    def observe(self, done: Answer) -> None:
        jobs = done.jobs
        if len(jobs) == 1:
            key: Any = jobs[0].worker.threads
            predicted_ms = jobs[0].predicted_ms
        else:
            key = tuple([job.worker.threads for job in jobs])
            predicted_ms = batch_predicted_ms(done)
        label = self._labels.get(key)
        if label is None:
            label = self._labels[key] = self._label(layout_label([key] if len(jobs) == 1 else key))
        self.observed[label].observe(done.compute_ms / 1000.0)
        if predicted_ms is not None:  # without a profile row there is nothing to compare
            self.predicted_s[label] = self.predicted_s.get(label, 0.0) + predicted_ms / 1000.0
            self.predicted_batches[label] = self.predicted_batches.get(label, 0) + 1

    def _label(self, label: str) -> str:
        """`label`, or "other" once MAX_LAYOUT_LABELS layouts have their own series; its series made."""
        if label not in self.observed and len(self.observed) >= MAX_LAYOUT_LABELS:
            label = OTHER_LAYOUT
        if label not in self.observed:
            debug.debug("first batch on layout %s", label)
            self.observed[label] = Tally(self.bounds)
        return label


# The daemon's loop works in these phases (one thread: while it does one, the others wait):
LOOP_PHASES = (
    "read",  # taking in requests (receive, parse, copy big rows into shared memory); events: messages
    "dispatch",  # starting a batch (split it, send the slices); events: batches
    "answer",  # the workers' messages that finished a batch (gather, reply); events: batches
    "workers",  # the workers' other messages (a slice that was not a batch's last, heartbeats); events: wakes
)
HOP = "hop"  # not loop time: a slice's trip to its worker and back beyond its compute; events: slices


class OwnTimes:
    """Where the daemon's own time goes, summed: seconds and events per loop phase and for the hop.

    What each costs per event is what `packrat simulate` charges the simulated daemon (docs/evaluation.md).
    Two clock reads per phase: cheap next to the work each one times.
    """

    def __init__(self) -> None:
        self.seconds = dict.fromkeys((*LOOP_PHASES, HOP), 0.0)
        self.events = dict.fromkeys((*LOOP_PHASES, HOP), 0)

    def add(self, part: str, seconds: float, events: int = 1) -> None:
        self.seconds[part] += seconds
        self.events[part] += events


def batch_predicted_ms(done: Answer) -> float | None:
    """The profile's prediction for the batch `done` was part of: its slowest slice's; None when a slice
    had no prediction (no profile, or no row for its threads)."""
    slowest = None
    for job in done.jobs:
        predicted = job.predicted_ms
        if predicted is None:
            return None
        if slowest is None or predicted > slowest:
            slowest = predicted
    return slowest


def first_of_batch(done: Answer) -> bool:
    """True for one answered request per batch: its first request not marked answered (a request is marked when
    TIMEOUT ends it in flight, or when its batch moved aside with its rows in, before its reply is counted), so
    every reply of the batch agrees on which."""
    if not done.jobs:
        return False
    requests = done.jobs[0].batch.requests
    if not requests[0].answered:  # nearly always: the generator below only when the first timed out
        return requests[0] is done.request
    return next((r for r in requests if not r.answered), None) is done.request


LENGTH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)


class Tokens:
    """A model of a free axis (a text model's tokens): each answered sequence's length, and per batch the tokens its
    slices computed (each padded to its own longest) against the requests' own. Padding waste is padded ÷ real: 1.0
    when every slice held one length, the model's longest ÷ the mean length when every request is padded to it."""

    def __init__(self) -> None:
        self.lengths = Tally(LENGTH_BUCKETS)
        self.real = 0
        self.padded = 0

    def answered(self, length: int, samples: int) -> None:
        for _ in range(samples):
            self.lengths.observe(length)

    def batch(self, jobs: Sequence[Any]) -> None:
        """A batch's slices (`requests.jobs.Job`, each with its rows and padded `length`) all answered."""
        self.padded += sum(job.rows * job.length for job in jobs)
        self.real += sum(request.samples * request.length for request in jobs[0].batch.requests)

    def to_json(self) -> dict[str, Any] | None:
        """`packrat status`'s account since start: the lengths' distribution and the padding waste (None: no
        sequence answered yet, or the model has no free axis)."""
        counts = list(self.lengths.counts)
        total = sum(counts)
        if not total:
            return None
        shares = [[bound, round(n / total, 4)] for bound, n in zip(LENGTH_BUCKETS, counts, strict=False) if n]
        return {
            "sequences": total,
            "mean_length": round(self.lengths.sum / total, 2),
            "length_shares": shares,  # [at most this many tokens, share of sequences] per non-empty bucket
            "padded_tokens": self.padded,
            "real_tokens": self.real,
            "padding_waste": round(self.padded / self.real, 4) if self.real else None,
        }


MIN_NOISE = 0.05  # a profile's noise is taken as at least this: medians of a few runs are not tighter


def profile_noise(profile: Profile | None) -> float:
    """How far a served latency may stray from the profile's prediction by noise alone: the median over the
    cells of p90 ÷ median − 1 (the cells' spread over their runs), at least MIN_NOISE."""
    spreads = [] if profile is None else [c.p90_ms / c.latency_ms - 1 for _, c in profile.items()
                                          if c.p90_ms is not None and c.latency_ms > 0]  # fmt: skip
    return max(MIN_NOISE, statistics.median(spreads)) if spreads else MIN_NOISE


def compared(layouts: LayoutTimes, noise: float) -> list[dict[str, Any]]:
    """Per layout served: its batches, their mean measured compute and the profile's mean prediction (of the
    batches that had one), and whether the two disagree by more than `noise` (either way)."""
    rows = []
    for label, tally in sorted(layouts.observed.items()):
        count = sum(tally.counts)
        if not count:
            continue
        predicted = layouts.predicted_batches.get(label, 0)
        predicted_ms = layouts.predicted_s[label] / predicted * 1000.0 if predicted else None
        measured_ms = tally.sum / count * 1000.0
        ratio = None if not predicted_ms else measured_ms / predicted_ms
        rows.append({"layout": label, "batches": count, "measured_ms": round(measured_ms, 4),
                     "predicted_ms": None if predicted_ms is None else round(predicted_ms, 4),
                     "ratio": None if ratio is None else round(ratio, 4),
                     "disagrees": ratio is not None and not 1 / (1 + noise) <= ratio <= 1 + noise})  # fmt: skip
    return rows
