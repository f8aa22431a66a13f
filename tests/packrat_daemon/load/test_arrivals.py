"""The load generator's arrivals: batch mixes, Poisson, bursty on/off and trace files, seeded and bounded."""

from __future__ import annotations

import math
import random
from collections import Counter
from pathlib import Path

import pytest

from packrat_daemon.load.arrivals import BatchMix, Burst, Poisson, PoissonCount, Trace, open_loop_schedule, within
from packrat_daemon.wire.errors import ConfigError


def test_a_single_size_and_a_weighted_mix_parse():
    assert BatchMix.parse("8") == BatchMix.single(8)
    mix = BatchMix.parse("1:0.5, 8:0.3,32:0.2")
    assert mix.sizes == (1, 8, 32)
    assert mix.mean == pytest.approx(0.5 + 8 * 0.3 + 32 * 0.2)
    assert mix.describe() == "1:0.5,8:0.3,32:0.2"


@pytest.mark.parametrize(
    "text",
    ["", "0", "-1", "x", "8,16", "1:0.5,", "1:0", "1:-2", "1:nan", "1:inf", "1:0.5,1:0.5", "2.5:1", "a:1"],
)
def test_a_malformed_mix_is_a_config_error(text):
    with pytest.raises(ConfigError):
        BatchMix.parse(text)


def test_draws_follow_the_weights_and_consume_one_number_each():
    mix = BatchMix.parse("1:0.5,8:0.3,32:0.2")
    rng = random.Random(3)
    counts = Counter(mix.draw(rng) for _ in range(20_000))
    for size, share in ((1, 0.5), (8, 0.3), (32, 0.2)):
        assert counts[size] / 20_000 == pytest.approx(share, abs=0.015)
    # Every mix consumes exactly one number per draw, so the times of a seeded schedule do not depend on it.
    a, b = random.Random(5), random.Random(5)
    BatchMix.single(4).draw(a)
    mix.draw(b)
    assert a.random() == b.random()


def test_relative_weights_are_normalised():
    rng_a, rng_b = random.Random(1), random.Random(1)
    assert [BatchMix.parse("1:1,2:3").draw(rng_a) for _ in range(200)] == [
        BatchMix.parse("1:0.25,2:0.75").draw(rng_b) for _ in range(200)
    ]


def test_poisson_reaches_its_rate_with_exponential_gaps():
    schedule = open_loop_schedule(Poisson(200.0), BatchMix.single(2), duration_s=100.0, rng=random.Random(11))
    times = [t for t, _ in schedule]
    assert times == sorted(times) and times[0] > 0 and times[-1] < 100.0
    assert len(schedule) / 100.0 == pytest.approx(200.0, rel=0.03)
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    mean = sum(gaps) / len(gaps)
    std = math.sqrt(sum((g - mean) ** 2 for g in gaps) / len(gaps))
    assert std / mean == pytest.approx(1.0, abs=0.05)  # exponential: coefficient of variation 1
    assert {samples for _, samples in schedule} == {2}


def test_the_same_seed_gives_the_same_schedule_and_another_does_not():
    mix = BatchMix.parse("1:0.5,8:0.5")

    def make(seed: int) -> list[tuple[float, int]]:
        return open_loop_schedule(Poisson(50.0), mix, requests=300, rng=random.Random(seed))

    assert make(4) == make(4)
    assert make(4) != make(5)


def test_requests_and_duration_bound_the_schedule_whichever_comes_first():
    mix = BatchMix.single(1)
    assert len(open_loop_schedule(Poisson(100.0), mix, requests=37, rng=random.Random(0))) == 37
    few = open_loop_schedule(Poisson(100.0), mix, requests=10_000, duration_s=1.0, rng=random.Random(0))
    assert 50 < len(few) < 150 and few[-1][0] < 1.0


def test_an_endless_process_needs_a_bound_and_a_huge_one_is_refused():
    with pytest.raises(ConfigError, match="duration"):
        open_loop_schedule(Poisson(10.0), BatchMix.single(1), rng=random.Random(0))
    with pytest.raises(ConfigError, match="schedule holds"):
        open_loop_schedule(Poisson(1e6), BatchMix.single(1), duration_s=1e3, rng=random.Random(0), max_requests=1000)
    with pytest.raises(ConfigError, match="schedule holds"):
        open_loop_schedule(Poisson(1.0), BatchMix.single(1), requests=1001, rng=random.Random(0), max_requests=1000)
    for bad in ({"duration_s": 0.0}, {"duration_s": math.inf}, {"requests": 0}):
        with pytest.raises(ConfigError):
            open_loop_schedule(Poisson(1.0), BatchMix.single(1), rng=random.Random(0), **bad)


def test_bursts_arrive_only_while_on_at_their_rate():
    burst = Burst.parse("0.5:1.5:400")
    assert burst.mean_rate_rps == pytest.approx(100.0)
    schedule = open_loop_schedule(burst, BatchMix.single(1), duration_s=200.0, rng=random.Random(2))
    assert all((t % 2.0) < 0.5 for t, _ in schedule)  # nothing in the off phases
    assert len(schedule) / 200.0 == pytest.approx(100.0, rel=0.05)
    per_cycle = Counter(int(t // 2.0) for t, _ in schedule)
    assert sum(per_cycle.values()) / 100 == pytest.approx(200.0, rel=0.05)  # 0.5 s at 400/s a cycle


@pytest.mark.parametrize("text", ["1:2", "0:1:5", "1:-1:5", "1:1:0", "a:1:5", "1:b:5", "1:1:c", "1:1:5:6"])
def test_a_malformed_burst_is_a_config_error(text):
    with pytest.raises(ConfigError):
        Burst.parse(text)


def test_a_trace_replays_its_own_times_and_samples(tmp_path: Path):
    path = tmp_path / "trace.csv"
    path.write_text("t_s,samples,note\n0,1,a\n0.25,8,b\n\n0.25,2,c\n1.5,32,d\n")
    trace = Trace.read(path)
    rows = [(0.0, 1), (0.25, 8), (0.25, 2), (1.5, 32)]
    assert open_loop_schedule(trace, BatchMix.single(99), rng=random.Random(0)) == rows  # the mix is not used
    assert open_loop_schedule(trace, BatchMix.single(1), requests=2, rng=random.Random(0)) == rows[:2]
    assert open_loop_schedule(trace, BatchMix.single(1), duration_s=1.0, rng=random.Random(0)) == rows[:3]
    assert trace.mean_rate_rps == pytest.approx(4 / 1.5)


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("time,samples\n0,1\n", "t_s"),
        ("t_s,samples\n", "no rows"),
        ("t_s,samples\nx,1\n", "line 2"),
        ("t_s,samples\n-1,1\n", "zero or more"),
        ("t_s,samples\n1,1\n0.5,1\n", "sort the trace"),
        ("t_s,samples\n0,0\n", "at least 1"),
        ("t_s,samples\n0,1.5\n", "whole number"),
        ("t_s,samples\n0\n", "whole number"),
    ],
)
def test_a_malformed_trace_says_where(tmp_path: Path, text: str, match: str):
    path = tmp_path / "bad.csv"
    path.write_text(text)
    with pytest.raises(ConfigError, match=match):
        Trace.read(path)


def test_a_missing_trace_file_is_a_config_error(tmp_path: Path):
    with pytest.raises(ConfigError, match="cannot read"):
        Trace.read(tmp_path / "absent.csv")


@pytest.mark.parametrize("process", [Poisson(20.0, fixed_count=False), Burst(0.5, 1.5, 80.0)])
def test_counts_over_many_seeds_centre_on_the_mean_rate(process):
    # A schedule's count is a random draw; over seeds it must centre on rate × duration with the spread of a
    # Poisson count (for bursts, of the on time at the on rate: whole cycles here, so the same mean).
    duration = 10.0
    errors = [
        len(open_loop_schedule(process, BatchMix.single(1), duration_s=duration, rng=random.Random(seed)))
        / (process.mean_rate_rps * duration)
        - 1
        for seed in range(300)
    ]
    expected_sd = (process.mean_rate_rps * duration) ** -0.5
    assert abs(sum(errors) / len(errors)) < 3 * expected_sd / math.sqrt(len(errors))
    spread = math.sqrt(sum(e * e for e in errors) / len(errors))
    assert spread == pytest.approx(expected_sd, rel=0.25)


def test_a_fixed_count_poisson_sends_exactly_rate_times_duration_at_poisson_times():
    rate, duration = 10.0, 15.0
    for seed in range(50):
        schedule = open_loop_schedule(Poisson(rate), BatchMix.single(1), duration_s=duration, rng=random.Random(seed))
        assert len(schedule) == 150
        times = [t for t, _ in schedule]
        assert times == sorted(times) and times[0] >= 0.0 and times[-1] < duration
    # Given its count, a Poisson process's arrivals are independent uniforms over the window: pooled over
    # seeds, each tenth of the window holds a tenth of them, and the gaps are exponential (variation 1).
    pooled, gaps = [], []
    for seed in range(40):
        times = [t for t, _ in within(Poisson(rate), duration).arrivals(BatchMix.single(1), random.Random(seed))]
        pooled += times
        gaps += [b - a for a, b in zip(times, times[1:], strict=False)]
    tenths = Counter(int(10 * t / duration) for t in pooled)
    assert all(tenths[k] / len(pooled) == pytest.approx(0.1, abs=0.015) for k in range(10))
    mean = sum(gaps) / len(gaps)
    assert mean == pytest.approx(duration / 151, rel=0.05)
    std = math.sqrt(sum((g - mean) ** 2 for g in gaps) / len(gaps))
    assert std / mean == pytest.approx(1.0, abs=0.06)


def test_the_count_is_drawn_only_when_asked_and_a_request_bound_still_holds():
    mix = BatchMix.single(1)
    counts = {
        len(open_loop_schedule(Poisson(10.0, fixed_count=False), mix, duration_s=15.0, rng=random.Random(seed)))
        for seed in range(20)
    }
    assert len(counts) > 3  # drawn: the count varies from seed to seed
    assert len(open_loop_schedule(Poisson(10.0), mix, duration_s=15.0, requests=40, rng=random.Random(0))) == 40
    assert len(open_loop_schedule(Poisson(10.0), mix, requests=40, rng=random.Random(0))) == 40  # no window
    assert PoissonCount(0.01, 1.0).count == 1  # at least one arrival
    assert within(Poisson(10.0), 15.0).describe() == "poisson 10/s, 150 arrivals in 15 s"
    assert within(Poisson(10.0, fixed_count=False), 15.0) == Poisson(10.0, fixed_count=False)
    with pytest.raises(ConfigError):
        PoissonCount(10.0, 0.0)


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: Poisson(0.0), r"the arrival rate must be a positive number of requests per second, got 0\.0"),
        (lambda: Poisson(math.inf), r"the arrival rate must be a positive number of requests per second, got inf"),
        (lambda: PoissonCount(5.0, -1.0), r"the duration must be a positive number of seconds, got -1\.0"),
        (lambda: Burst(0.0, 1.0, 5.0), r"a burst's on time must be a positive number of seconds, got 0\.0"),
        (lambda: Burst(1.0, -1.0, 5.0), r"a burst's off time must be zero or more seconds, got -1\.0"),
        (lambda: Burst(1.0, math.nan, 5.0), r"a burst's off time must be zero or more seconds, got nan"),
        (lambda: Burst(1.0, 0.0, math.inf), r"a burst's rate must be a positive number of requests per second"),
    ],
)
def test_a_process_refuses_an_amount_out_of_range_naming_it_and_its_unit(make, match):
    with pytest.raises(ConfigError, match=match):
        make()
    assert Burst(1.0, 0.0, 5.0).mean_rate_rps == 5.0  # no off time is allowed: traffic all the time
