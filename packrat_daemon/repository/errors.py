"""The repository's typed errors: each says what to change."""

from __future__ import annotations

from packrat_daemon.wire.errors import ConfigError


class RepositoryError(ConfigError):
    """The repository (its folders, config.pbtxt files or TOML) cannot be served as it is; exit 2 at start."""


class UnknownModel(RepositoryError):
    """A load or unload named a model the repository does not hold."""
