"""Typed errors. Each message says what was wrong and what to do about it."""

from __future__ import annotations


class PackratError(Exception):
    """Base class of every error Packrat raises on purpose."""


class ProfileError(PackratError):
    """A profile file or table is malformed or cannot answer the question asked of it."""


class InfeasibleError(PackratError):
    """No plan can serve the batch with the given cores and profile."""

    def __init__(self, message: str, largest_servable_batch: int) -> None:
        super().__init__(message)
        self.largest_servable_batch = largest_servable_batch


class TopologyError(PackratError):
    """The CPU topology or cgroup limits could not be read or leave no usable core."""


class ModelSpecError(PackratError):
    """A model spec string does not name a loadable model."""


class PolicyError(PackratError):
    """A policy name is unknown or its arguments are invalid."""


class ConfigError(PackratError):
    """A command-line option or configuration value is invalid."""


class WorkerBootError(PackratError):
    """A worker failed before it was ready (pinning, threads, warm-up).

    A worker raises it for its template to report; the daemon raises it once several have failed in a
    row, and stops rather than re-fork a model that cannot start.
    """
