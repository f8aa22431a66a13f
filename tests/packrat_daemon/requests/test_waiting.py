"""The waiting rule's hold for the clients just answered (issue 43): closed-loop clients at batch 1 on one instance
took turns, each request waiting for the other group's batch and then running its own."""

from __future__ import annotations

import pytest

from packrat_daemon.requests.batcher import Batcher, Request
from packrat_daemon.requests.waiting import RETURNS_TO_TELL

RESNET = {1: 0.088, 2: 0.165, 3: 0.222, 4: 0.280}  # L(b) in seconds: ResNet-50 on one 2-thread instance (torch)
RETURN_S = 0.002  # a client's round trip from its answer to its next request


def request(arrived: float, client: bytes = b"a", samples: int = 1) -> Request:
    return Request(client, None, 1, "float32", (samples, 4), b"\0" * (16 * samples), arrived)


def resnet_batcher(max_delay_s: float = 0.001) -> Batcher:
    batcher = Batcher(max_batch=16, max_delay_s=max_delay_s, max_queued_inputs=100)
    batcher.predict = lambda b: RESNET.get(b)
    return batcher


def lone_client(batcher: Batcher, rounds: int) -> float:
    """One closed-loop client: each request starts at once, is answered L(1) later, and its next comes RETURN_S
    after the answer; its last request is left computing. Returns when that one is answered (the caller answers
    it, once what else it queues has come)."""
    now = 0.0
    for k in range(rounds + 1):
        batcher.offer(request(now))
        assert batcher.due(now)  # a lone client's request never waits
        batcher.take()
        now += RESNET[1]
        if k < rounds:
            batcher.answered(1, now)
            now += RETURN_S
    return now


def test_a_lone_client_never_waits_and_teaches_the_return_time() -> None:
    batcher = resnet_batcher()
    batcher.answered(1, lone_client(batcher, rounds=10))
    assert batcher.return_s == pytest.approx(RETURN_S)
    assert batcher.mean_gap_s == pytest.approx(RESNET[1] + RETURN_S)


def test_the_queue_is_held_for_returning_closed_loop_clients_when_the_merged_batch_ends_sooner() -> None:
    batcher = resnet_batcher()
    answered_at = lone_client(batcher, rounds=RETURNS_TO_TELL + 1)
    # A second client's request came while the first's was computing; the first's answer just went.
    batcher.offer(request(answered_at - 0.05, client=b"b"))
    batcher.answered(1, answered_at)
    # L(2) + 2 ms = 167 ms against L(1) + L(1) = 176 ms back to back: hold, until twice the return time at most.
    assert batcher.cohort_pays(answered_at)
    assert not batcher.due(answered_at)
    assert batcher.next_due() == pytest.approx(answered_at + 2 * RETURN_S)
    assert not batcher.due(answered_at + RETURN_S / 2)
    batcher.offer(request(answered_at + RETURN_S))  # back: both start together
    assert batcher.due(answered_at + RETURN_S)
    assert len(batcher.take()) == 2


def test_the_hold_ends_at_its_bound_when_the_answered_client_does_not_come_back() -> None:
    batcher = resnet_batcher()
    answered_at = lone_client(batcher, rounds=RETURNS_TO_TELL + 1)
    batcher.offer(request(answered_at - 0.05, client=b"b"))
    batcher.answered(1, answered_at)
    assert not batcher.due(answered_at)
    bound = batcher.next_due()
    assert bound == pytest.approx(answered_at + 2 * RETURN_S)
    assert batcher.due(bound + 1e-9)  # past twice the return time: the queued request starts alone
    assert batcher.next_due() == pytest.approx(answered_at - 0.05)  # at once


def test_no_hold_without_enough_returns_to_tell_a_closed_loop() -> None:
    batcher = resnet_batcher()
    answered_at = lone_client(batcher, rounds=RETURNS_TO_TELL - 1)
    batcher.offer(request(answered_at - 0.05, client=b"b"))
    batcher.answered(1, answered_at)
    assert not batcher.cohort_pays(answered_at) and batcher.due(answered_at)


def test_no_hold_when_the_merged_batch_is_not_predicted_to_end_sooner() -> None:
    batcher = resnet_batcher()
    batcher.predict = lambda b: 0.088 * b  # no fixed cost: two together take as long as two after one another
    answered_at = lone_client(batcher, rounds=RETURNS_TO_TELL + 1)
    batcher.offer(request(answered_at - 0.05, client=b"b"))
    batcher.answered(1, answered_at)
    assert not batcher.cohort_pays(answered_at) and batcher.due(answered_at)


def test_no_hold_when_the_delay_is_zero() -> None:
    batcher = resnet_batcher(max_delay_s=0.0)  # --max-delay-ms 0 never waits
    answered_at = lone_client(batcher, rounds=RETURNS_TO_TELL + 1)
    batcher.offer(request(answered_at - 0.05, client=b"b"))
    batcher.answered(1, answered_at)
    assert batcher.due(answered_at)


def test_no_hold_for_open_loop_traffic_that_comes_no_sooner_after_an_answer() -> None:
    # Requests every 50 ms, each answered 10 ms after it came: the next comes 40 ms after an answer, as late as at
    # any time (a Poisson process has no memory). Not a closed loop, whatever the profile predicts.
    batcher = resnet_batcher()
    for k in range(40):
        arrived = 0.05 * k
        batcher.offer(request(arrived, client=bytes([k])))
        assert batcher.due(arrived)
        batcher.take()
        if k < 39:
            batcher.answered(1, arrived + 0.01)
    batcher.offer(request(1.955, client=b"next"))  # came while the last computes
    batcher.answered(1, 1.96)
    assert batcher.return_s == pytest.approx(0.04, abs=0.002)
    assert not batcher.cohort_pays(1.96)
    assert batcher.due(1.96)


def test_answers_that_come_apart_add_up_while_their_clients_are_out() -> None:
    batcher = resnet_batcher()
    answered_at = lone_client(batcher, rounds=RETURNS_TO_TELL + 1)
    batcher.offer(request(answered_at - 0.05, client=b"b"))
    batcher.offer(request(answered_at - 0.04, client=b"c"))
    batcher.answered(1, answered_at)
    batcher.answered(1, answered_at)  # one batch's requests answered one by one
    # Two queued and two coming: L(4) + 2 ms = 282 ms against L(2) + L(2) = 330 ms.
    assert batcher.cohort_pays(answered_at)
    batcher.offer(request(answered_at + RETURN_S))
    assert not batcher.due(answered_at + RETURN_S)  # one of the two is back: still holding for the other
    batcher.offer(request(answered_at + RETURN_S, client=b"d"))
    assert batcher.due(answered_at + RETURN_S)
    assert len(batcher.take()) == 4
