"""Length distributions: each form parsed and read back, drawn whole within its bounds with the statistics it
was given, seeded; and every malformed form refused, saying what to write."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from packrat_daemon.load.lengths import Empirical, Fixed, LogNormal, Uniform, parse_lengths
from packrat_daemon.wire.errors import ConfigError

DRAWS = 20_000


def draw(text: str, n: int = DRAWS, seed: int = 0) -> np.ndarray:
    return parse_lengths(text).sample(np.random.default_rng(seed), n)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("fixed:128", Fixed(128)),
        ("uniform:8..64", Uniform(8, 64)),
        (" uniform: 8 .. 64 ", Uniform(8, 64)),
        ("lognormal:median=12,p99=64,max=128", LogNormal.from_p99(12.0, 64.0, 128)),
        ("lognormal:max=128,sigma=0.5,median=12,min=2", LogNormal(12.0, 0.5, 128, 2)),
    ],
)
def test_each_form_is_read_and_its_description_reads_back(text: str, expected: object) -> None:
    parsed = parse_lengths(text)
    assert parsed == expected
    again = parse_lengths(parsed.describe())
    assert again.describe() == parsed.describe()
    assert (again.shortest, again.longest) == (parsed.shortest, parsed.longest)


def test_fixed_and_uniform_draw_whole_lengths_within_their_bounds() -> None:
    assert set(draw("fixed:7", 100).tolist()) == {7}
    lengths = draw("uniform:8..64")
    assert lengths.dtype == np.int64 and lengths.min() == 8 and lengths.max() == 64  # both ends included
    counts = np.bincount(lengths)[8:65]
    assert counts.min() > 0.7 * DRAWS / 57 and counts.max() < 1.3 * DRAWS / 57  # each about as likely


def test_a_lognormal_has_the_median_and_p99_it_was_given_and_stays_within_its_bounds() -> None:
    lengths = draw("lognormal:median=12,p99=64,max=128")
    assert lengths.dtype == np.int64 and lengths.min() >= 1 and lengths.max() <= 128
    assert np.median(lengths) == pytest.approx(12, abs=1)
    assert np.percentile(lengths, 99) == pytest.approx(64, rel=0.1)
    assert (lengths == 128).mean() < 0.002  # truncated, not clipped: nothing piles up at max


def test_a_tight_lognormal_is_redrawn_into_its_bounds_not_clipped() -> None:
    lengths = draw("lognormal:median=40,sigma=1,max=48,min=32")
    assert lengths.min() >= 32 and lengths.max() <= 48
    counts = np.bincount(lengths)[32:49]
    assert counts[0] < 2 * counts[1] and counts[-1] < 2 * counts[-2]  # no pile at either bound


def test_the_same_seed_draws_the_same_lengths() -> None:
    for text in ("uniform:1..512", "lognormal:median=12,p99=64,max=128"):
        np.testing.assert_array_equal(draw(text, 500, seed=3), draw(text, 500, seed=3))
        assert not np.array_equal(draw(text, 500, seed=3), draw(text, 500, seed=4))


def test_a_file_of_lengths_is_drawn_from(tmp_path: Path) -> None:
    path = tmp_path / "lengths.txt"
    path.write_text("# measured on the search logs\n10\n\n12\n  40 \n10\n")
    for text in (str(path), f"file:{path}"):
        parsed = parse_lengths(text)
        assert parsed == Empirical((10, 12, 40, 10), str(path))
        assert (parsed.shortest, parsed.longest) == (10, 40)
    lengths = draw(str(path), 4000)
    assert set(lengths.tolist()) == {10, 12, 40}
    assert (lengths == 10).mean() == pytest.approx(0.5, abs=0.05)  # as often as in the file


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("gamma:2", "cannot read the lengths 'gamma:2'; give fixed:N, uniform:LO..HI"),
        ("128", "cannot read the lengths '128'"),
        ("fixed:0", "at least 1 token"),
        ("fixed:1.5", "whole number of tokens"),
        ("uniform:64..8", "1 <= LO <= HI"),
        ("uniform:8-64", "write uniform:LO..HI"),
        ("lognormal:median=12,p99=64", "needs median= and max="),
        ("lognormal:median=12,max=128", "one of p99= .* or sigma="),
        ("lognormal:median=12,p99=64,sigma=1,max=128", "one of p99="),
        ("lognormal:median=12,p99=8,max=128", "p99 must lie above its median"),
        ("lognormal:median=12,p99=64,max=128,mean=3", "cannot read 'mean=3'"),
        ("lognormal:median=12,median=13,p99=64,max=128", "median= is given twice"),
        ("lognormal:median=-1,p99=64,max=128", "positive finite number"),
        ("lognormal:median=5000,p99=6000,max=128", "in \\[1, 128\\]: bring the median inside"),
        ("file:/nonexistent/lengths.txt", "cannot read the lengths file"),
    ],
)
def test_malformed_distributions_are_refused_saying_what_to_write(text: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        parse_lengths(text)


def test_a_file_with_a_bad_line_names_it(tmp_path: Path) -> None:
    path = tmp_path / "lengths.txt"
    path.write_text("10\nabc\n")
    with pytest.raises(ConfigError, match=r"lengths.txt, line 2 must be a whole number"):
        parse_lengths(str(path))
    path.write_text("# nothing\n\n")
    with pytest.raises(ConfigError, match="holds no lengths"):
        parse_lengths(str(path))
