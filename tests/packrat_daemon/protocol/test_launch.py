"""protocol.launch's restart back-off, shared by the gateway's supervisor and the repository's model daemons."""

from __future__ import annotations

from packrat_daemon.protocol.launch import RestartBackoff


def test_restart_backoff_doubles_to_its_ceiling_and_starts_over_after_a_long_run() -> None:
    backoff = RestartBackoff(0.5, most_s=3.0, reset_after_s=60.0)
    assert [backoff.after_exit(1.0) for _ in range(5)] == [0.5, 1.0, 2.0, 3.0, 3.0]
    assert backoff.after_exit(61.0) == 0.5 and backoff.after_exit(1.0) == 1.0
