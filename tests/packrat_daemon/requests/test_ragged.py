"""Requests of a free axis: each slice padded to its own longest, answers cut back to each request's length, a
batch sorted by length (or, in the baseline mode, left in order and padded to its longest), and the batcher's
token budget and one-length rule."""

from __future__ import annotations

import numpy as np

from packrat_daemon.requests import slices
from packrat_daemon.requests.batcher import Batcher, Request
from packrat_daemon.requests.ragged import PAD_BATCH, Ragged
from packrat_daemon.wire.codec import pack_records, unpack_records
from workers.models.spec import InputSpec, TensorSpec

TEXT = InputSpec.of(
    [TensorSpec("input_ids", "int64", (16,), 100, free_axis=0), TensorSpec("attention_mask", "int64", (16,), 2, 0)],
    [TensorSpec("hidden", "float32", (16, 3), free_axis=0), TensorSpec("pooled", "float32", (3,))],
)
ONE = InputSpec.parse("int64:1..16").with_outputs([TensorSpec("output", "float32", (16,), free_axis=0)])


def text_request(length: int, samples: int = 1, start: int = 1) -> Request:
    ids = np.arange(start, start + samples * length, dtype=np.int64).reshape(samples, length)
    rows = pack_records([ids, np.ones_like(ids)])
    request = Request(b"c", None, length, "uint8", rows.shape, rows.reshape(-1).data)
    request.length = length
    return request


def test_a_slice_is_padded_to_its_own_longest_with_zeros_the_mask_marks_as_padding() -> None:
    requests = [text_request(3), text_request(5, samples=2, start=50)]
    rows, length = Ragged(TEXT).rows(requests, 0, 3)
    assert length == 5
    ids, mask = unpack_records(rows, [("int64", (5,)), ("int64", (5,))])
    np.testing.assert_array_equal(ids[0], [1, 2, 3, 0, 0])
    np.testing.assert_array_equal(mask[0], [1, 1, 1, 0, 0])
    np.testing.assert_array_equal(ids[1:], np.arange(50, 60).reshape(2, 5))
    rows, length = Ragged(TEXT).rows(requests, 0, 1)  # the first request alone: its own length, nothing padded
    assert length == 3 and rows.shape == (1, 2 * 3 * 8)


def test_the_baseline_pads_every_slice_to_the_batchs_longest() -> None:
    requests = [text_request(3), text_request(9)]
    _, length = Ragged(TEXT, PAD_BATCH).rows(requests, 0, 1)
    assert length == 9


def test_a_per_token_output_is_cut_back_to_the_requests_length_and_a_pooled_one_kept() -> None:
    cutter = Ragged(TEXT)
    hidden = np.arange(2 * 5 * 3, dtype=np.float32).reshape(2, 5, 3)
    pooled = np.ones((2, 3), np.float32)
    answered = cutter.cut(pack_records([hidden, pooled]), 5, 2)
    got_hidden, got_pooled = unpack_records(answered, [("float32", (2, 3)), ("float32", (3,))])
    np.testing.assert_array_equal(got_hidden, hidden[:, :2])
    np.testing.assert_array_equal(got_pooled, pooled)
    single = np.arange(2 * 9, dtype=np.float32).reshape(2, 9)
    np.testing.assert_array_equal(Ragged(ONE).cut(single, 9, 4), single[:, :4])
    assert Ragged(ONE).cut(single, 9, 9) is single


def test_a_batch_is_sorted_by_length_except_in_the_baseline() -> None:
    requests = [text_request(9), text_request(2), text_request(5)]
    assert [r.length for r in slices.in_flight(requests, Ragged(TEXT)).requests] == [2, 5, 9]
    assert [r.length for r in slices.in_flight(requests, Ragged(TEXT, PAD_BATCH)).requests] == [9, 2, 5]
    assert slices.in_flight(requests, None).ragged is None


def lengths(batch: list[Request]) -> list[int]:
    return [request.length for request in batch]


def test_the_batcher_keeps_a_batch_under_its_token_budget_and_takes_the_rest_next() -> None:
    batcher = Batcher(max_batch=8, max_delay_s=0.0, max_queued_inputs=100)
    batcher.lengths(max_tokens=64, masked=True)
    for length in (10, 12, 40, 8, 9):
        batcher.offer(text_request(length))
    first = batcher.take()
    assert lengths(first) == [10, 12, 8, 9]  # 40 would make 5 x 40 = 200 padded tokens: passed over
    assert lengths(batcher.take()) == [40]


def test_a_model_without_a_mask_batches_one_length_at_a_time() -> None:
    batcher = Batcher(max_batch=8, max_delay_s=0.0, max_queued_inputs=100)
    batcher.lengths(max_tokens=8 * 16, masked=False)
    for length in (7, 3, 7, 3, 7):
        batcher.offer(text_request(length))
    assert lengths(batcher.take()) == [7, 7, 7]
    assert lengths(batcher.take()) == [3, 3]
