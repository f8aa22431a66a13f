"""The gateway's limits on what a REST client may make it hold, and for how long (docs/oip.md, "Limits").

Each has a default and a worst case written down there: memory is bounded by connections × what one connection
may hold while its head arrives, plus the request bodies being received at once; time by the timeouts, so a
client that stops sending gives its connection back. `packrat oip --limit NAME=VALUE` changes one.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from packrat_daemon.wire.errors import ConfigError


@dataclass(frozen=True)
class GatewayLimits:
    # REST connections open at once; one more is answered 503 (Retry-After: 1) and closed. Each may hold a head
    # of up to `header_bytes` and uvicorn's read-ahead of a body (64 KiB), besides its share of the bodies.
    max_connections: int = 1000
    # A request head (request line and header fields) longer than this, or with more fields, is answered 431.
    # Real heads are under 2 KiB; 64 KiB leaves room for long tokens and proxies' forwarding headers.
    header_bytes: int = 64 << 10
    header_fields: int = 100
    # Seconds from a connection (or its first byte after an answer) to the end of the head: else 408.
    header_timeout_s: float = 10.0
    # The longest pause between two parts of a body, and the longest a whole body may take: else 408. At 10
    # Mbit/s the largest JSON request of ResNet-50 at batch 16 (77 MB) takes 62 s.
    body_idle_timeout_s: float = 10.0
    body_timeout_s: float = 120.0
    # A connection with no request for this long after its last answer is closed (HTTP keep-alive).
    idle_timeout_s: float = 5.0
    # Request bodies being received at once, all connections together; a body that would take the total past
    # it is answered 429 (Retry-After: 1), unless it is the only one being received (the largest request the
    # model takes is always served, one at a time).
    bodies_in_flight_mb: int = 512

    def check(self) -> None:
        """ConfigError naming the limit, for a value no server could serve with."""
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if not value > 0:
                raise ConfigError(f"the gateway limit {field.name} must be positive, got {value}")

    def with_settings(self, settings: list[str]) -> GatewayLimits:
        """These limits with each "NAME=VALUE" of `settings` applied (`packrat oip --limit`)."""
        names = {field.name: field.type for field in dataclasses.fields(self)}
        changes: dict[str, Any] = {}
        for setting in settings:
            name, equals, text = setting.partition("=")
            name = name.strip().replace("-", "_")
            if not equals or name not in names:
                raise ConfigError(f"--limit takes NAME=VALUE, NAME one of {', '.join(names)}; got {setting!r}")
            kind = float if names[name] in (float, "float") else int
            try:
                changes[name] = kind(text)
            except ValueError:
                raise ConfigError(f"--limit {name} takes {'a number' if kind is float else 'an integer'}") from None
        limits = dataclasses.replace(self, **changes)
        limits.check()
        return limits
