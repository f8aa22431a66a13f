"""What a load run sends and when: the samples per request and open-loop arrival processes. Pure and seeded.

    mix = BatchMix.parse("1:0.5,8:0.3,32:0.2")          # or BatchMix.single(8)
    schedule = open_loop_schedule(Poisson(200.0), mix, duration_s=60, rng=random.Random(7))
    # [(0.0041, 1), (0.0113, 8), …]: (seconds after the start, samples), in time order

`packrat load` replays a schedule against a daemon and `packrat simulate` against a virtual clock, so both
see the same traffic for the same seed. Every process draws from the one `random.Random` it is given, in
a fixed order (per arrival: its gap, then its samples), and nothing here reads a clock.
"""

from __future__ import annotations

import bisect
import csv
import itertools
import math
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from packrat_daemon.wire.errors import ConfigError

# A schedule is held in memory (about 100 bytes an arrival): past this a run is refused instead of
# swapping; callers that need more (long simulations) pass max_requests or iterate `arrivals` lazily.
MAX_SCHEDULE = 5_000_000
LAST_BEFORE_ONE = math.nextafter(1.0, 0.0)  # keeps an arrival drawn at the window's very end inside it


def _positive_number(text: str, what: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(f"{what} must be a number, got {text!r}") from None
    if not (value > 0 and math.isfinite(value)):
        raise ConfigError(f"{what} must be a positive finite number, got {text!r}")
    return value


def _check_amount(value: float, what: str, unit: str, *, zero_allowed: bool = False) -> None:
    """ConfigError unless `value` is a finite amount of `unit` above zero (or zero, where it is allowed)."""
    if not ((value >= 0 if zero_allowed else value > 0) and math.isfinite(value)):
        amount = f"zero or more {unit}" if zero_allowed else f"a positive number of {unit}"
        raise ConfigError(f"{what} must be {amount}, got {value}")


def _positive_int(text: str, what: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ConfigError(f"{what} must be a whole number, got {text!r}") from None
    if value < 1:
        raise ConfigError(f"{what} must be at least 1, got {text!r}")
    return value


# ------------------------------------------------------------------------------- samples per request


@dataclass(frozen=True)
class BatchMix:
    """Samples per request: sizes drawn with the given weights (relative; they need not sum to 1)."""

    sizes: tuple[int, ...]
    weights: tuple[float, ...]
    _cumulative: tuple[float, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.sizes or len(self.sizes) != len(self.weights):
            raise ConfigError("a batch mix needs one weight per batch size, e.g. '1:0.5,8:0.3,32:0.2'")
        if len(set(self.sizes)) != len(self.sizes):
            raise ConfigError(f"a batch size appears twice in the mix {self.describe()!r}; give each size once")
        if any(size < 1 for size in self.sizes):
            raise ConfigError(f"batch sizes must be at least 1, got {list(self.sizes)}")
        if any(not (weight > 0 and math.isfinite(weight)) for weight in self.weights):
            raise ConfigError(f"batch weights must be positive finite numbers, got {list(self.weights)}")
        total = sum(self.weights)
        object.__setattr__(self, "_cumulative", tuple(itertools.accumulate(w / total for w in self.weights)))

    @classmethod
    def single(cls, size: int) -> BatchMix:
        return cls((size,), (1.0,))

    @classmethod
    def parse(cls, text: str) -> BatchMix:
        """'8' (every request 8 samples) or 'B:W,B:W,…' (size B with relative weight W)."""
        items = [item.strip() for item in text.split(",")]
        if not text.strip() or "" in items:
            raise ConfigError(f"a batch mix looks like '8' or '1:0.5,8:0.3,32:0.2', got {text!r}")
        if len(items) == 1 and ":" not in items[0]:
            return cls.single(_positive_int(items[0], "the batch size"))
        sizes, weights = [], []
        for item in items:
            size, sep, weight = item.partition(":")
            if not sep:
                raise ConfigError(f"each item of a batch mix is SIZE:WEIGHT, e.g. '8:0.3'; got {item!r} in {text!r}")
            sizes.append(_positive_int(size.strip(), "a batch size"))
            weights.append(_positive_number(weight.strip(), f"the weight of batch size {size.strip()}"))
        return cls(tuple(sizes), tuple(weights))

    def draw(self, rng: random.Random) -> int:
        """One request's samples. Consumes exactly one `rng.random()`, whatever the mix."""
        index = bisect.bisect_right(self._cumulative, rng.random())
        return self.sizes[min(index, len(self.sizes) - 1)]  # min: float rounding may leave the last sum < 1

    @property
    def mean(self) -> float:
        """Mean samples per request."""
        return sum(s * w for s, w in zip(self.sizes, self.weights, strict=True)) / sum(self.weights)

    @property
    def largest(self) -> int:
        return max(self.sizes)

    def describe(self) -> str:
        if len(self.sizes) == 1:
            return str(self.sizes[0])
        return ",".join(f"{s}:{w:g}" for s, w in zip(self.sizes, self.weights, strict=True))


# ---------------------------------------------------------------------------------- arrival processes


class ArrivalProcess(Protocol):
    """An open-loop arrival process: when requests arrive, whatever the server does."""

    @property
    def finite(self) -> bool:
        """True when the process ends by itself (a trace); others need a duration or a request count."""
        ...

    @property
    def mean_rate_rps(self) -> float:
        """The long-run offered rate in requests per second."""
        ...

    def arrivals(self, mix: BatchMix, rng: random.Random) -> Iterator[tuple[float, int]]:
        """(seconds after the start, samples) in time order; endless unless `finite`."""
        ...

    def describe(self) -> str: ...


@dataclass(frozen=True)
class Poisson:
    """Arrivals at `rate_rps` on average, with exponential gaps (independent clients).

    Over a set duration the count is fixed by default (`within`): a Poisson process over D seconds holds
    a random count, which strays from rate × D by about 1/sqrt(rate × D) (±8% over 15 s at 10/s) before
    anything is sent, so a run would not offer the rate it was asked for. `fixed_count=False` draws it.
    """

    rate_rps: float
    fixed_count: bool = True
    finite = False

    def __post_init__(self) -> None:
        _check_amount(self.rate_rps, "the arrival rate", "requests per second")

    @property
    def mean_rate_rps(self) -> float:
        return self.rate_rps

    def arrivals(self, mix: BatchMix, rng: random.Random) -> Iterator[tuple[float, int]]:
        t = 0.0
        while True:
            t += rng.expovariate(self.rate_rps)
            yield t, mix.draw(rng)

    def describe(self) -> str:
        return f"poisson {self.rate_rps:g}/s" + ("" if self.fixed_count else " (count drawn)")


@dataclass(frozen=True)
class PoissonCount:
    """A Poisson process over `duration_s` given its count: n = round(rate × duration) arrivals (at least
    one) placed independently and uniformly over the window, in time order. Given its count, a Poisson
    process is exactly this, so gaps and burstiness are Poisson's while the offered rate is the one asked."""

    rate_rps: float
    duration_s: float
    finite = True

    def __post_init__(self) -> None:
        _check_amount(self.duration_s, "the duration", "seconds")

    @property
    def count(self) -> int:
        return max(1, round(self.rate_rps * self.duration_s))

    @property
    def mean_rate_rps(self) -> float:
        return self.count / self.duration_s

    def arrivals(self, mix: BatchMix, rng: random.Random) -> Iterator[tuple[float, int]]:
        # The sorted uniforms one at a time, without holding them: the least of m uniforms over [u, 1) is
        # 1 - (1 - u)·V^(1/m) for V uniform. A run of hours at a high rate stays lazy, as `Poisson` is.
        u = 0.0
        for left in range(self.count, 0, -1):
            u = 1.0 - (1.0 - u) * rng.random() ** (1.0 / left)
            yield min(u, LAST_BEFORE_ONE) * self.duration_s, mix.draw(rng)

    def describe(self) -> str:
        return f"poisson {self.rate_rps:g}/s, {self.count} arrivals in {self.duration_s:g} s"


def within(process: ArrivalProcess, duration_s: float | None) -> ArrivalProcess:
    """The process a run of `duration_s` draws from: a Poisson with a fixed count, exactly round(rate × duration)
    arrivals (the count needs the duration)."""
    if duration_s is not None and isinstance(process, Poisson) and process.fixed_count:
        return PoissonCount(process.rate_rps, duration_s)
    return process


@dataclass(frozen=True)
class Burst:
    """On/off traffic: Poisson at `rate_rps` for `on_s` seconds, then nothing for `off_s`, repeated; on first."""

    on_s: float
    off_s: float
    rate_rps: float
    finite = False

    def __post_init__(self) -> None:
        _check_amount(self.on_s, "a burst's on time", "seconds")
        _check_amount(self.off_s, "a burst's off time", "seconds", zero_allowed=True)
        _check_amount(self.rate_rps, "a burst's rate", "requests per second")

    @classmethod
    def parse(cls, text: str) -> Burst:
        """'ON_S:OFF_S:RATE', e.g. '2:8:500' (2 s at 500 req/s, 8 s idle)."""
        parts = text.split(":")
        if len(parts) != 3:
            raise ConfigError(f"a burst is ON_S:OFF_S:RATE, e.g. '2:8:500'; got {text!r}")
        on_s = _positive_number(parts[0], "a burst's on time")
        try:
            off_s = float(parts[1])
        except ValueError:
            raise ConfigError(f"a burst's off time must be a number of seconds, got {parts[1]!r}") from None
        return cls(on_s, off_s, _positive_number(parts[2], "a burst's rate"))

    @property
    def mean_rate_rps(self) -> float:
        return self.rate_rps * self.on_s / (self.on_s + self.off_s)

    def arrivals(self, mix: BatchMix, rng: random.Random) -> Iterator[tuple[float, int]]:
        # A Poisson process on the clock that runs only while "on", mapped to wall time: the same law as
        # restarting it at each on phase (it is memoryless), with no arrival lost at a phase boundary.
        on_time = 0.0
        while True:
            on_time += rng.expovariate(self.rate_rps)
            cycles = math.floor(on_time / self.on_s)
            yield on_time + cycles * self.off_s, mix.draw(rng)

    def describe(self) -> str:
        return f"burst {self.on_s:g}s on at {self.rate_rps:g}/s, {self.off_s:g}s off"


@dataclass(frozen=True)
class Trace:
    """Recorded arrivals: rows of (seconds after the start, samples), replayed as they are."""

    rows: tuple[tuple[float, int], ...]
    source: str = "trace"
    finite = True

    def __post_init__(self) -> None:
        if not self.rows:
            raise ConfigError(f"the trace {self.source} has no rows; it needs at least one 't_s,samples' line")

    @classmethod
    def read(cls, path: str | Path) -> Trace:
        """A CSV file with a header naming the columns `t_s` (seconds after the start, non-decreasing, ≥ 0)
        and `samples` (a positive whole number); other columns are ignored."""
        path = Path(path)
        try:
            handle = path.open(newline="")
        except OSError as exc:
            raise ConfigError(f"cannot read the trace file {path}: {exc.strerror}") from None
        rows: list[tuple[float, int]] = []
        with handle:
            reader = csv.DictReader(handle)
            missing = {"t_s", "samples"} - set(reader.fieldnames or ())
            if missing:
                raise ConfigError(
                    f"the trace file {path} needs a header with the columns t_s,samples (missing: "
                    f"{', '.join(sorted(missing))})"
                )
            for row in reader:
                where = f"{path}, line {reader.line_num}"
                if not any((value or "").strip() for value in row.values()):
                    continue  # blank line
                try:
                    t_s = float(row["t_s"])
                except (TypeError, ValueError):
                    raise ConfigError(f"{where}: t_s must be a number of seconds, got {row['t_s']!r}") from None
                if not (t_s >= 0 and math.isfinite(t_s)):
                    raise ConfigError(f"{where}: t_s must be zero or more seconds, got {row['t_s']!r}")
                if rows and t_s < rows[-1][0]:
                    raise ConfigError(
                        f"{where}: t_s goes back in time ({t_s} after {rows[-1][0]}); sort the trace by t_s"
                    )
                samples = _positive_int((row["samples"] or "").strip(), f"{where}: samples")
                rows.append((t_s, samples))
        return cls(tuple(rows), str(path))

    def write(self, path: str | Path) -> None:
        """The CSV `read` reads (the header t_s,samples, in time order), to microseconds."""
        with Path(path).open("w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(("t_s", "samples"))
            writer.writerows((f"{t_s:.6f}", samples) for t_s, samples in self.rows)

    @property
    def mean_rate_rps(self) -> float:
        span = self.rows[-1][0]
        return len(self.rows) / span if span > 0 else math.inf

    def arrivals(self, mix: BatchMix, rng: random.Random) -> Iterator[tuple[float, int]]:
        """The trace's own sample counts; the mix and the generator are not used."""
        return iter(self.rows)

    def describe(self) -> str:
        return f"trace {self.source} ({len(self.rows)} requests)"


# ----------------------------------------------------------------------------------------- schedules


def open_loop_schedule(
    process: ArrivalProcess,
    mix: BatchMix,
    *,
    duration_s: float | None = None,
    requests: int | None = None,
    rng: random.Random,
    max_requests: int = MAX_SCHEDULE,
) -> list[tuple[float, int]]:
    """The arrivals before `duration_s` and at most `requests` of them (either or both; a trace may give
    neither), as (seconds after the start, samples) in time order."""
    if duration_s is not None:
        _check_amount(duration_s, "the duration", "seconds")
    if requests is not None and requests < 1:
        raise ConfigError(f"the number of requests must be at least 1, got {requests}")
    if requests is not None and requests > max_requests:
        raise ConfigError(f"{requests:,} requests are more than the {max_requests:,} a schedule holds; ask for fewer")
    if duration_s is None and requests is None and not process.finite:
        raise ConfigError(f"{process.describe()} never ends by itself: give a duration or a number of requests")
    if requests is None and duration_s is not None and process.mean_rate_rps * duration_s > max_requests:
        raise ConfigError(
            f"{process.describe()} for {duration_s:g} s is about {process.mean_rate_rps * duration_s:,.0f} requests, "
            f"more than the {max_requests:,} a schedule holds; shorten the duration or lower the rate"
        )
    limit = min(requests if requests is not None else max_requests, max_requests)
    schedule: list[tuple[float, int]] = []
    for t, samples in within(process, duration_s).arrivals(mix, rng):
        if (duration_s is not None and t >= duration_s) or len(schedule) >= limit:
            break
        schedule.append((t, samples))
    return schedule
