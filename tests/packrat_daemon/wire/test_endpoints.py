"""The client's endpoint ring: round robin, back-off after a timeout or a draining daemon, and the best
bet when every endpoint is in back-off."""

from __future__ import annotations

from packrat_daemon.wire.endpoints import EndpointRing

LONG = 3600.0  # a back-off that cannot run out during a test
OK = {"v": 1, "id": 1, "ok": True}
DRAINING = {"v": 1, "id": 1, "ok": False, "error": {"code": "SHUTTING_DOWN", "message": "draining"}}  # as decoded


def picks(ring: EndpointRing, count: int) -> list[int]:
    return [ring.pick() for _ in range(count)]


def test_endpoints_take_turns() -> None:
    assert picks(EndpointRing(3, LONG), 7) == [0, 1, 2, 0, 1, 2, 0]


def test_one_endpoint_is_always_picked_even_in_back_off() -> None:
    ring = EndpointRing(1, LONG)
    ring.timed_out(0)
    assert picks(ring, 3) == [0, 0, 0]


def test_an_endpoint_that_timed_out_is_skipped_until_it_answers() -> None:
    ring = EndpointRing(3, LONG)
    ring.timed_out(1)
    assert picks(ring, 4) == [0, 2, 0, 2]
    ring.answered(1, OK)  # a late reply from it: back in the ring
    assert picks(ring, 3) == [0, 1, 2]


def test_a_draining_daemon_is_skipped_and_an_error_of_another_kind_is_not() -> None:
    ring = EndpointRing(2, LONG)
    ring.answered(0, DRAINING)
    assert picks(ring, 3) == [1, 1, 1]
    overloaded = {"ok": False, "error": {"code": "OVERLOADED", "message": "queue full"}}
    ring.answered(0, overloaded)  # busy, not going away: still worth asking
    assert sorted(picks(ring, 2)) == [0, 1]


def test_with_every_endpoint_in_back_off_the_one_that_waited_longest_is_picked() -> None:
    ring = EndpointRing(3, LONG)
    for index in (2, 0, 1):  # 2 timed out first, so its back-off ends first
        ring.timed_out(index)
    assert ring.pick() == 2
    assert ring.pick() == 2  # still the best bet: the turn does not move past it


def test_a_back_off_of_zero_skips_nothing() -> None:
    ring = EndpointRing(2, 0.0)
    ring.timed_out(0)
    assert picks(ring, 2) == [0, 1]
