"""The splitter on real worker handles: which complete layout takes a batch, how many rows each worker gets,
the fallbacks when no layout is complete or the profile cannot answer, and the per-pool-list cache."""

from __future__ import annotations

from packrat_daemon.fleet.pool import WorkerHandle, WorkerState
from packrat_daemon.requests.splitter import Splitter
from policies.planning.profile import Profile

Layouts = list[list[tuple[int, tuple[int, ...]]]]


def workers(*threads: int) -> list[WorkerHandle]:
    """Ready workers on cores of their own: worker k+1 on core k."""
    return [WorkerHandle(k + 1, t, (k,), 1, WorkerState.READY) for k, t in enumerate(threads)]


def rows(splitter: Splitter, pool: list[WorkerHandle], batch: int) -> list[tuple[int, int]]:
    """(worker id, rows) for each worker that takes part of `batch`."""
    return [(worker.id, taken) for worker, taken in splitter.choose(pool, batch)]


def spare_layout_pool() -> tuple[list[WorkerHandle], Layouts]:
    """One 2-thread worker on cores 0-1 and two 1-thread workers on the same cores: two layouts."""
    pool = [
        WorkerHandle(1, 2, (0, 1), 1, WorkerState.READY),
        WorkerHandle(2, 1, (0,), 1, WorkerState.READY),
        WorkerHandle(3, 1, (1,), 1, WorkerState.READY),
    ]
    return pool, [[(2, (0, 1))], [(1, (0,)), (1, (1,))]]


# Batch 16 is 3% faster split over the two 1-thread workers (970 ms) than on the 2-thread worker (1000 ms).
NEAR_TIE = Profile.from_latencies({(1, 8): 970.0, (1, 16): 1940.0, (2, 8): 500.0, (2, 16): 1000.0})
# Here the split is 20% faster (800 ms against 1000 ms).
SPLIT_PAYS = Profile.from_latencies({(1, 8): 800.0, (1, 16): 1600.0, (2, 8): 500.0, (2, 16): 1000.0})


# -- how many rows each worker takes ----------------------------------------------------------------
def test_the_exact_split_follows_the_profile() -> None:
    # The 2-thread worker takes 4 rows at 12 ms; the 1-thread worker the other 2 at 10 ms.
    profile = Profile.from_latencies({(1, 2): 10.0, (1, 4): 20.0, (2, 4): 12.0, (2, 8): 30.0})
    assert rows(Splitter(profile, "exact"), workers(2, 1), 6) == [(1, 4), (2, 2)]


def test_without_a_profile_exact_splits_by_threads_and_even_splits_evenly() -> None:
    assert rows(Splitter(None, "exact"), workers(2, 1, 1), 8) == [(1, 4), (2, 2), (3, 2)]
    assert rows(Splitter(None, "even"), workers(2, 2), 5) == [(1, 3), (2, 2)]
    # The remainder goes one row each to the first workers.
    assert rows(Splitter(None, "even"), workers(1, 1, 1), 8) == [(1, 3), (2, 3), (3, 2)]


def test_a_profile_that_cannot_carry_the_batch_falls_back_to_the_threads() -> None:
    profile = Profile.from_latencies({(1, 1): 1.0})  # two 1-thread workers carry 2 inputs, not 5
    assert rows(Splitter(profile, "exact"), workers(1, 1), 5) == [(1, 3), (2, 2)]


def test_a_worker_given_no_rows_is_left_out() -> None:
    assert rows(Splitter(None, "even"), workers(1, 1, 1), 2) == [(1, 1), (2, 1)]
    assert rows(Splitter(None, "exact"), workers(4, 1), 1) == [(1, 1)]


# -- which layout -----------------------------------------------------------------------------------
def test_a_batch_stays_on_one_worker_unless_a_split_clears_the_margin() -> None:
    pool, layouts = spare_layout_pool()
    assert rows(Splitter(NEAR_TIE, "exact", layouts, min_split_gain=0.05), pool, 16) == [(1, 16)]
    assert rows(Splitter(NEAR_TIE, "exact", layouts, min_split_gain=0.0), pool, 16) == [(2, 8), (3, 8)]


def test_a_split_that_clears_the_margin_is_taken() -> None:
    pool, layouts = spare_layout_pool()
    assert rows(Splitter(SPLIT_PAYS, "exact", layouts, min_split_gain=0.05), pool, 16) == [(2, 8), (3, 8)]


def test_each_batch_size_gets_its_own_layout() -> None:
    # One input: the 2-thread worker alone (60 ms) beats a 1-thread one (100 ms); sixteen: the split wins.
    profile = Profile.from_latencies({(1, 1): 100.0, (1, 8): 600.0, (2, 1): 60.0, (2, 16): 1300.0})
    pool, layouts = spare_layout_pool()
    splitter = Splitter(profile, "exact", layouts, min_split_gain=0.05)
    assert rows(splitter, pool, 1) == [(1, 1)]
    assert rows(splitter, pool, 16) == [(2, 8), (3, 8)]


def test_a_worker_switching_its_threads_completes_no_layout() -> None:
    pool, layouts = spare_layout_pool()
    pool[0].pending = (1, (0,), 2)  # told to re-thread: it finishes what it holds, and takes no new batch
    assert rows(Splitter(NEAR_TIE, "exact", layouts, min_split_gain=0.05), pool, 16) == [(2, 8), (3, 8)]


def test_a_layout_needs_a_distinct_worker_for_each_slot() -> None:
    pool, _ = spare_layout_pool()
    twice_core_0: Layouts = [[(1, (0,)), (1, (0,))]]  # only worker 2 fits, and it cannot fill both slots
    # No layout is complete: the fallback takes disjoint workers, the 2-thread one first (see below).
    assert rows(Splitter(None, "exact", twice_core_0), pool, 3) == [(1, 3)]


def test_with_no_complete_layout_ready_workers_on_disjoint_cores_take_the_batch() -> None:
    pool = [
        WorkerHandle(1, 1, (0,), 1, WorkerState.READY),
        WorkerHandle(2, 2, (0, 1), 1, WorkerState.READY),
        WorkerHandle(3, 1, (2,), 1, WorkerState.READY),
    ]
    mid_switch: Layouts = [[(4, (0, 1, 2, 3))]]  # the plan's 4-thread worker is not up yet
    # The largest worker first; worker 1 shares core 0 with it and is left out.
    assert rows(Splitter(None, "exact", mid_switch), pool, 6) == [(2, 4), (3, 2)]
    # A plan whose instances share cores on purpose uses every worker.
    assert rows(Splitter(None, "exact", mid_switch, oversubscribed=True), pool, 8) == [(1, 2), (2, 4), (3, 2)]


# -- remembered answers and predictions -------------------------------------------------------------
def test_choices_are_remembered_per_pool_list() -> None:
    pool, layouts = spare_layout_pool()
    splitter = Splitter(SPLIT_PAYS, "exact", layouts)
    first = splitter.choose(pool, 16)
    assert splitter.choose(pool, 16) is first
    # A new list (the daemon builds one whenever its pool changes) is answered afresh.
    assert rows(splitter, [pool[0]], 16) == [(1, 16)]
    assert splitter.choose(pool, 16) is not first and rows(splitter, pool, 16) == [(2, 8), (3, 8)]


def test_the_prediction_is_the_smallest_profiled_batch_that_holds_the_rows() -> None:
    splitter = Splitter(Profile.from_latencies({(1, 2): 10.0, (1, 8): 30.0, (2, 8): 20.0}), "exact")
    assert splitter.predicted_ms(1, 2) == 10.0
    assert splitter.predicted_ms(1, 3) == 30.0
    assert splitter.predicted_ms(2, 1) == 20.0
    assert splitter.predicted_ms(1, 9) is None  # past the largest profiled batch
    assert splitter.predicted_ms(4, 1) is None  # no row for 4 threads
    assert Splitter(None, "exact").predicted_ms(1, 1) is None


# -- a batch of a free axis: the layout chosen by the rows' cost, not their count -------------------------------
def test_short_rows_take_the_layout_their_tokens_favour_not_their_count() -> None:
    # Counted at the profile's length (128), two rows split over the 1-thread workers (80 ms against 100); two rows of
    # 16 tokens cost a 1-thread worker nearly its fixed cost (71 ms each) but the 2-thread worker 12.5 ms for both.
    profile = Profile.from_latencies({(1, 1): 80.0, (1, 2): 90.0, (2, 1): 50.0, (2, 2): 100.0})
    pool, layouts = spare_layout_pool()
    splitter = Splitter(profile, "exact", layouts, min_split_gain=0.05)
    assert rows(splitter, pool, 2) == [(2, 1), (3, 1)]
    short = splitter.choose_by_cost(pool, [16, 16], 128)
    assert [(worker.id, taken) for worker, taken in short] == [(1, 2)]
    long = splitter.choose_by_cost(pool, [128, 128], 128)
    assert [(worker.id, taken) for worker, taken in long] == [(2, 1), (3, 1)]


def test_without_a_profile_a_free_axis_batch_is_cut_by_tokens_over_the_layout_the_count_chooses() -> None:
    splitter = Splitter(None, "exact")
    chosen = splitter.choose_by_cost(workers(1, 1), [8, 8, 8, 8, 128], 128)
    assert [(worker.id, taken) for worker, taken in chosen] == [(1, 4), (2, 1)]
