"""Sequence lengths, drawn from a distribution: what `packrat load --lengths` sends, `packrat simulate` and
`bench/lengths.py` model. Pure and seeded: numpy only, nothing here reads a clock or a model.

    lengths = parse_lengths("lognormal:median=12,p99=64,max=128")   # or uniform:8..64, fixed:128, file:L.txt
    lengths.sample(np.random.default_rng(0), 5)                      # array([ 9, 14,  6, 31, 12])
    lengths.longest, lengths.describe()                              # 128, 'lognormal:median=12,p99=64,max=128'

Every distribution draws whole lengths in [shortest, longest], so a caller checks those two against a model once.
`describe()` gives the text `parse_lengths` reads back.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from packrat_daemon.wire.errors import ConfigError

# The standard normal's 99th percentile: a lognormal's p99 is median · exp(sigma · Z99).
Z99 = 2.3263478740408408
# A lognormal whose [min, max] holds less of it than this is refused: its draws would be almost all redrawn, and
# what came out would not be the distribution asked for.
LEAST_MASS_INSIDE = 0.01
MOST_FILE_LENGTHS = 10_000_000
FORMS = "fixed:N, uniform:LO..HI, lognormal:median=M,p99=P,max=X (or sigma=S for p99; min=N), or file:PATH"


def _whole(text: str, what: str) -> int:
    try:
        value = int(text.strip())
    except ValueError:
        raise ConfigError(f"{what} must be a whole number of tokens, got {text.strip()!r}") from None
    if value < 1:
        raise ConfigError(f"{what} must be at least 1 token, got {value}")
    return value


def _positive(text: str, what: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(f"{what} must be a number, got {text.strip()!r}") from None
    if not (value > 0 and math.isfinite(value)):
        raise ConfigError(f"{what} must be a positive finite number, got {text.strip()!r}")
    return value


def _number(value: float) -> str:
    return f"{value:g}"


@dataclass(frozen=True)
class Fixed:
    """Every request at one length."""

    length: int

    def __post_init__(self) -> None:
        if self.length < 1:
            raise ConfigError(f"a length must be at least 1 token, got {self.length}")

    @property
    def shortest(self) -> int:
        return self.length

    @property
    def longest(self) -> int:
        return self.length

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return np.full(n, self.length, dtype=np.int64)

    def describe(self) -> str:
        return f"fixed:{self.length}"


@dataclass(frozen=True)
class Uniform:
    """Every length from `low` to `high` (both included) equally likely."""

    low: int
    high: int

    def __post_init__(self) -> None:
        if not 1 <= self.low <= self.high:
            raise ConfigError(f"uniform:LO..HI needs 1 <= LO <= HI, got {self.low}..{self.high}")

    @property
    def shortest(self) -> int:
        return self.low

    @property
    def longest(self) -> int:
        return self.high

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return rng.integers(self.low, self.high, size=n, endpoint=True, dtype=np.int64)

    def describe(self) -> str:
        return f"uniform:{self.low}..{self.high}"


@dataclass(frozen=True)
class LogNormal:
    """A lognormal of `median` and `sigma` (the log's standard deviation), rounded to whole tokens and kept to
    [`low`, `high`]: a length drawn outside is drawn again (truncated, not clipped, so no length piles up at a
    bound). Given as its median and 99th percentile, the p99 is the untruncated distribution's."""

    median: float
    sigma: float
    high: int
    low: int = 1

    def __post_init__(self) -> None:
        if not (self.median > 0 and self.sigma > 0 and math.isfinite(self.median) and math.isfinite(self.sigma)):
            raise ConfigError(f"a lognormal needs a positive median and sigma, got {self.median} and {self.sigma}")
        if not 1 <= self.low <= self.high:
            raise ConfigError(f"a lognormal's bounds need 1 <= min <= max, got min={self.low}, max={self.high}")
        inside = self.mass_inside()
        if inside < LEAST_MASS_INSIDE:
            raise ConfigError(
                f"lognormal median={_number(self.median)} puts {inside:.2%} of its lengths in [{self.low}, "
                f"{self.high}]: bring the median inside the bounds, or widen them"
            )

    @classmethod
    def from_p99(cls, median: float, p99: float, high: int, low: int = 1) -> LogNormal:
        if not p99 > median:
            raise ConfigError(f"a lognormal's p99 must lie above its median, got median={median:g}, p99={p99:g}")
        return cls(median, math.log(p99 / median) / Z99, high, low)

    @property
    def mu(self) -> float:
        return math.log(self.median)

    @property
    def p99(self) -> float:
        return self.median * math.exp(self.sigma * Z99)

    @property
    def shortest(self) -> int:
        return self.low

    @property
    def longest(self) -> int:
        return self.high

    def _cdf(self, x: float) -> float:
        return 0.5 * (1.0 + math.erf((math.log(x) - self.mu) / (self.sigma * math.sqrt(2.0))))

    def mass_inside(self) -> float:
        """The share of the untruncated distribution that rounds into [low, high]."""
        below = self._cdf(self.low - 0.5) if self.low > 1 else 0.0
        return self._cdf(self.high + 0.5) - below

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        out = np.empty(n, dtype=np.int64)
        filled = 0
        while filled < n:  # each round keeps at least LEAST_MASS_INSIDE of its draws on average
            want = n - filled
            draws = np.rint(rng.lognormal(self.mu, self.sigma, size=int(want / self.mass_inside()) + 8))
            kept = draws[(draws >= self.low) & (draws <= self.high)][:want]
            out[filled : filled + kept.size] = kept
            filled += kept.size
        return out

    def describe(self) -> str:
        low = f",min={self.low}" if self.low > 1 else ""
        return f"lognormal:median={_number(self.median)},p99={_number(round(self.p99, 6))},max={self.high}{low}"


@dataclass(frozen=True)
class Empirical:
    """Lengths drawn (with replacement, each equally likely) from a list: a file of real requests' lengths."""

    lengths: tuple[int, ...]
    source: str = ""
    _array: np.ndarray = field(init=False, repr=False, compare=False)  # drawn from, made once

    def __post_init__(self) -> None:
        if not self.lengths:
            raise ConfigError(f"{self.source or 'the list of lengths'} holds no lengths; give one integer per line")
        if min(self.lengths) < 1:
            raise ConfigError(f"{self.source or 'a length'}: lengths must be at least 1 token, got {min(self.lengths)}")
        object.__setattr__(self, "_array", np.asarray(self.lengths, dtype=np.int64))

    @classmethod
    def read(cls, path: str | Path) -> Empirical:
        """One whole number per line; blank lines and lines starting with # are skipped."""
        try:
            text = Path(path).read_text()
        except OSError as exc:
            raise ConfigError(f"cannot read the lengths file {path}: {exc.strerror or exc}") from None
        lengths = []
        for number, line in enumerate(text.splitlines(), 1):
            line = line.strip()
            if line and not line.startswith("#"):
                lengths.append(_whole(line, f"{path}, line {number}"))
                if len(lengths) > MOST_FILE_LENGTHS:
                    raise ConfigError(f"{path} holds more than {MOST_FILE_LENGTHS} lengths; give a sample of them")
        return cls(tuple(lengths), str(path))

    @property
    def shortest(self) -> int:
        return int(self._array.min())

    @property
    def longest(self) -> int:
        return int(self._array.max())

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return self._array[rng.integers(0, self._array.size, size=n)]

    def describe(self) -> str:
        return f"file:{self.source}"


Lengths = Fixed | Uniform | LogNormal | Empirical


def _parameters(text: str, known: tuple[str, ...]) -> dict[str, str]:
    values: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, equals, value = item.partition("=")
        name = name.strip()
        if not equals or name not in known:
            raise ConfigError(f"lognormal takes {', '.join(f'{k}=' for k in known)}; cannot read {item!r}")
        if name in values:
            raise ConfigError(f"lognormal: {name}= is given twice")
        values[name] = value
    return values


def _lognormal(text: str) -> LogNormal:
    given = _parameters(text, ("median", "p99", "sigma", "max", "min"))
    if "median" not in given or "max" not in given:
        raise ConfigError("lognormal needs median= and max= (the longest length to send, e.g. the model's)")
    if ("p99" in given) == ("sigma" in given):
        raise ConfigError("lognormal needs one of p99= (its 99th percentile) or sigma= (the log's standard deviation)")
    median = _positive(given["median"], "lognormal's median")
    high = _whole(given["max"], "lognormal's max")
    low = _whole(given["min"], "lognormal's min") if "min" in given else 1
    if "p99" in given:
        return LogNormal.from_p99(median, _positive(given["p99"], "lognormal's p99"), high, low)
    return LogNormal(median, _positive(given["sigma"], "lognormal's sigma"), high, low)


def _uniform(text: str) -> Uniform:
    low, dots, high = text.partition("..")
    if not dots:
        raise ConfigError(f"write uniform:LO..HI (both included), e.g. uniform:8..64; got uniform:{text}")
    return Uniform(_whole(low, "uniform's LO"), _whole(high, "uniform's HI"))


def parse_lengths(text: str) -> Lengths:
    """A distribution from its text: `fixed:N`, `uniform:LO..HI`, `lognormal:median=M,p99=P,max=X`, `file:PATH`,
    or the path of an existing file of lengths (one per line). ConfigError, listing the forms, for anything else."""
    name, colon, rest = text.strip().partition(":")
    if colon and name == "fixed":
        return Fixed(_whole(rest, "fixed's length"))
    if colon and name == "uniform":
        return _uniform(rest)
    if colon and name == "lognormal":
        return _lognormal(rest)
    if colon and name == "file":
        return Empirical.read(rest)
    if Path(text).is_file():
        return Empirical.read(text)
    raise ConfigError(f"cannot read the lengths {text!r}; give {FORMS}")
