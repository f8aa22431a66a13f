"""The client library, importable as `packrat_daemon.client` (its home is `packrat_daemon.wire.client`)."""

from packrat_daemon.wire.client import *  # noqa: F403
from packrat_daemon.wire.client import __all__  # noqa: F401
