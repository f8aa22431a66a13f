"""Dynamic batching: size and delay limits, bounded queue, deadlines."""

from __future__ import annotations

from packrat_daemon.batcher import Batcher, Request


def request(samples: int, arrived: float = 0.0, deadline: float | None = None) -> Request:
    return Request(b"id", None, 1, "float32", (samples, 4), b"\0" * (16 * samples), arrived, deadline)


def test_batch_is_due_when_full_or_when_the_oldest_waited_max_delay() -> None:
    batcher = Batcher(max_batch=8, max_delay_s=0.010, max_queued_inputs=100)
    batcher.offer(request(3, arrived=1.0))
    assert not batcher.due(1.005)
    assert batcher.due(1.010)
    batcher.offer(request(5, arrived=1.001))
    assert batcher.due(1.002)  # 8 inputs: full


def test_take_keeps_whole_requests_in_arrival_order_up_to_max_batch() -> None:
    batcher = Batcher(max_batch=8, max_delay_s=0.0, max_queued_inputs=100)
    first, second, third = request(3), request(4), request(2)
    for r in (first, second, third):
        batcher.offer(r)
    assert batcher.take() == [first, second]  # 3 + 4 = 7; the third would make 9
    assert batcher.queued_inputs == 2
    assert batcher.take() == [third]
    assert batcher.queued_inputs == 0 and batcher.next_due() is None


def test_full_queue_refuses_instead_of_growing() -> None:
    batcher = Batcher(max_batch=4, max_delay_s=0.0, max_queued_inputs=6)
    assert batcher.offer(request(4))
    assert not batcher.offer(request(3))
    assert batcher.offer(request(2))
    assert batcher.queued_inputs == 6


def test_expired_requests_leave_the_queue() -> None:
    batcher = Batcher(max_batch=4, max_delay_s=1.0, max_queued_inputs=100)
    keep, drop = request(1, deadline=10.0), request(2, deadline=1.0)
    batcher.offer(keep)
    batcher.offer(drop)
    assert batcher.expire(now=2.0) == [drop]
    assert list(batcher.queue) == [keep] and batcher.queued_inputs == 1
    assert batcher.drain() == [keep] and batcher.queued_inputs == 0


def test_a_batch_whose_workers_were_lost_goes_back_to_the_head_in_its_order() -> None:
    batcher = Batcher(max_batch=4, max_delay_s=0.0, max_queued_inputs=6)
    first, second, waiting = request(2), request(2, deadline=5.0), request(4)
    batcher.offer(first)
    batcher.offer(second)
    batch = batcher.take()
    batcher.offer(waiting)
    batcher.requeue(batch)  # 8 inputs now: more than max_queued_inputs, but these were admitted before
    assert list(batcher.queue) == [first, second, waiting] and batcher.queued_inputs == 8
    assert batcher.expire(6.0) == [second] and batcher.queued_inputs == 6
