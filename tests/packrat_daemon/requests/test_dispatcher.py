"""The dispatcher over a recording sender: zero-copy row frames, gathering, re-routing, deadlines, hedging."""

from __future__ import annotations

import dataclasses
import math
import os
import time
from types import SimpleNamespace

import numpy as np
import pytest

from packrat_daemon.fleet.pool import WorkerHandle, WorkerState
from packrat_daemon.fleet.verdicts import SPIN_LOOK_S, Reading
from packrat_daemon.requests.batcher import Request
from packrat_daemon.requests.dispatcher import Dispatcher
from packrat_daemon.requests.inflight import ASIDE_RECHECK_S, Actions, holds_the_queue
from packrat_daemon.requests.ragged import BY_COST, PAD_BATCH, Ragged
from packrat_daemon.requests.splitter import Splitter
from packrat_daemon.requests.timing import LEARNED_KEEP, Deadlines
from packrat_daemon.wire.codec import ErrorCode
from policies.planning.profile import Profile
from workers.models.spec import InputSpec, TensorSpec


class Recorder:
    """Stands in for Pool.run: records what would be sent (the split is what is tested)."""

    def __init__(self) -> None:
        self.sent: list[tuple[bytes, dict, bytes]] = []

    def __call__(self, worker: WorkerHandle, header: dict, payload: list) -> bool:
        assert header.keys() == {"job", "dtype", "shape"}
        self.sent.append((worker.identity, header, b"".join(bytes(p) for p in payload)))
        return True


def workers(*threads: int) -> list[WorkerHandle]:
    return [WorkerHandle(k + 1, t, (k,), 1, WorkerState.READY) for k, t in enumerate(threads)]


def requests(*sizes: int) -> tuple[list[Request], list[np.ndarray]]:
    arrays = [np.arange(n * 2, dtype=np.float32).reshape(n, 2) + 100 * k for k, n in enumerate(sizes)]
    return [Request(b"c%d" % k, None, k, "float32", a.shape, memoryview(a)) for k, a in enumerate(arrays)], arrays


def answer(dispatcher: Dispatcher, pool: list[WorkerHandle], sent: tuple[bytes, dict, bytes]) -> list:
    identity, header, data = sent
    worker = next(w for w in pool if w.identity == identity)
    rows = np.frombuffer(data, dtype=np.float32).reshape(header["shape"]) * 2  # the "model" doubles
    reply = {"job": header["job"], "dtype": "float32", "shape": list(rows.shape), "compute_ms": 1.0,
             "threads": worker.threads, "batch": rows.shape[0]}  # fmt: skip
    return dispatcher.on_result(worker, reply, [rows])


def test_split_follows_the_profile_and_each_request_gets_its_own_rows() -> None:
    profile = Profile.from_latencies({(1, 2): 10.0, (1, 4): 20.0, (2, 4): 12.0, (2, 8): 30.0})
    recorder, pool = Recorder(), workers(2, 1)
    dispatcher = Dispatcher(recorder, Splitter(profile, "exact"), Deadlines(job_timeout_s=10, margin=1.5, floor_s=0.2))
    batch, arrays = requests(3, 2, 1)
    dispatcher.dispatch(batch, pool)
    assert [h["shape"][0] for _, h, _ in recorder.sent] == [4, 2]  # 2 threads take 4 rows at 12 ms
    done = []
    for sent in recorder.sent:
        done += answer(dispatcher, pool, sent)
    assert not dispatcher.busy
    for completed, array in zip(done, arrays, strict=True):
        np.testing.assert_array_equal(completed.output, array * 2)


def test_lost_worker_slice_goes_to_another_instance() -> None:
    recorder, pool = Recorder(), workers(1, 1)
    dispatcher = Dispatcher(recorder, Splitter(None, "exact"), Deadlines(job_timeout_s=10, margin=1.5, floor_s=0.2))
    batch, arrays = requests(4)
    dispatcher.dispatch(batch, pool)
    first, second = recorder.sent
    assert dispatcher.reassign(pool[0], pool)
    resent = recorder.sent[2]
    assert resent[0] == pool[1].identity and resent[2] == first[2]
    done = answer(dispatcher, pool, second) + answer(dispatcher, pool, resent)
    assert answer(dispatcher, pool, first) == []  # a late answer from the lost worker is ignored
    np.testing.assert_array_equal(done[0].output, arrays[0] * 2)


def test_no_worker_left_abandons_the_batch() -> None:
    recorder, pool = Recorder(), workers(1)
    dispatcher = Dispatcher(recorder, Splitter(None, "exact"), Deadlines(job_timeout_s=10, margin=1.5, floor_s=0.2))
    batch, _ = requests(2)
    dispatcher.dispatch(batch, pool)
    assert not dispatcher.reassign(pool[0], pool)
    assert dispatcher.abandon() == batch and not dispatcher.busy


class Payload(bytearray):
    """A request buffer that can be watched with a weak reference."""


def test_a_finished_or_abandoned_batch_frees_its_input_buffers_without_the_garbage_collector() -> None:
    """No reference cycle may keep clients' inputs alive: each would be megabytes of fresh memory."""
    import gc
    import weakref

    profile = Profile.from_latencies({(1, 2): 10.0, (1, 4): 20.0, (2, 4): 12.0, (2, 8): 30.0})
    gc.disable()
    try:
        for finish in (True, False):
            recorder, pool = Recorder(), workers(2, 1)
            dispatcher = Dispatcher(
                recorder, Splitter(profile, "exact"), Deadlines(job_timeout_s=10, margin=1.5, floor_s=0.2)
            )
            payload = Payload(np.ones((6, 2), dtype=np.float32).tobytes())
            watch = weakref.ref(payload)
            dispatcher.dispatch([Request(b"c", None, 1, "float32", (6, 2), memoryview(payload))], pool)
            if finish:
                done = []
                for sent in recorder.sent:
                    done += answer(dispatcher, pool, sent)
                assert len(done) == 1
                del done
            else:
                assert len(dispatcher.abandon()) == 1
            del payload
            recorder.sent.clear()
            assert watch() is None, "the batch's input buffer outlived the batch"
    finally:
        gc.enable()


def test_a_slice_is_given_its_predicted_latency_times_the_margin_within_floor_and_timeout() -> None:
    profile = Profile.from_latencies({(1, 2): 400.0, (1, 4): 800.0, (2, 4): 10.0})
    recorder, pool = Recorder(), workers(1, 1)
    dispatcher = Dispatcher(recorder, Splitter(profile, "even"), Deadlines(job_timeout_s=60, margin=1.5, floor_s=0.2))
    batch, _ = requests(2, 2)
    dispatcher.dispatch(batch, pool)
    for job in dispatcher.jobs.values():
        assert job.predicted_ms == 400.0 and abs(job.deadline - job.sent_at - 0.6) < 1e-9
    assert dispatcher.next_deadline == min(job.deadline for job in dispatcher.jobs.values())
    assert dispatcher.overdue(dispatcher.next_deadline - 0.01) == []
    late = dispatcher.overdue(max(job.deadline for job in dispatcher.jobs.values()) + 0.01)
    assert sorted(job.worker.id for job in late) == [1, 2]
    # The floor: a fast slice still gets 0.2 s; the job timeout caps a slow one; no profile: the timeout.
    idle_two, idle_one = (WorkerHandle(9, t, (9,), 1, WorkerState.READY) for t in (2, 1))
    assert dispatcher.deadline(idle_two, 4, 0.0) == (0.2, 10.0)
    dispatcher.set_deadlines(dataclasses.replace(dispatcher.deadlines, job_timeout_s=0.5))
    assert dispatcher.deadline(idle_one, 4, 0.0) == (0.5, 800.0)
    dispatcher.splitter = Splitter(None, "exact")
    assert dispatcher.deadline(idle_one, 4, 0.0) == (0.5, None)


def test_a_slice_sent_to_a_busy_worker_gets_its_deadline_after_the_work_it_holds() -> None:
    profile = Profile.from_latencies({(1, 2): 400.0})
    recorder, pool = Recorder(), workers(1, 1)
    dispatcher = Dispatcher(recorder, Splitter(profile, "even"), Deadlines(job_timeout_s=60, margin=2.0, floor_s=0.2))
    batch, _ = requests(2, 2)
    dispatcher.dispatch(batch, pool)
    first = next(job for job in dispatcher.jobs.values() if job.worker.id == 2)
    assert dispatcher.reassign(pool[0], pool)
    moved = max(dispatcher.jobs.values(), key=lambda job: job.id)
    assert moved.worker.id == 2 and abs(moved.deadline - (first.deadline + 0.8)) < 0.05
    assert [job.worker.id for job in dispatcher.overdue(first.deadline + 0.01)] == [2]  # its oldest only


def test_timeout_ms_bounds_a_request_in_flight() -> None:
    recorder, pool = Recorder(), workers(1)
    dispatcher = Dispatcher(recorder, Splitter(None, "exact"), Deadlines(job_timeout_s=60, margin=1.5, floor_s=0.2))
    batch, arrays = requests(1, 2)
    batch[0].deadline = 5.0
    dispatcher.dispatch(batch, pool)
    assert dispatcher.next_deadline == 5.0 and dispatcher.expire(4.0) == []
    assert dispatcher.expire(6.0) == [batch[0]] and batch[0].answered
    assert dispatcher.expire(7.0) == [] and dispatcher.next_deadline > 7.0  # answered once, deadline moved on
    done = answer(dispatcher, pool, recorder.sent[0])
    assert [c.request for c in done] == [batch[1]]  # the result leaves the answered request out
    np.testing.assert_array_equal(done[0].output, arrays[1] * 2)


def test_a_batch_past_every_requests_deadline_is_cancelled_and_its_slices_are_not_sent_again() -> None:
    # Issue 27, 9: timeout_ms answered the requests of a batch that hung, but the batch stayed in flight.
    recorder, pool = Recorder(), workers(1, 1)
    dispatcher = Dispatcher(recorder, Splitter(None, "exact"), Deadlines(job_timeout_s=60, margin=1.5, floor_s=0.2))
    batch, _ = requests(1, 2)
    batch[0].deadline, batch[1].deadline = 5.0, 6.0
    dispatcher.dispatch(batch, pool)
    assert dispatcher.expire(5.5) == [batch[0]] and dispatcher.busy  # one request still waits for it
    assert dispatcher.expire(6.5) == [batch[1]] and not dispatcher.busy  # none: cancelled, the next may start
    assert len(dispatcher.jobs) == 2  # its workers stay busy until they answer or are replaced
    assert answer(dispatcher, pool, recorder.sent[0]) == []  # a late result is dropped
    sent = len(recorder.sent)
    assert dispatcher.reassign(pool[1], pool) and len(recorder.sent) == sent  # a hung slice is not re-sent
    assert dispatcher.jobs == {}


def test_abandon_leaves_out_requests_already_answered() -> None:
    recorder, pool = Recorder(), workers(1)
    dispatcher = Dispatcher(recorder, Splitter(None, "exact"), Deadlines(job_timeout_s=60, margin=1.5, floor_s=0.2))
    batch, _ = requests(1, 1)
    batch[0].deadline = 1.0
    dispatcher.dispatch(batch, pool)
    assert dispatcher.expire(2.0) == [batch[0]]
    assert dispatcher.abandon() == [batch[1]]


def hedging(pool_size: int) -> tuple[Recorder, list[WorkerHandle], Dispatcher]:
    # 400 ms predicted per 2-row slice: hedged after 0.6 s, its worker replaced after 1.2 s.
    recorder, pool = Recorder(), workers(*[1] * pool_size)
    dispatcher = Dispatcher(
        recorder,
        Splitter(Profile.from_latencies({(1, 2): 400.0}), "even"),
        Deadlines(job_timeout_s=60, margin=3.0, floor_s=0.2, hedge_margin=1.5, hedge_floor_s=0.1),
    )
    return recorder, pool, dispatcher


def test_a_late_slice_is_hedged_on_an_idle_worker_and_the_first_answer_is_used() -> None:
    recorder, pool, dispatcher = hedging(3)
    batch, arrays = requests(2, 2)
    dispatcher.dispatch(batch, pool[:2])
    late = next(job for job in dispatcher.jobs.values() if job.worker.id == 1)
    assert abs(late.hedge_at - late.sent_at - 0.6) < 1e-9 and abs(late.deadline - late.sent_at - 1.2) < 1e-9
    assert dispatcher.next_deadline == min(job.hedge_at for job in dispatcher.jobs.values())
    assert answer(dispatcher, pool, recorder.sent[1]) == []  # worker 2 answers its slice
    assert dispatcher.hedge(late.hedge_at - 0.01, pool) == []
    [copy] = dispatcher.hedge(late.hedge_at + 0.01, pool)
    assert copy.twin is late and late.twin is copy and copy.worker.id == 2 and (copy.offset, copy.rows) == (0, 2)
    assert recorder.sent[2][2] == recorder.sent[0][2]  # the same rows
    assert dispatcher.hedge(late.hedge_at + 0.02, pool) == []  # hedged once
    done = answer(dispatcher, pool, recorder.sent[2])
    for completed, array in zip(done, arrays, strict=True):
        np.testing.assert_array_equal(completed.output, array * 2)
    # The loser is still held by its worker: left out of the next batch, and replaced at its deadline.
    assert dispatcher.overdue(late.deadline + 0.01) == [late]
    pool[0].outstanding = 1
    dispatcher.dispatch(requests(2, 2)[0], pool)
    assert {identity for identity, _, _ in recorder.sent[3:]} == {pool[1].identity, pool[2].identity}
    assert answer(dispatcher, pool, recorder.sent[0]) == []  # its late answer is dropped
    assert late.id not in dispatcher.jobs


def test_slices_of_instances_that_share_cores_are_never_hedged_but_keep_their_deadline() -> None:
    # TorchServe-like plans put every instance on every core: their cells do not predict a slice's time.
    recorder, pool = Recorder(), workers(1, 1, 1)
    splitter = Splitter(Profile.from_latencies({(1, 2): 400.0}), "even", oversubscribed=True)
    dispatcher = Dispatcher(
        recorder,
        splitter,
        Deadlines(job_timeout_s=60, margin=3.0, floor_s=0.2, hedge_margin=1.5, hedge_floor_s=0.1),
    )
    dispatcher.dispatch(requests(2, 2)[0], pool[:2])
    for job in dispatcher.jobs.values():
        assert job.hedge_at == math.inf and abs(job.deadline - job.sent_at - 1.2) < 1e-9
    assert dispatcher.hedge(1e9, pool) == []


def test_a_late_slice_waits_for_a_worker_to_become_idle_and_the_original_may_still_win() -> None:
    recorder, pool, dispatcher = hedging(2)
    batch, arrays = requests(2, 2)
    dispatcher.dispatch(batch, pool)
    now = max(job.hedge_at for job in dispatcher.jobs.values()) + 0.01
    assert dispatcher.hedge(now, pool) == [] and len(dispatcher.late) == 2  # both workers are busy
    assert answer(dispatcher, pool, recorder.sent[1]) == []
    [copy] = dispatcher.hedge(now, pool)  # worker 2 is idle now
    assert copy.worker.id == 2 and copy.offset == 0 and not dispatcher.late
    done = answer(dispatcher, pool, recorder.sent[0])  # the original answers first after all
    for completed, array in zip(done, arrays, strict=True):
        np.testing.assert_array_equal(completed.output, array * 2)
    assert answer(dispatcher, pool, recorder.sent[2]) == []


def test_a_lost_worker_whose_slice_is_hedged_is_not_sent_again() -> None:
    recorder, pool, dispatcher = hedging(2)
    batch, arrays = requests(2, 2)
    dispatcher.dispatch(batch, pool)
    answer(dispatcher, pool, recorder.sent[1])
    [copy] = dispatcher.hedge(max(job.hedge_at for job in dispatcher.jobs.values()) + 0.01, pool)
    assert dispatcher.reassign(pool[0], pool[1:])
    assert len(recorder.sent) == 3 and list(dispatcher.jobs.values()) == [copy]
    done = answer(dispatcher, pool, recorder.sent[2])
    for completed, array in zip(done, arrays, strict=True):
        np.testing.assert_array_equal(completed.output, array * 2)


def test_a_worker_lost_while_holding_a_losing_copy_has_it_dropped_not_sent_again() -> None:
    recorder, pool, dispatcher = hedging(2)
    dispatcher.dispatch(requests(2, 2)[0], pool)
    answer(dispatcher, pool, recorder.sent[1])
    [copy] = dispatcher.hedge(max(job.hedge_at for job in dispatcher.jobs.values()) + 0.01, pool)
    assert answer(dispatcher, pool, recorder.sent[2]) and not dispatcher.busy  # the copy won
    assert [job.worker.id for job in dispatcher.jobs.values()] == [1]  # the loser, still computing
    assert dispatcher.reassign(pool[0], pool) and not dispatcher.jobs and len(recorder.sent) == 3


def test_a_late_failure_of_an_earlier_batch_never_aborts_the_next_and_a_failure_names_its_slices_requests() -> None:
    # Issue 27, 7: abandon() on any FAILED let a previous batch's late failure abort the next batch (14 of 20 lost).
    recorder, pool = Recorder(), workers(1, 1)
    dispatcher = Dispatcher(recorder, Splitter(None, "exact"), Deadlines(job_timeout_s=10, margin=1.5, floor_s=0.2))
    batch, _ = requests(2, 2)
    dispatcher.dispatch(batch, pool)
    first, second = recorder.sent
    assert dispatcher.reassign(pool[0], pool)  # the first slice re-sent: its job id is stale from now on
    for sent in (second, recorder.sent[2]):
        answer(dispatcher, pool, sent)
    assert not dispatcher.busy
    following, _ = requests(1, 2, 1)
    dispatcher.dispatch(following, pool)
    assert dispatcher.fail(first[1]["job"]) is None and dispatcher.busy  # the old slice's late FAILED: ignored
    assert dispatcher.fail("not a job id") is None and dispatcher.busy
    slices = recorder.sent[3:]
    assert [h["shape"][0] for _, h, _ in slices] == [2, 2]  # rows [0, 2) and [2, 4)
    suspects, others = dispatcher.fail(slices[1][1]["job"]) or ([], [])
    assert suspects == following[1:] and others == following[:1] and not dispatcher.busy


def test_a_slice_past_its_deadline_is_never_sent_again_its_requests_run_alone_and_a_hang_alone_is_final() -> None:
    # Issue 27, 9: a hung slice was re-sent to the next worker, which hung on it too, worker after worker.
    recorder, pool = Recorder(), workers(1, 1)
    dispatcher = Dispatcher(recorder, Splitter(None, "exact"), Deadlines(job_timeout_s=10, margin=1.5, floor_s=0.2))
    batch, _ = requests(1, 1, 2)
    dispatcher.dispatch(batch, pool)
    first, second = recorder.sent  # rows [0, 2): requests 0 and 1; rows [2, 4): request 2
    job = dispatcher.jobs[first[1]["job"]]
    verdict = dispatcher.hang(job)
    assert verdict is not None and not dispatcher.busy and len(recorder.sent) == 2  # given up, nothing re-sent
    assert verdict.hung == [] and verdict.again == [batch[2], batch[0], batch[1]]  # the others first
    assert [r.alone for r in verdict.again] == [False, True, True] and verdict.replace == [pool[0]]
    assert answer(dispatcher, pool, second) == [] and first[1]["job"] in dispatcher.jobs  # its worker: still busy
    assert dispatcher.hang(job) is None  # no longer of the batch in flight
    dispatcher.dispatch([batch[1]], pool[1:])  # the suspect alone: hung again, it is the hang's
    alone = dispatcher.jobs[recorder.sent[-1][1]["job"]]
    assert alone.hedge_at == math.inf  # a suspect alone is never hedged onto another worker
    verdict = dispatcher.hang(alone)
    assert verdict is not None and verdict.hung == [batch[1]] and verdict.again == []
    assert {w.id for w in verdict.replace} == {1, 2}  # its worker, and the first one, which still holds its rows


def test_hedged_cancelled_and_hung_batches_free_their_input_buffers_without_the_garbage_collector() -> None:
    """A hedge's two copies pointed at each other, and a batch cancelled by its deadlines at its jobs: cycles that
    kept every request's inbox slab mapped until the cyclic collector ran, which a steady daemon rarely does (a
    ResNet-50 soak held 888 slabs, 1.8 GB of shared memory, after 25 minutes)."""
    import gc
    import weakref

    def watched(count: int) -> tuple[list[Request], list[weakref.ref]]:
        payloads = [Payload(np.full((2, 2), k, dtype=np.float32).tobytes()) for k in range(count)]
        batch = [Request(b"c", None, k, "float32", (2, 2), memoryview(p)) for k, p in enumerate(payloads)]
        return batch, [weakref.ref(p) for p in payloads]

    gc.disable()
    try:
        for case in ("hedged", "cancelled", "hung"):
            recorder, pool, dispatcher = hedging(3)
            batch, watches = watched(2)
            if case == "cancelled":
                batch[0].deadline = batch[1].deadline = 1.0
            dispatcher.dispatch(batch, pool[:2])
            late = next(job for job in dispatcher.jobs.values() if job.worker.id == 1)
            if case == "hedged":
                assert answer(dispatcher, pool, recorder.sent[1]) == []
                [_copy] = dispatcher.hedge(late.hedge_at + 0.01, pool)
                assert len(answer(dispatcher, pool, recorder.sent[2])) == 2
                assert answer(dispatcher, pool, recorder.sent[0]) == []  # the loser, late
                del _copy
            elif case == "cancelled":
                assert len(dispatcher.expire(2.0)) == 2 and not dispatcher.busy
                for sent in recorder.sent:
                    assert answer(dispatcher, pool, sent) == []
            else:
                verdict = dispatcher.hang(late)
                assert verdict is not None and len(verdict.again) == 2
                del verdict
                for sent in recorder.sent:
                    assert answer(dispatcher, pool, sent) == []
            del batch, late
            recorder.sent.clear()
            assert dispatcher.jobs == {}
            assert all(watch() is None for watch in watches), f"{case}: an input buffer outlived its batch"
    finally:
        gc.enable()


def test_a_slices_cpu_budget_is_the_cpu_its_prediction_implies_after_the_slices_its_worker_holds() -> None:
    # Past its deadline a slice is hung once its worker has used this much CPU without answering (the supervisor).
    profile = Profile.from_latencies({(2, 4): 500.0, (2, 8): 900.0})
    lost = WorkerHandle(1, 2, (0, 1), 1, WorkerState.READY)  # no pid: its CPU time cannot be read
    kept = WorkerHandle(2, 2, (2, 3), 1, WorkerState.READY, pid=os.getpid())
    dispatcher = Dispatcher(
        Recorder(), Splitter(profile, "exact"), Deadlines(job_timeout_s=60, margin=3.0, floor_s=1.0)
    )
    before = kept.cpu_seconds()
    dispatcher.dispatch(requests(8)[0], [lost, kept])
    after = kept.cpu_seconds()
    assert before is not None and after is not None
    unread, first = sorted(dispatcher.jobs.values(), key=lambda j: j.worker.id)
    assert (unread.rows, first.rows) == (4, 4)
    assert unread.cpu_limit == math.inf  # no budget: the deadline's looks and the job timeout judge it
    assert first.cpu_budget == 3.0 * 2 * 0.5  # margin x threads x the predicted 500 ms
    assert before + first.cpu_budget <= first.cpu_limit <= after + first.cpu_budget
    assert dispatcher.reassign(lost, [lost, kept])  # the lost worker's slice queues behind the one `kept` holds
    resent = max(dispatcher.jobs.values(), key=lambda j: j.id)
    assert resent.worker is kept and resent.cpu_limit == first.cpu_limit + resent.cpu_budget


def test_a_slice_queued_behind_another_starts_its_clocks_when_that_one_is_answered() -> None:
    # bench/faults.py --attack hanging_model: a spin sent behind a quick slice was looked at only once the quick one's
    # deadline proper (1 s) and its own first look had passed, so it was told by the job timeout after 2.2 s.
    worker = WorkerHandle(1, 1, (0,), 1, WorkerState.READY, pid=os.getpid())
    recorder = Recorder()
    dispatcher = Dispatcher(
        recorder,
        Splitter(Profile.from_latencies({(1, 1): 10.0}), "exact"),
        Deadlines(job_timeout_s=60, margin=3.0, floor_s=1.0, spin_floor_s=0.2),
    )
    (quick, spin), _ = requests(1, 1)
    dispatcher.dispatch([quick], [worker])
    dispatcher.run_aside(spin, worker)
    first, behind = dispatcher.jobs.values()
    assert behind.clock_from == first.watched_at and behind.deadline == behind.clock_from + 0.2  # stacked behind it
    assert behind.spin_limit == first.spin_limit + behind.spin_budget
    assert answer(dispatcher, [worker], recorder.sent[0])
    now, cpu = time.monotonic(), worker.cpu_seconds()
    assert cpu is not None and behind.clock_from <= now
    assert now - 0.05 < behind.deadline - 0.2 <= now and behind.watched_at == behind.clock_from + 1.0
    assert dispatcher.next_deadline <= behind.deadline
    assert cpu - 0.05 < behind.spin_limit - behind.spin_budget <= cpu + 1e-9  # its CPU budgets from the answer on
    assert behind.cpu_limit - behind.cpu_budget == pytest.approx(behind.spin_limit - behind.spin_budget)


def test_a_slice_without_a_prediction_has_no_cpu_budget() -> None:
    worker = WorkerHandle(1, 1, (0,), 1, WorkerState.READY, pid=os.getpid())
    dispatcher = Dispatcher(Recorder(), Splitter(None, "exact"), Deadlines(job_timeout_s=5, margin=3, floor_s=1))
    dispatcher.dispatch(requests(2)[0], [worker])
    (job,) = dispatcher.jobs.values()
    assert job.cpu_limit == job.cpu_budget == math.inf and job.deadline == job.sent_at + 5


def aside(size: int = 2, queued: int = 1) -> tuple[Recorder, list[WorkerHandle], Dispatcher]:
    """No profile, one-thread workers; `queued`: the inputs the batcher holds meanwhile."""
    recorder, pool = Recorder(), workers(*[1] * size)
    dispatcher = Dispatcher(
        recorder,
        Splitter(None, "exact"),
        Deadlines(job_timeout_s=60, margin=3.0, floor_s=1.0, hedge_margin=1.5, hedge_floor_s=0.1),
    )
    dispatcher.serving = pool
    dispatcher.queued = lambda: queued
    dispatcher.timing.typical_slice_s = 0.02  # as answers taught it: late after the hedge floor, 0.1 s
    return recorder, pool, dispatcher


def test_a_batch_whose_last_slice_is_late_moves_aside_answering_what_is_in_and_the_next_batch_starts() -> None:
    # Issue 27, 9: one batch was in flight at a time, so a slice hung on one input held every client's requests
    # until its deadline, and then the hung request's run alone held them again.
    recorder, pool, dispatcher = aside()
    batch, arrays = requests(1, 1)
    dispatcher.dispatch(batch, pool)
    first, late = recorder.sent  # a row each, on workers 1 and 2
    assert answer(dispatcher, pool, first) == []
    in_flight = dispatcher.batch
    assert in_flight is not None and dispatcher.next_deadline <= in_flight.aside_at
    assert abs(in_flight.aside_at - max(job.sent_at for job in dispatcher.jobs.values()) - 0.1) < 1e-9
    assert dispatcher.move_aside(in_flight.aside_at - 0.01) is None and dispatcher.batch is in_flight
    done = dispatcher.move_aside(in_flight.aside_at + 0.01)
    assert done is not None and [c.request for c in done] == [batch[0]] and batch[0].answered
    np.testing.assert_array_equal(done[0].output, arrays[0] * 2)
    assert not dispatcher.busy and dispatcher.aside == [in_flight]
    pool[1].outstanding = 1  # as the pool counts the late slice
    following, more = requests(1)
    dispatcher.dispatch(following, pool)
    assert recorder.sent[2][0] == pool[0].identity  # the next batch goes to the free worker
    assert [c.request for c in answer(dispatcher, pool, recorder.sent[2])] == following
    done = answer(dispatcher, pool, late)  # the late slice's answer completes the request it held
    assert [c.request for c in done] == [batch[1]] and dispatcher.aside == []
    np.testing.assert_array_equal(done[0].output, arrays[1] * 2)


def test_a_late_batch_stays_while_no_worker_is_free_for_the_next() -> None:
    recorder, pool, dispatcher = aside()
    dispatcher.dispatch(requests(1, 1)[0], pool)
    assert answer(dispatcher, pool, recorder.sent[0]) == []
    in_flight = dispatcher.batch
    assert in_flight is not None
    pool[0].outstanding = 1  # busy with something else (a hedge's loser, say)
    now = in_flight.aside_at + 0.01
    assert dispatcher.move_aside(now) is None and dispatcher.batch is in_flight
    assert in_flight.aside_at == now + ASIDE_RECHECK_S and dispatcher.next_deadline <= in_flight.aside_at


def test_a_request_run_aside_hangs_or_fails_without_touching_the_loops_batch() -> None:
    recorder, pool, dispatcher = aside(3)
    (suspect, other), _ = requests(1, 1)
    suspect.alone = other.alone = True
    dispatcher.run_aside(suspect, pool[2])
    dispatcher.run_aside(other, pool[1])
    main, arrays = requests(1)
    dispatcher.dispatch(main, pool[:1])
    assert dispatcher.busy and len(dispatcher.aside) == 2
    by_worker = {job.worker.id: job for job in dispatcher.jobs.values()}
    hang = dispatcher.hang(by_worker[3])
    assert hang is not None and hang.hung == [suspect] and hang.again == [] and hang.replace == [pool[2]]
    assert dispatcher.fail(by_worker[2].id) == ([other], [])
    assert dispatcher.aside == [] and dispatcher.batch is not None
    done = answer(dispatcher, pool, recorder.sent[2])
    assert [c.request for c in done] == main
    np.testing.assert_array_equal(done[0].output, arrays[0] * 2)


def test_parked_and_aside_requests_keep_the_dispatcher_busy_while_nothing_is_queued_hold_a_drain_and_expire() -> None:
    recorder, pool, dispatcher = aside(queued=0)
    (parked, moved), _ = requests(1, 1)
    parked.deadline = 5.0
    dispatcher.parked.append(parked)
    dispatcher.run_aside(moved, pool[0])
    assert dispatcher.busy and dispatcher.holds_work  # the loop wakes for their deadlines
    dispatcher.queued = lambda: 3
    assert not dispatcher.busy  # the next batch may start
    assert dispatcher.holds_work  # and a drain still waits for them, whatever is queued
    assert dispatcher.expire(4.0) == [] and dispatcher.next_deadline <= 5.0
    assert dispatcher.expire(6.0) == [parked] and dispatcher.parked == []
    assert dispatcher.abandon() == [moved] and dispatcher.aside == [] and dispatcher.jobs == {}
    assert not dispatcher.holds_work


def test_nothing_moves_aside_before_a_slice_was_answered_or_predicted_or_with_hedging_off() -> None:
    recorder, pool, dispatcher = aside()
    dispatcher.timing.typical_slice_s = math.inf
    dispatcher.dispatch(requests(1, 1)[0], pool)
    assert dispatcher.batch is not None and dispatcher.batch.aside_at == math.inf
    for sent in recorder.sent:
        answer(dispatcher, pool, sent)
    assert dispatcher.timing.typical_slice_s < math.inf  # learned from the answers
    dispatcher.set_deadlines(dataclasses.replace(dispatcher.deadlines, hedge_margin=math.inf))
    dispatcher.dispatch(requests(1, 1)[0], pool)
    assert dispatcher.batch is not None and dispatcher.batch.aside_at == math.inf


def test_before_any_answer_a_batch_is_late_after_its_predicted_slice_times_the_hedge_margin() -> None:
    recorder, pool, dispatcher = hedging(2)  # 400 ms predicted per 2-row slice, hedged after 0.6 s
    assert dispatcher.timing.typical_slice_s == math.inf
    dispatcher.dispatch(requests(2, 2)[0], pool)
    assert dispatcher.batch is not None
    sent = max(job.sent_at for job in dispatcher.jobs.values())
    assert abs(dispatcher.batch.aside_at - sent - 0.6) < 1e-9


def test_with_every_worker_busy_a_batch_leaves_out_those_whose_slice_is_late() -> None:
    recorder, pool, dispatcher = aside()
    (stuck, recent), _ = requests(1, 1)
    dispatcher.run_aside(stuck, pool[0])
    dispatcher.run_aside(recent, pool[1])
    next(job for job in dispatcher.jobs.values() if job.worker is pool[0]).sent_at -= 1.0  # a second ago: late
    pool[0].outstanding = pool[1].outstanding = 1
    dispatcher.dispatch(requests(1)[0], pool)
    assert recorder.sent[-1][0] == pool[1].identity  # queued behind a slice about to answer, not behind a hang


def test_without_a_profile_a_slice_is_predicted_from_the_slices_of_its_shape_production_timed() -> None:
    # Issue 27, 9: with no profile a hung slice's deadline was the job timeout (1 s in bench/faults.py's hanging_model:
    # every innocent request in its slice waited that long). Production's times of its shape now predict it: the
    # longest of the last few, else a smaller slice's scaled to the rows, else a larger one's.
    worker = WorkerHandle(1, 1, (0,), 1, WorkerState.READY, pid=os.getpid())
    dispatcher = Dispatcher(
        Recorder(), Splitter(None, "exact"), Deadlines(job_timeout_s=5, margin=3, floor_s=1, spin_floor_s=0.2)
    )
    assert dispatcher.learned_ms(1, 2) is None
    dispatcher.learn(1, 1, 30.0)  # a worker's warm-up
    dispatcher.learn(1, 1, 20.0)
    dispatcher.learn(1, 4, 50.0)
    dispatcher.learn(2, 3, 9.0)
    assert dispatcher.learned_ms(1, 1) == 30.0 and dispatcher.learned_ms(1, 2) == 60.0  # from 1 row, scaled
    assert dispatcher.learned_ms(1, 8) == 100.0 and dispatcher.learned_ms(2, 1) == 9.0  # from 4 rows; from 3
    assert dispatcher.learned_ms(4, 1) is None
    for _ in range(LEARNED_KEEP):  # the longest of the last LEARNED_KEEP: the warm-up's 30 ms ages out
        dispatcher.learn(1, 1, 10.0)
    assert dispatcher.learned_ms(1, 1) == 10.0
    dispatcher.dispatch(requests(2)[0], [worker])
    (job,) = dispatcher.jobs.values()
    # Not the profile's (the metrics compare that), and not hedged; its deadline and CPU budgets as a profile's.
    assert job.predicted_ms is None and job.learned_ms == 20.0 and job.hedge_at == math.inf
    assert abs(job.watched_at - job.sent_at - 1.0) < 1e-9 and abs(job.deadline - job.sent_at - 0.2) < 1e-9
    assert job.cpu_budget == 1.0 and job.spin_budget == 0.2
    assert job.cpu_at_send is not None and job.spin_limit == job.cpu_at_send + 0.2
    assert dispatcher.deadline(worker, 2, job.sent_at) == (job.watched_at + 1.0, None)  # queued behind it
    reply = {"job": job.id, "dtype": "float32", "shape": [2, 2], "compute_ms": 700.0, "batch": 2}
    dispatcher.on_result(worker, reply, [np.zeros((2, 2), np.float32)])
    assert dispatcher.learned_ms(1, 2) == 700.0  # every answer is timed


def test_a_spin_floor_looks_at_a_slice_before_its_deadline_with_a_smaller_cpu_budget() -> None:
    profile = Profile.from_latencies({(1, 2): 10.0, (1, 4): 400.0})
    worker = WorkerHandle(1, 1, (0,), 1, WorkerState.READY, pid=os.getpid())
    dispatcher = Dispatcher(
        Recorder(),
        Splitter(profile, "exact"),
        Deadlines(job_timeout_s=60, margin=3, floor_s=1, spin_floor_s=0.25),
    )
    dispatcher.dispatch(requests(2)[0], [worker])
    small = max(dispatcher.jobs.values(), key=lambda j: j.id)
    assert abs(small.deadline - small.sent_at - 0.25) < 1e-9 and abs(small.watched_at - small.sent_at - 1.0) < 1e-9
    assert (small.spin_budget, small.cpu_budget) == (0.25, 1.0)
    assert small.cpu_at_send is not None and small.spin_limit == small.cpu_at_send + 0.25
    dispatcher.abandon()
    dispatcher.dispatch(requests(4)[0], [worker])  # predicted 400 ms: 3x that is past both floors
    large = max(dispatcher.jobs.values(), key=lambda j: j.id)
    assert abs(large.deadline - large.watched_at) < 1e-9 and abs(large.watched_at - large.sent_at - 1.2) < 1e-9
    assert abs(large.spin_budget - 1.2) < 1e-9 and abs(large.cpu_budget - 1.2) < 1e-9
    # Without a spin floor (as the tests' dispatchers), the first look is the deadline, as before.
    plain = Dispatcher(Recorder(), Splitter(profile, "exact"), Deadlines(job_timeout_s=60, margin=3, floor_s=1))
    plain.dispatch(requests(2)[0], [worker])
    (job,) = plain.jobs.values()
    assert job.deadline == job.watched_at and job.spin_budget == job.cpu_budget == 1.0


def test_a_failure_answers_a_request_that_failed_alone_and_runs_its_slices_others_again_each_alone() -> None:
    # Issue 27, 7: 97 poisoned requests caused 183 INTERNAL replies to another client, batched with them.
    recorder, pool = Recorder(), workers(1, 1)
    dispatcher = Dispatcher(recorder, Splitter(None, "exact"), Deadlines(10, 1.5, 0.2))
    batch, _ = requests(1, 1, 2)
    suspect, already_alone, innocent = batch
    already_alone.alone = True
    dispatcher.dispatch(batch, pool)
    failed = recorder.sent[0][1]["job"]  # rows [0, 2): the suspect's and the one already run alone
    actions = dispatcher.failed(pool[0], {"job": failed, "message": "IndexError"})
    assert [(r, code) for r, code, _ in actions.errors] == [(already_alone, ErrorCode.INTERNAL)]
    assert actions.requeue == [innocent, suspect] and suspect.alone and not innocent.alone  # the innocents first
    assert actions.results == actions.replace == [] and not dispatcher.busy
    assert dispatcher.failed(pool[0], {"job": failed}) == Actions()  # of no batch in flight: ignored
    (only,), _ = requests(1)
    dispatcher.dispatch([only], pool[:1])
    actions = dispatcher.failed(pool[0], {"job": recorder.sent[-1][1]["job"], "message": "boom"})
    assert actions.errors == [(only, ErrorCode.INTERNAL, "the model failed on this request: boom")]
    assert actions.requeue == []  # its batch's only request: it failed on its own


def test_a_look_moves_a_slow_slices_next_look_gives_a_hung_batch_up_and_replaces_a_stopped_worker() -> None:
    recorder, pool = Recorder(), workers(1, 1)
    dispatcher = Dispatcher(recorder, Splitter(None, "exact"), Deadlines(10, 1.5, 0.2))
    batch, _ = requests(1, 1)
    dispatcher.dispatch(batch, pool)
    job = dispatcher.jobs[recorder.sent[0][1]["job"]]  # worker 1's: request 0
    now = job.sent_at + 1.0
    assert dispatcher.looked_at(job, Reading(now, 1.0, None, waiting=True, stopped=False)) == Actions()
    assert job.deadline == now + SPIN_LOOK_S and dispatcher.next_deadline <= job.deadline and job.looked is not None
    hung = dispatcher.looked_at(job, Reading(job.sent_at + 10.0, 1.0, None, waiting=True, stopped=False))
    assert hung.errors == [] and hung.requeue == [batch[1], batch[0]] and batch[0].alone
    assert hung.replace == [pool[0]] and not dispatcher.busy
    # A stopped worker is not its input's doing: replaced, its batch kept, the slice to be sent elsewhere.
    again, _ = requests(1, 1)
    dispatcher.dispatch(again, pool)
    job = max(dispatcher.jobs.values(), key=lambda j: j.id)
    stopped = dispatcher.looked_at(job, Reading(job.sent_at + 10.0, 1.0, None, waiting=False, stopped=True))
    assert stopped == Actions(replace=[job.worker]) and dispatcher.busy and not any(r.alone for r in again)
    assert dispatcher.lost(job.worker, pool) == Actions() and len(recorder.sent) == 5  # re-sent to the other


def test_a_deadline_answers_the_requests_whose_timeout_passed_in_flight() -> None:
    recorder, pool = Recorder(), workers(1)
    dispatcher = Dispatcher(recorder, Splitter(None, "exact"), Deadlines(60, 1.5, 0.2))
    batch, _ = requests(1, 1)
    batch[0].deadline = 5.0
    dispatcher.dispatch(batch, pool)
    message = "the request's timeout passed while it was computed"
    assert dispatcher.on_deadline(4.0) == Actions()
    assert dispatcher.on_deadline(6.0) == Actions(errors=[(batch[0], ErrorCode.TIMEOUT, message)])


def test_the_deadlines_are_one_value_read_from_the_settings_and_replaced_whole() -> None:
    config = SimpleNamespace(job_timeout_s=9.0, slice_deadline_margin=2.5, slice_deadline_floor_ms=50.0,
                             slice_hedge_margin=2.0, slice_hedge_floor_ms=20.0, slice_spin_floor_ms=40.0)  # fmt: skip
    deadlines = Deadlines.from_config(config)  # type: ignore[arg-type]
    assert deadlines == Deadlines(9.0, 2.5, 0.05, 2.0, 0.02, 0.04) and deadlines.spin_s == 0.04
    dispatcher = Dispatcher(Recorder(), Splitter(None, "exact"), Deadlines(60, 3, 1))
    assert dispatcher.deadlines.spin_s == 1.0  # no spin floor: the deadline floor's
    dispatcher.set_deadlines(deadlines)
    assert dispatcher.deadlines is deadlines
    # The older spelling, a job timeout and the other bounds in order, stands for the same value.
    dispatcher.set_deadlines(9.0, 2.5, 0.05, 2.0, 0.02, 0.04)
    assert dispatcher.deadlines == deadlines and (dispatcher.job_timeout_s, dispatcher.spin_floor_s) == (9.0, 0.04)


def query(request_id: int, length: int) -> Request:
    """A one-sample request of `length` tokens for TOKENS, a model of a free axis."""
    ids = np.arange(1, length + 1, dtype=np.int64).reshape(1, length)
    request = Request(b"c%d" % request_id, None, request_id, "int64", ids.shape, memoryview(ids))
    request.length = length
    return request


TOKENS = InputSpec.parse("int64:1..16").with_outputs([TensorSpec("output", "float32", (16,), free_axis=0)])


def answer_tokens(dispatcher: Dispatcher, pool: list[WorkerHandle], sent: tuple[bytes, dict, bytes]) -> list:
    identity, header, _ = sent
    worker = next(w for w in pool if w.identity == identity)
    output = np.ones(header["shape"], dtype=np.float32)  # one output per token, at the slice's padded length
    reply = {"job": header["job"], "dtype": "float32", "shape": list(output.shape), "compute_ms": 1.0,
             "threads": worker.threads, "batch": output.shape[0]}  # fmt: skip
    return dispatcher.on_result(worker, reply, [output])


@pytest.mark.parametrize("mode", [BY_COST, PAD_BATCH])
def test_a_batch_cut_by_cost_moves_aside_once_its_short_slice_is_in_and_the_next_batch_starts_on_that_worker(
    mode: str,
) -> None:
    # Issue 40: a long query and a short one, cut by cost, each on a worker of its own: the queue waited for the long
    # slice with the short one's worker free. Padded to the batch's longest, slices end together: nothing to gain.
    recorder, pool = Recorder(), workers(1, 1)
    deadlines = Deadlines(job_timeout_s=10, margin=1.5, floor_s=0.2)
    profile = Profile.from_latencies({(1, 1): 100.0, (1, 2): 200.0})  # at 16 tokens; 2 tokens: 12.5 ms
    dispatcher = Dispatcher(
        recorder, Splitter(profile, "exact"), deadlines, queued=lambda: 1, ragged=Ragged(TOKENS, mode)
    )
    dispatcher.serving = pool
    long, short = query(0, 16), query(1, 2)
    dispatcher.dispatch([long, short], pool)
    first, second = recorder.sent
    assert [header["shape"] for _, header, _ in recorder.sent] == (
        [[1, 2], [1, 16]] if mode == BY_COST else [[1, 16]] * 2
    )
    in_flight = dispatcher.batch
    done = answer_tokens(dispatcher, pool, first)
    if mode == PAD_BATCH:
        assert done == [] and dispatcher.batch is in_flight
        return
    assert [c.request for c in done] == [short] and done[0].output.shape == (1, 2)
    assert dispatcher.batch is None and dispatcher.aside == [in_flight] and not dispatcher.busy
    pool[1].outstanding = 1  # as the pool counts the long slice
    following = query(2, 4)
    dispatcher.dispatch([following], pool)
    assert recorder.sent[2][0] == pool[0].identity  # the next batch on the free worker, not behind the long slice
    assert [c.request for c in answer_tokens(dispatcher, pool, recorder.sent[2])] == [following]
    assert [c.request for c in answer_tokens(dispatcher, pool, second)] == [long] and dispatcher.aside == []


def test_the_next_batch_leaves_out_a_busy_workers_cores_unless_the_plan_shares_cores_by_design() -> None:
    dispatcher = Dispatcher(Recorder(), Splitter(None, "exact"), Deadlines(job_timeout_s=10, margin=1.5, floor_s=0.2))
    busy, free, spare = (WorkerHandle(1, 1, (0,), 1, WorkerState.READY), WorkerHandle(2, 1, (1,), 1, WorkerState.READY),
                         WorkerHandle(3, 2, (0, 1), 1, WorkerState.READY))  # fmt: skip
    busy.outstanding = 1  # a slice of a batch aside
    assert dispatcher.free_for_next([busy, free, spare], time.monotonic(), 1.0, shared_cores=False) == [free]
    assert dispatcher.free_for_next([busy, free, spare], time.monotonic(), 1.0, shared_cores=True) == [free, spare]


def test_a_late_batch_neither_moves_aside_nor_is_hedged_onto_a_spare_layout_on_its_own_cores() -> None:
    """A plan's spare layout shares the main layout's cores (a 2-thread worker on cores 0-1, 1-thread ones on 0 and
    1): the next batch or a hedge's copy on them ran beside the late slice on its cores and slowed both."""
    recorder, _, dispatcher = aside()
    wide = WorkerHandle(1, 2, (0, 1), 1, WorkerState.READY)
    narrow = [WorkerHandle(2, 1, (0,), 1, WorkerState.READY), WorkerHandle(3, 1, (1,), 1, WorkerState.READY)]
    pool = [wide, *narrow]
    dispatcher.serving = pool
    dispatcher.splitter = Splitter(Profile.from_latencies({(1, 1): 15.0, (2, 1): 10.0}), "exact")  # hedged slices
    dispatcher.dispatch(requests(1)[0], [wide])
    in_flight = dispatcher.batch
    assert in_flight is not None and in_flight.aside_at < math.inf
    assert in_flight.jobs[0].hedge_at <= in_flight.aside_at  # the slice is predicted: it would be hedged
    now = in_flight.aside_at + 0.01
    assert dispatcher.idle(pool) == narrow and dispatcher.idle_apart(pool) == []
    assert dispatcher.move_aside(now) is None and dispatcher.batch is in_flight  # the batch stays the loop's
    assert dispatcher.hedge(now + 10.0, pool) == [] and len(recorder.sent) == 1  # no copy on its cores
    apart = WorkerHandle(4, 1, (2,), 1, WorkerState.READY)  # a worker on a core of its own may take the next batch
    dispatcher.serving = [*pool, apart]
    assert dispatcher.idle_apart(dispatcher.serving) == [apart]
    assert dispatcher.move_aside(now + ASIDE_RECHECK_S) is not None and dispatcher.batch is None


def test_a_batch_moves_aside_only_while_its_slices_still_out_would_hold_the_queue_longer_than_it_has_run() -> None:
    # Cut to even costs, slices end together: waiting keeps the whole pool for the next batch. A long row alone
    # ends far later than the others: waiting would hold the queue with workers free.
    assert holds_the_queue(now=10.010, started=10.0, ends=[10.100])  # 90 ms more, after 10 ms
    assert not holds_the_queue(now=10.100, started=10.0, ends=[10.105])  # 5 ms more, after 100 ms
    assert not holds_the_queue(now=10.0, started=10.0, ends=[])
    recorder, pool = Recorder(), workers(1, 1)
    profile = Profile.from_latencies({(1, 1): 100.0, (1, 2): 200.0})
    dispatcher = Dispatcher(recorder, Splitter(profile, "exact"), Deadlines(job_timeout_s=10, margin=1.5, floor_s=0.2),
                            queued=lambda: 1, ragged=Ragged(TOKENS, BY_COST))  # fmt: skip
    dispatcher.serving = pool
    dispatcher.dispatch([query(0, 16), query(1, 16)], pool)
    in_flight = dispatcher.batch
    assert in_flight is not None
    in_flight.started -= 0.1  # as if the first slice came back after its 100 ms, the second due now
    for job in in_flight.jobs:
        job.sent_at -= 0.1
    assert answer_tokens(dispatcher, pool, recorder.sent[0]) == [] and dispatcher.batch is in_flight
