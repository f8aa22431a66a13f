"""What the telemetry reads of the records that the layers above it make: protocols, not the records themselves.

The metrics, tallies and request log (this package) sit below the fleet and the request path (tests/test_layering.py):
they read an answered request (`requests.jobs.Completed`) and a finished plan change
(`fleet.reconciler.Reconfiguration`) but may not import them. These protocols name the attributes they read; the
records satisfy them as they are, and mypy checks that they do where the daemon hands one over.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol


class Worker(Protocol):
    """The worker that ran a slice (`fleet.pool.WorkerHandle`)."""

    @property
    def id(self) -> int: ...
    @property
    def pid(self) -> int | None: ...
    @property
    def threads(self) -> int: ...


class AnsweredRequest(Protocol):
    """One client's request (`requests.batcher.Request`)."""

    @property
    def request_id(self) -> Any: ...
    @property
    def samples(self) -> int: ...
    @property
    def length(self) -> int: ...
    @property
    def answered(self) -> bool: ...


class Batch(Protocol):
    """The batch a slice was part of (`requests.jobs.InFlightBatch`)."""

    @property
    def requests(self) -> Sequence[AnsweredRequest]: ...


class Slice(Protocol):
    """One slice of a batch on one worker (`requests.jobs.Job`)."""

    @property
    def worker(self) -> Worker: ...
    @property
    def rows(self) -> int: ...
    @property
    def predicted_ms(self) -> float | None: ...
    @property
    def batch(self) -> Batch: ...


class Answer(Protocol):
    """A request answered with its result (`requests.jobs.Completed`)."""

    @property
    def request(self) -> AnsweredRequest: ...
    @property
    def queue_ms(self) -> float: ...
    @property
    def compute_ms(self) -> float: ...
    @property
    def jobs(self) -> Sequence[Slice]: ...


class Reconfigured(Protocol):
    """A plan change that has finished (`fleet.reconciler.Reconfiguration`): its stages' monotonic stamps."""

    @property
    def first_serving(self) -> float | None: ...
    @property
    def serving(self) -> float | None: ...
    @property
    def retired(self) -> float | None: ...
    def seconds(self, stamp: float | None) -> float | None: ...
