"""Profile CSV parsing, its errors, round trips, and the table queries the solver relies on."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from packrat_daemon.wire.errors import ProfileError
from policies.planning.profile import Cell, Profile


def parse(text: str) -> Profile:
    return Profile.parse_csv(text, source="p.csv")


# -- reading -------------------------------------------------------------------------------------
def test_minimal_header_reads_every_row() -> None:
    profile = parse("threads,batch,latency_ms\n1,1,10\n1,4,30.5\n2,1,6\n")
    assert len(profile) == 3
    assert profile.latency(1, 4) == 30.5
    assert profile.cell(2, 1) == Cell(6.0, samples=1, p90_ms=None)
    assert profile.threads() == [1, 2]
    assert profile.batches() == [1, 4]
    assert profile.batches(2) == [1]


def test_header_columns_may_come_in_any_order_and_case_with_spaces() -> None:
    profile = parse(" Latency_MS , Batch ,THREADS\n 12.5 , 8 , 2 \n")
    assert profile.latency(2, 8) == 12.5


def test_extra_columns_are_read_or_ignored() -> None:
    text = "runtime,threads,batch,latency_ms,samples,p90_ms,host\ntorch,2,8,12.5,7,14.0,box-1\n"
    cell = parse(text).cell(2, 8)
    assert cell == Cell(12.5, samples=7, p90_ms=14.0)


def test_empty_optional_fields_take_their_defaults() -> None:
    cell = parse("threads,batch,latency_ms,samples,p90_ms\n1,1,5,,\n").cell(1, 1)
    assert cell == Cell(5.0, samples=1, p90_ms=None)


def test_comment_lines_and_blank_lines_are_skipped_and_carry_metadata() -> None:
    text = (
        "# model: builtin:resnet50\n"
        "# runtime: torch\n"
        "# measured on box-1, 2 cores\n"
        "\n"
        "threads,batch,latency_ms\n"
        "# a comment between rows\n"
        "1,1,10\n"
        "\n"
        "2,1,6\n"
    )
    profile = parse(text)
    assert sorted(profile) == [(1, 1), (2, 1)]
    assert profile.model == "builtin:resnet50"
    assert profile.runtime == "torch"


def test_metadata_values_keep_their_commas() -> None:
    assert parse("# model: pkg.mod:make, variant a\nthreads,batch,latency_ms\n1,1,1\n").model == (
        "pkg.mod:make, variant a"
    )


def test_duplicate_rows_are_merged_by_sample_weighted_mean() -> None:
    text = "threads,batch,latency_ms,samples,p90_ms\n1,8,10,1,12\n2,8,7,1,\n1,8,20,3,16\n"
    cell = parse(text).cell(1, 8)
    assert cell.samples == 4
    assert cell.latency_ms == pytest.approx((10 * 1 + 20 * 3) / 4)
    assert cell.p90_ms == pytest.approx((12 * 1 + 16 * 3) / 4)


def test_duplicate_rows_without_samples_column_count_once_each() -> None:
    cell = parse("threads,batch,latency_ms\n1,1,10\n1,1,20\n1,1,30\n").cell(1, 1)
    assert cell == Cell(20.0, samples=3, p90_ms=None)


def test_integers_written_as_floats_are_accepted() -> None:
    assert (4, 16) in parse("threads,batch,latency_ms\n4.0,16.0,1e1\n")


# -- errors, each naming the file and line -------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("threads,latency_ms\n1,5\n", r"p\.csv:1: header lacks column\(s\) batch"),
        ("# model: m\n\nthread,batch,latency\n", r"p\.csv:3: header lacks column\(s\) threads, latency_ms"),
        ("threads,batch,latency_ms\n1,1,5\n1,2\n", r"p\.csv:3: expected 3 fields as in the header, got 2"),
        ("threads,batch,latency_ms\n1,1,5,9\n", r"p\.csv:2: expected 3 fields as in the header, got 4"),
        ("threads,batch,latency_ms\n1.5,1,5\n", r"p\.csv:2: column threads must be an integer, got '1\.5'"),
        ("threads,batch,latency_ms\n\ntwo,1,5\n", r"p\.csv:3: column threads must be an integer, got 'two'"),
        ("threads,batch,latency_ms\nnan,1,5\n", r"p\.csv:2: column threads must be an integer"),
        ("threads,batch,latency_ms\n0,1,5\n", r"p\.csv:2: threads must be >= 1, got 0"),
        ("threads,batch,latency_ms\n1,0,5\n", r"p\.csv:2: batch must be >= 1, got 0"),
        ("threads,batch,latency_ms\n1,1,-5\n", r"p\.csv:2: latency_ms must be a positive finite number, got -5"),
        ("threads,batch,latency_ms\n1,1,0\n", r"p\.csv:2: latency_ms must be a positive finite number"),
        ("threads,batch,latency_ms\n1,1,nan\n", r"p\.csv:2: latency_ms must be a positive finite number, got nan"),
        ("threads,batch,latency_ms\n1,1,inf\n", r"p\.csv:2: latency_ms must be a positive finite number, got inf"),
        ("threads,batch,latency_ms\n1,1,fast\n", r"p\.csv:2: column latency_ms must be a number, got 'fast'"),
        ("threads,batch,latency_ms,samples\n1,1,5,0\n", r"p\.csv:2: samples must be >= 1, got 0"),
        ("threads,batch,latency_ms,p90_ms\n1,1,5,x\n", r"p\.csv:2: column p90_ms must be a number"),
    ],
    ids=[
        "missing-column",
        "missing-columns-after-comments",
        "too-few-fields",
        "too-many-fields",
        "fractional-threads",
        "word-threads",
        "nan-threads",
        "zero-threads",
        "zero-batch",
        "negative-latency",
        "zero-latency",
        "nan-latency",
        "inf-latency",
        "word-latency",
        "zero-samples",
        "word-p90",
    ],
)
def test_malformed_profile_names_the_line(text: str, message: str) -> None:
    with pytest.raises(ProfileError, match=message):
        parse(text)


@pytest.mark.parametrize("text", ["", "\n\n", "# only a comment\n"], ids=["empty", "blank-lines", "comment-only"])
def test_profile_without_header_is_refused(text: str) -> None:
    with pytest.raises(ProfileError, match=r"p\.csv: empty profile; expected a header threads,batch,latency_ms"):
        parse(text)


def test_header_only_profile_is_refused() -> None:
    with pytest.raises(ProfileError, match=r"p\.csv: the profile has a header but no rows"):
        parse("# model: m\nthreads,batch,latency_ms\n\n")


def test_missing_file_says_how_to_make_one(tmp_path: Path) -> None:
    with pytest.raises(ProfileError, match=r"does not exist; measure one with `packrat profile`"):
        Profile.read_csv(tmp_path / "absent.csv")


def test_file_errors_name_the_path(tmp_path: Path) -> None:
    path = tmp_path / "bad.csv"
    path.write_text("threads,batch,latency_ms\n1,1,5\n1,0,5\n")
    with pytest.raises(ProfileError, match=f"{path}:3: batch must be >= 1"):
        Profile.read_csv(path)


def test_constructor_rejects_invalid_cells() -> None:
    with pytest.raises(ProfileError, match=r"cell \(1, 2\): latency_ms must be a positive finite number"):
        Profile.from_latencies({(1, 1): 1.0, (1, 2): math.inf})


# -- writing -------------------------------------------------------------------------------------
def test_write_then_read_gives_the_same_profile(tmp_path: Path) -> None:
    cells = {
        (1, 1): Cell(10.25, samples=3, p90_ms=11.5),
        (1, 8): Cell(70.0, samples=1, p90_ms=None),
        (4, 8): Cell(21.125, samples=12, p90_ms=25.0),
    }
    profile = Profile(cells, model="builtin:tiny-mlp", runtime="torch")
    path = tmp_path / "profile.csv"
    profile.write_csv(path)
    again = Profile.read_csv(path)
    assert again == profile
    assert dict(again.items()) == cells
    assert (again.model, again.runtime) == ("builtin:tiny-mlp", "torch")
    assert [p.name for p in tmp_path.iterdir()] == ["profile.csv"], "the temporary file must be gone"


def test_write_replaces_an_existing_file(tmp_path: Path) -> None:
    path = tmp_path / "profile.csv"
    path.write_text("old")
    Profile.from_latencies({(2, 4): 8.0}).write_csv(path)
    assert Profile.read_csv(path).latency(2, 4) == 8.0


def test_round_trip_keeps_latencies_to_a_tenth_of_a_microsecond(tmp_path: Path) -> None:
    profile = Profile.from_latencies({(1, 1): 1 / 3, (2, 3): 123.456789})
    path = tmp_path / "p.csv"
    profile.write_csv(path)
    again = Profile.read_csv(path)
    for key, cell in profile.items():
        assert again.latency(*key) == pytest.approx(cell.latency_ms, abs=5e-5)


# -- queries -------------------------------------------------------------------------------------
SPARSE = Profile.from_latencies({(1, 2): 10.0, (1, 8): 30.0, (2, 1): 4.0, (2, 4): 9.0, (2, 16): 25.0})


@pytest.mark.parametrize(
    ("threads", "batch", "expected"),
    [
        (1, 1, 10.0),  # below the smallest profiled batch: that batch's latency
        (1, 2, 10.0),  # exactly profiled
        (1, 3, 30.0),  # between profiled batches: the next larger one
        (1, 8, 30.0),
        (1, 9, None),  # beyond the largest profiled batch
        (2, 5, 25.0),
        (2, 17, None),
        (3, 1, None),  # no row for this thread count
    ],
)
def test_lhat_is_the_smallest_profiled_batch_at_least_b(threads: int, batch: int, expected: float | None) -> None:
    assert SPARSE.lhat(threads, batch) == expected


def test_rows_and_max_batch() -> None:
    assert SPARSE.row(2) == ((1, 4.0), (4, 9.0), (16, 25.0))
    assert SPARSE.row(3) == ()
    assert SPARSE.max_batch(1) == 8
    assert SPARSE.max_batch(3) == 0


def test_merged_combines_shared_cells_and_keeps_the_rest() -> None:
    offline = Profile({(1, 1): Cell(10.0, samples=3), (2, 1): Cell(6.0)}, model="m")
    production = Profile({(1, 1): Cell(14.0, samples=1), (4, 1): Cell(3.0)}, runtime="torch")
    merged = offline.merged(production)
    assert merged.cell(1, 1) == Cell((10.0 * 3 + 14.0) / 4, samples=4)
    assert merged.latency(2, 1) == 6.0
    assert merged.latency(4, 1) == 3.0
    assert (merged.model, merged.runtime) == ("m", "torch")
    assert len(offline) == 2 and offline.latency(1, 1) == 10.0, "merged() must not change the original"


def test_cell_merge_keeps_the_only_known_p90() -> None:
    assert Cell(10.0, 1, None).merged(Cell(20.0, 1, 30.0)) == Cell(15.0, 2, 30.0)
    assert Cell(10.0, 1, 12.0).merged(Cell(20.0, 1, None)) == Cell(15.0, 2, 12.0)


def test_quote_in_a_comment_does_not_swallow_rows() -> None:
    profile = parse('threads,batch,latency_ms\n# source: bench,"2 cores\n1,1,5\n1,2,8\n')
    assert sorted(profile) == [(1, 1), (1, 2)]


def test_runtime_column_keeps_each_runtime_apart(tmp_path: Path) -> None:
    from policies.planning.profile import write_profiles

    torch_rows = Profile.from_latencies({(1, 1): 10.0, (2, 1): 7.0}, runtime="torch")
    ort_rows = Profile.from_latencies({(1, 1): 6.0}, runtime="onnxruntime")
    path = tmp_path / "both.csv"
    write_profiles(path, [torch_rows, ort_rows])
    both = Profile.read_all(path)
    assert set(both) == {"torch", "onnxruntime"}
    assert both["torch"] == torch_rows and both["onnxruntime"].latency(1, 1) == 6.0
    assert Profile.read_csv(path, runtime="onnxruntime").runtime == "onnxruntime"
    with pytest.raises(ProfileError, match="several runtimes"):
        Profile.read_csv(path)
    with pytest.raises(ProfileError, match="no rows for runtime 'openvino'"):
        Profile.read_csv(path, runtime="openvino")


def test_profile_without_runtime_serves_any_runtime() -> None:
    profile = Profile.parse_csv("threads,batch,latency_ms\n1,1,5\n", runtime="openvino")
    assert profile.latency(1, 1) == 5.0


def test_precision_column_keeps_each_precision_apart(tmp_path: Path) -> None:
    from policies.planning.profile import profile_key, write_profiles

    fp32 = Profile.from_latencies({(1, 1): 10.0}, runtime="openvino")
    bf16 = Profile({(1, 1): Cell(3.0)}, runtime="openvino", precision="bf16")
    path = tmp_path / "both.csv"
    write_profiles(path, [fp32, bf16])
    assert path.read_text().splitlines()[0].endswith(",runtime,precision")
    both = Profile.read_all(path)
    assert set(both) == {"openvino", "openvino/bf16"} == {profile_key("openvino"), profile_key("openvino", "bf16")}
    read = Profile.read_csv(path, runtime="openvino", precision="bf16")
    assert (read.precision, read.latency(1, 1)) == ("bf16", 3.0)
    assert Profile.read_csv(path, runtime="openvino").precision == "fp32"
    with pytest.raises(ProfileError, match="no rows for runtime 'torch' at bf16"):
        Profile.read_csv(path, runtime="torch", precision="bf16")


def test_a_file_written_before_the_precision_column_reads_as_fp32() -> None:
    old = "threads,batch,latency_ms,samples,p90_ms,runtime\n1,1,5.0,3,,torch\n"
    read = Profile.parse_csv(old, runtime="torch")
    assert (read.runtime, read.precision, read.latency(1, 1)) == ("torch", "fp32", 5.0)


def test_a_non_utf8_profile_is_a_profile_error_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "latin1.csv"
    path.write_bytes("threads,batch,latency_ms\n1,1,2.0\n# caf\u00e9\n".encode("latin-1"))
    with pytest.raises(ProfileError, match=r"latin1\.csv is not UTF-8 text") as caught:
        Profile.read_csv(path)
    assert "\n" not in str(caught.value)
