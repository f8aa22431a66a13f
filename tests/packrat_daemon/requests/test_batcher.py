"""Dynamic batching: size and delay limits, bounded queue, deadlines, fairness between clients."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
import zmq

from packrat_daemon.requests.batcher import REMEMBERED_CLIENTS, Batcher, Request
from packrat_daemon.wire import client_side
from tests.helpers.daemons import running_daemon


def request(samples: int, arrived: float = 0.0, deadline: float | None = None, client: bytes = b"id") -> Request:
    return Request(client, None, 1, "float32", (samples, 4), b"\0" * (16 * samples), arrived, deadline)


def dense_arrivals(batcher: Batcher, gap: float, samples: int = 1, until: float = 1.0) -> None:
    """Requests every `gap` seconds up to `until`, each taken at once: the batcher learns the rate."""
    for k in range(20):
        batcher.offer(request(samples, arrived=until - (20 - k) * gap))
        batcher.take()


def test_batch_is_due_when_full_or_when_the_oldest_waited_max_delay() -> None:
    batcher = Batcher(max_batch=8, max_delay_s=0.010, max_queued_inputs=100)
    dense_arrivals(batcher, gap=0.001)  # a request a millisecond, no profile: worth waiting for the next
    batcher.offer(request(3, arrived=1.0))
    assert not batcher.due(1.005)
    assert batcher.next_due() == 1.010
    assert batcher.due(1.010)
    batcher.offer(request(5, arrived=1.001))
    assert batcher.due(1.002)  # 8 inputs: full


def test_a_lone_request_on_an_idle_daemon_starts_at_once() -> None:
    batcher = Batcher(max_batch=8, max_delay_s=0.050, max_queued_inputs=100)
    batcher.predict = lambda b: 0.010 + 0.001 * b  # batching would pay, if anything were coming
    batcher.offer(request(1, arrived=5.0))  # no arrivals before: no rate
    assert batcher.due(5.0) and batcher.next_due() == 5.0
    batcher.take()
    batcher.offer(request(1, arrived=9.0))  # four seconds later: the next is not expected within 50 ms
    assert batcher.mean_gap_s == 4.0
    assert batcher.due(9.0)


def test_waiting_pays_only_when_the_newcomer_saves_more_than_the_wait_costs() -> None:
    # Requests every 2 ms; a batch's fixed cost of 10 ms is what a newcomer saves by joining.
    fixed = Batcher(max_batch=8, max_delay_s=0.005, max_queued_inputs=100)
    fixed.predict = lambda b: 0.010 + 0.0001 * b
    # No fixed cost: two inputs take as long together as one after the other, so nothing is saved.
    linear = Batcher(max_batch=8, max_delay_s=0.005, max_queued_inputs=100)
    linear.predict = lambda b: 0.004 * b
    for batcher in (fixed, linear):
        dense_arrivals(batcher, gap=0.002)
        batcher.offer(request(1, arrived=1.0))
    assert fixed.waiting_pays(1.0) and not fixed.due(1.0)
    assert not linear.waiting_pays(1.0) and linear.due(1.0)
    # Past the delay the batch is due whatever the prediction, and one whose newcomer would not fit too.
    assert fixed.due(1.005)
    fixed.offer(request(7, arrived=1.001))
    assert not fixed.waiting_pays(1.001) and fixed.due(1.001)


def test_the_daemons_own_cost_per_batch_counts_as_the_batchs_fixed_cost() -> None:
    # A tiny model: 0.1 ms of compute whatever the batch, and requests every 0.2 ms. On compute alone the
    # worker is free before the next request comes, so it would not wait; the daemon's measured 0.8 ms
    # per batch (hops, gathering, replies) keeps the worker busy past it, so waiting pays.
    batcher = Batcher(max_batch=8, max_delay_s=0.001, max_queued_inputs=100)
    batcher.predict = lambda b: 0.0001
    dense_arrivals(batcher, gap=0.0002)
    batcher.offer(request(1, arrived=1.0))
    assert batcher.due(1.0)
    for _ in range(40):
        batcher.served(0.0008)
    assert abs(batcher.overhead_s - 0.0008) < 1e-5
    assert not batcher.due(1.0)


def test_the_next_request_must_be_expected_before_the_delay_runs_out() -> None:
    batcher = Batcher(max_batch=8, max_delay_s=0.005, max_queued_inputs=100)
    dense_arrivals(batcher, gap=0.003)
    batcher.offer(request(1, arrived=1.0))
    assert batcher.waiting_pays(1.001)  # 3 ms expected, 4 ms of delay left
    assert not batcher.waiting_pays(1.0025)  # 2.5 ms left
    assert batcher.due(1.0025)


def test_a_prediction_the_profile_cannot_make_falls_back_to_the_rate() -> None:
    batcher = Batcher(max_batch=8, max_delay_s=0.005, max_queued_inputs=100)
    batcher.predict = lambda b: None
    dense_arrivals(batcher, gap=0.001)
    batcher.offer(request(1, arrived=1.0))
    assert not batcher.due(1.0)


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
    # Only what was queued counts as arrived, and it stays counted once taken.
    batcher.take()
    assert (batcher.arrived_requests, batcher.arrived_inputs) == (2, 6)


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


@pytest.mark.slow
def test_a_real_daemon_starts_a_lone_request_without_the_batching_delay(tmp_path: Path) -> None:
    # A 300 ms delay: under the old rule every lone request waited all of it.
    args = ["--model", "builtin:tiny-mlp", "--policy", "fixed", "--plan", "1x2", "--max-batch", "4"]
    with running_daemon(tmp_path, *args, "--max-delay-ms", "300") as (endpoint, _):
        context = zmq.Context.instance()
        with context.socket(zmq.DEALER) as socket:
            socket.connect(endpoint)
            waits, totals = [], []
            for k in range(3):
                time.sleep(0.4)  # idle between requests
                x = np.random.default_rng(k).standard_normal((1, 16), dtype=np.float32)
                socket.send_multipart(client_side.encode_infer_request(k + 1, x))
                head, _ = client_side.decode_reply(socket.recv_multipart())
                waits.append(head["timing"]["queue_ms"])
                totals.append(head["timing"]["total_ms"])
    assert max(waits) < 30.0, waits
    assert max(totals) < 150.0, totals


def test_a_request_marked_alone_is_taken_in_a_batch_of_its_own() -> None:
    batcher = Batcher(max_batch=8, max_delay_s=0.0, max_queued_inputs=100)
    first, suspect, last = request(1), request(2), request(1)
    suspect.alone = True  # its batch failed with its rows in the failing slice
    for queued in (first, suspect, last):
        batcher.offer(queued)
    assert batcher.take() == [first]
    assert batcher.take() == [suspect]
    assert batcher.take() == [last] and batcher.queued_inputs == 0


def test_a_clients_backlog_delays_another_clients_request_by_one_batch_not_by_the_backlog() -> None:
    # Issue 27, 7: an innocent client's requests waited in arrival order behind 100 poisoned requests of another,
    # each costing a failed batch and a run alone (3.18 s).
    batcher = Batcher(max_batch=4, max_delay_s=0.0, max_queued_inputs=1000)
    backlog = [request(1, client=b"attacker") for _ in range(100)]
    innocent = [request(1, client=b"innocent") for _ in range(3)]
    for queued in (*backlog, *innocent):
        batcher.offer(queued)
    # One of each client's in turn, each client's in its own order.
    assert batcher.take() == [backlog[0], innocent[0], backlog[1], innocent[1]]
    assert batcher.take() == [backlog[2], innocent[2], backlog[3], backlog[4]]  # served as lately: oldest first
    assert batcher.take() == backlog[5:9]  # alone in the queue: in arrival order again
    assert batcher.queued_inputs == 91 and list(batcher.queue) == backlog[9:]


def test_runs_alone_take_turns_between_clients() -> None:
    # A failed batch's requests run again each alone: the attacker's must not all run before the innocent's.
    batcher = Batcher(max_batch=4, max_delay_s=0.0, max_queued_inputs=100)
    suspects = [request(1, client=b"attacker") for _ in range(3)] + [request(1, client=b"innocent")]
    for suspect in suspects:
        suspect.alone = True
    batcher.requeue(suspects)
    assert [batcher.take() for _ in range(4)] == [[suspects[0]], [suspects[3]], [suspects[1]], [suspects[2]]]


def test_a_batch_that_takes_everything_queued_keeps_arrival_order() -> None:
    batcher = Batcher(max_batch=8, max_delay_s=0.0, max_queued_inputs=100)
    queued = [request(2, client=b"a"), request(2, client=b"a"), request(1, client=b"b"), request(3, client=b"a")]
    for one in queued:
        batcher.offer(one)
    assert batcher.take() == queued


def test_a_clients_request_that_does_not_fit_is_not_overtaken_by_its_later_ones() -> None:
    batcher = Batcher(max_batch=4, max_delay_s=0.0, max_queued_inputs=100)
    a_small, a_big, a_last = request(1, client=b"a"), request(3, client=b"a"), request(1, client=b"a")
    b_first, b_second = request(2, client=b"b"), request(1, client=b"b")
    for one in (a_small, a_big, a_last, b_first, b_second):
        batcher.offer(one)
    assert batcher.take() == [a_small, b_first, b_second]  # a's 3 inputs would make 6: a is done for this batch
    assert batcher.take() == [a_big, a_last]


def test_clients_that_come_and_go_are_forgotten() -> None:
    batcher = Batcher(max_batch=4, max_delay_s=0.0, max_queued_inputs=100)
    for k in range(2 * REMEMBERED_CLIENTS):
        batcher.offer(request(1, client=b"c%d" % k))
        assert len(batcher.take()) == 1
    assert len(batcher._served_at) <= REMEMBERED_CLIENTS


def test_end_clients_a_gateway_names_take_turns_as_connections_do() -> None:
    # Issue 38: 6 REST clients behind the gateway's one connection were served a quarter as often as 6 gRPC clients,
    # each on a handler thread's own connection (REST median 6.7 s against gRPC 2.1 s). Closed loops: each client
    # sends its next request as soon as its last is taken.
    def served(named: bool) -> tuple[int, int]:
        batcher = Batcher(max_batch=4, max_delay_s=0.0, max_queued_inputs=1000)
        for k in range(6):
            batcher.offer(request(1, client=f"grpc-thread-{k}".encode()))
            batcher.offer(request(1, client=b"gateway-loop"))
            batcher.queue[-1].client = f"rest:{k}" if named else None
        counts = {b"gateway-loop": 0}
        for _ in range(300):
            for taken in batcher.take():
                counts[taken.identity] = counts.get(taken.identity, 0) + 1
                batcher.offer(request(1, client=taken.identity))
                batcher.queue[-1].client = taken.client
        rest = counts.pop(b"gateway-loop")
        return rest, sum(counts.values())

    assert served(named=True) == (600, 600)
    assert served(named=False) == (300, 900)  # by connection alone: one turn in four


def test_a_cancelled_request_leaves_the_queue_only_from_its_own_connection_and_before_it_starts() -> None:
    batcher = Batcher(max_batch=4, max_delay_s=0.0, max_queued_inputs=100)
    mine, other = request(2, client=b"me"), request(1, client=b"other")
    mine.request_id = other.request_id = 7
    batcher.offer(mine)
    batcher.offer(other)
    assert batcher.cancel(b"nobody", 7) is None  # another connection's id 7 is not its to cancel
    assert batcher.cancel(b"me", 7) is mine
    assert list(batcher.queue) == [other] and batcher.queued_inputs == 1
    assert batcher.cancel(b"me", 7) is None  # gone already: ignored
    assert batcher.take() == [other]
    assert batcher.cancel(b"other", 7) is None  # started: it computes, and its own reply comes
