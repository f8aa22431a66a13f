"""Latency profiles: L(threads, batch) for one model on one machine, with sample counts.

The file format is CSV with at least the header ``threads,batch,latency_ms``; extra columns are
allowed (``samples``, ``p90_ms``, ``runtime``, ``precision``, ...), so profiles measured elsewhere can be
imported. Rows naming the same (threads, batch) cell are merged by a sample-weighted mean, never dropped.
One file may hold several runtimes' rows, each at one or more precisions: a profile is keyed by its
runtime and precision (`profile_key`); rows without a precision (files written before the column
existed) are fp32.
"""

from __future__ import annotations

import csv
import io
import math
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from packrat_daemon.wire.errors import ProfileError

REQUIRED_COLUMNS = ("threads", "batch", "latency_ms")
DEFAULT_PRECISION = "fp32"


def profile_key(runtime: str, precision: str = DEFAULT_PRECISION) -> str:
    """How `parse_all` names one runtime's rows at one precision: "openvino", "openvino/bf16"."""
    return runtime if precision == DEFAULT_PRECISION else f"{runtime}/{precision}"


@dataclass(frozen=True)
class Cell:
    """One measured cell: the median latency of `samples` runs of `batch` inputs on `threads` threads."""

    latency_ms: float
    samples: int = 1
    p90_ms: float | None = None

    def merged(self, other: Cell) -> Cell:
        total = self.samples + other.samples
        latency = (self.latency_ms * self.samples + other.latency_ms * other.samples) / total
        p90 = None
        if self.p90_ms is not None and other.p90_ms is not None:
            p90 = (self.p90_ms * self.samples + other.p90_ms * other.samples) / total
        elif self.p90_ms is not None or other.p90_ms is not None:
            p90 = self.p90_ms if self.p90_ms is not None else other.p90_ms
        return Cell(latency, total, p90)


class Profile:
    """An immutable latency table by (threads, batch).

    ``lhat(t, b)`` is the latency the solver assumes for an instance with `t` threads given `b`
    inputs: the latency of the smallest profiled batch b' >= b with the same t (latency is
    non-decreasing in the batch), or None when b exceeds every batch profiled for t.
    """

    def __init__(
        self,
        cells: Mapping[tuple[int, int], Cell],
        *,
        model: str = "",
        runtime: str = "",
        precision: str = DEFAULT_PRECISION,
    ) -> None:
        for (threads, batch), cell in cells.items():
            _check_cell(threads, batch, cell.latency_ms, where=f"cell ({threads}, {batch})")
        self._cells: dict[tuple[int, int], Cell] = dict(sorted(cells.items()))
        self.model = model
        self.runtime = runtime
        self.precision = precision
        rows: dict[int, list[tuple[int, float]]] = {}
        for (threads, batch), cell in self._cells.items():
            rows.setdefault(threads, []).append((batch, cell.latency_ms))
        self._rows = {t: tuple(r) for t, r in rows.items()}

    # -- construction -------------------------------------------------------------------------
    @classmethod
    def from_latencies(cls, table: Mapping[tuple[int, int], float], **meta: str) -> Profile:
        return cls({key: Cell(float(value)) for key, value in table.items()}, **meta)

    @classmethod
    def read_csv(
        cls, path: str | os.PathLike[str], runtime: str | None = None, precision: str = DEFAULT_PRECISION
    ) -> Profile:
        return cls.parse_csv(_read_text(path), source=str(path), runtime=runtime, precision=precision)

    @classmethod
    def read_all(cls, path: str | os.PathLike[str]) -> dict[str, Profile]:
        return cls.parse_all(_read_text(path), source=str(path))

    @classmethod
    def parse_csv(
        cls, text: str, *, source: str = "<profile>", runtime: str | None = None, precision: str = DEFAULT_PRECISION
    ) -> Profile:
        """One runtime's profile at `precision`. A file with a `runtime` column may hold several; name one then."""
        profiles = cls.parse_all(text, source=source)
        if runtime is not None:
            if profile_key(runtime, precision) in profiles:
                return profiles[profile_key(runtime, precision)]
            if len(profiles) == 1 and "" in profiles:
                return profiles[""]  # a profile that does not say which runtime measured it
            at = "" if precision == DEFAULT_PRECISION else f" at {precision}"
            raise ProfileError(f"{source}: no rows for runtime {runtime!r}{at}; it has {', '.join(sorted(profiles))}")
        if len(profiles) > 1:
            raise ProfileError(
                f"{source}: holds profiles of several runtimes ({', '.join(sorted(profiles))}); "
                "choose one with --runtime"
            )
        return next(iter(profiles.values()))

    @classmethod
    def parse_all(cls, text: str, *, source: str = "<profile>") -> dict[str, Profile]:
        """Every runtime's profile in the file, by `profile_key` ('' when the file does not say the runtime)."""
        header: list[str] | None = None
        by_runtime: dict[tuple[str, str], dict[tuple[int, int], Cell]] = {}
        meta: dict[str, str] = {}
        # Line by line, so a stray quote in a comment cannot swallow the rows after it and every
        # error names the file's own line number.
        for line_number, line in enumerate(text.splitlines(), start=1):
            stripped = line.strip()
            if not stripped:
                continue
            if stripped.startswith("#"):
                # Comment lines may carry metadata: "# model: builtin:resnet50".
                key, sep, value = stripped[1:].partition(":")
                if sep and key.strip() in ("model", "runtime"):
                    meta[key.strip()] = value.strip()
                continue
            try:
                row = next(csv.reader([line]))
            except csv.Error as exc:
                raise ProfileError(f"{source}:{line_number}: not a CSV line: {exc}") from None
            if header is None:
                header = [name.strip().lower() for name in row]
                missing = [name for name in REQUIRED_COLUMNS if name not in header]
                if missing:
                    raise ProfileError(
                        f"{source}:{line_number}: header lacks column(s) {', '.join(missing)}; "
                        f"a profile's header must contain {','.join(REQUIRED_COLUMNS)}"
                    )
                continue
            if len(row) != len(header):
                raise ProfileError(
                    f"{source}:{line_number}: expected {len(header)} fields as in the header, got {len(row)}"
                )
            record = dict(zip(header, (field.strip() for field in row), strict=True))
            where = f"{source}:{line_number}"
            threads = _parse_int(record["threads"], "threads", where)
            batch = _parse_int(record["batch"], "batch", where)
            latency = _parse_float(record["latency_ms"], "latency_ms", where)
            samples = _parse_int(record["samples"], "samples", where) if record.get("samples") else 1
            if samples < 1:
                raise ProfileError(f"{where}: samples must be >= 1, got {samples}")
            p90 = _parse_float(record["p90_ms"], "p90_ms", where) if record.get("p90_ms") else None
            _check_cell(threads, batch, latency, where=where)
            cell = Cell(latency, samples, p90)
            row_runtime = record.get("runtime") or meta.get("runtime", "")
            table = by_runtime.setdefault((row_runtime, record.get("precision") or DEFAULT_PRECISION), {})
            cell_key = (threads, batch)
            table[cell_key] = table[cell_key].merged(cell) if cell_key in table else cell
        if header is None:
            raise ProfileError(f"{source}: empty profile; expected a header {','.join(REQUIRED_COLUMNS)}")
        if not by_runtime:
            raise ProfileError(f"{source}: the profile has a header but no rows")
        model = meta.get("model", "")
        return {
            profile_key(name, precision): cls(table, model=model, runtime=name, precision=precision)
            for (name, precision), table in by_runtime.items()
        }

    # -- queries ------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._cells)

    def __iter__(self) -> Iterator[tuple[int, int]]:
        return iter(self._cells)

    def __contains__(self, key: object) -> bool:
        return key in self._cells

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Profile) and self._cells == other._cells

    def __repr__(self) -> str:
        return f"Profile({len(self)} cells, threads={self.threads()}, model={self.model!r})"

    def cell(self, threads: int, batch: int) -> Cell:
        return self._cells[(threads, batch)]

    def latency(self, threads: int, batch: int) -> float:
        return self._cells[(threads, batch)].latency_ms

    def items(self) -> Iterable[tuple[tuple[int, int], Cell]]:
        return self._cells.items()

    def threads(self) -> list[int]:
        return sorted(self._rows)

    def batches(self, threads: int | None = None) -> list[int]:
        if threads is not None:
            return [b for b, _ in self._rows.get(threads, ())]
        return sorted({b for _, b in self._cells})

    def row(self, threads: int) -> tuple[tuple[int, float], ...]:
        """(batch, latency_ms) pairs for `threads`, sorted by batch."""
        return self._rows.get(threads, ())

    def max_batch(self, threads: int) -> int:
        row = self._rows.get(threads)
        return row[-1][0] if row else 0

    def lhat(self, threads: int, batch: int) -> float | None:
        for profiled_batch, latency in self._rows.get(threads, ()):
            if profiled_batch >= batch:
                return latency
        return None

    def merged(self, other: Profile) -> Profile:
        cells = dict(self._cells)
        for key, cell in other.items():
            cells[key] = cells[key].merged(cell) if key in cells else cell
        return Profile(
            cells, model=self.model or other.model, runtime=self.runtime or other.runtime, precision=self.precision
        )

    # -- output -------------------------------------------------------------------------------
    def to_csv(self) -> str:
        out = io.StringIO()
        if self.model:
            out.write(f"# model: {self.model}\n")
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(["threads", "batch", "latency_ms", "samples", "p90_ms", "runtime", "precision"])
        for (threads, batch), cell in self._cells.items():
            p90 = "" if cell.p90_ms is None else _number(cell.p90_ms)
            row = [threads, batch, _number(cell.latency_ms), cell.samples, p90, self.runtime, self.precision]
            writer.writerow(row)
        return out.getvalue()

    def write_csv(self, path: str | os.PathLike[str]) -> None:
        write_profiles(path, [self])


def write_profiles(path: str | os.PathLike[str], profiles: Sequence[Profile]) -> None:
    """One CSV holding several runtimes' rows (the `runtime` and `precision` columns tell them apart).

    Written atomically, so a crash or Ctrl-C never leaves a half-written profile behind.
    """
    path = Path(path)
    text = "".join(
        p.to_csv() if k == 0 else p.to_csv().split("threads,batch,", 1)[1].split("\n", 1)[1]
        for k, p in enumerate(profiles)
    )
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def _read_text(path: str | os.PathLike[str]) -> str:
    path = Path(path)
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ProfileError(f"profile file {path} does not exist; measure one with `packrat profile`") from None
    except OSError as exc:
        raise ProfileError(f"cannot read profile file {path}: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise ProfileError(
            f"profile file {path} is not UTF-8 text (byte {exc.start}); give the CSV that `packrat profile` wrote"
        ) from None


def _number(value: float) -> str:
    """Shortest text that reads back as the same float (no precision lost in a round trip)."""
    return repr(float(value))


def _parse_int(text: str, column: str, where: str) -> int:
    try:
        value = float(text)
    except ValueError:
        raise ProfileError(f"{where}: column {column} must be an integer, got {text!r}") from None
    if not value.is_integer():
        raise ProfileError(f"{where}: column {column} must be an integer, got {text!r}")
    return int(value)


def _parse_float(text: str, column: str, where: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ProfileError(f"{where}: column {column} must be a number, got {text!r}") from None


def _check_cell(threads: int, batch: int, latency: float, *, where: str) -> None:
    if threads < 1:
        raise ProfileError(f"{where}: threads must be >= 1, got {threads}")
    if batch < 1:
        raise ProfileError(f"{where}: batch must be >= 1, got {batch}")
    if not math.isfinite(latency) or latency <= 0:
        raise ProfileError(f"{where}: latency_ms must be a positive finite number, got {latency}")
