"""Emulated service times on the virtual clock: the emulated workers' numbers and slow-down, as they run."""

from __future__ import annotations

import pytest

from packrat_daemon.measure.emulation import Interference
from packrat_daemon.simulate.service import ServiceModel
from packrat_daemon.wire.errors import ProfileError
from policies.planning.profile import Profile

PROFILE = Profile.from_latencies({(1, 1): 10.0, (1, 4): 30.0, (2, 1): 6.0, (2, 4): 16.0, (4, 4): 9.0})


def service(interference: str = "none", cores: int = 4) -> ServiceModel:
    return ServiceModel.of(PROFILE, cores, 4, Interference.named(interference))


def test_each_slice_takes_lhat_of_its_rows_without_interference():
    # 3 rows on 1 thread: the smallest profiled batch >= 3 is 4 (the solver's rule).
    assert service().batch_ms([(1, 3), (2, 1)]) == [30.0, 6.0]


def test_slices_slow_down_while_others_are_busy_and_speed_up_when_they_finish():
    model = service("default")
    f = model.numbers.slowdown
    # Two 2-thread slices: 4 threads busy until the shorter (6 ms profiled) ends, then 2. The profile
    # measured each cell with its own 2 cores busy, so the slow-down is f(busy) / f(2): alone, 6 ms.
    short, long = model.batch_ms([(2, 1), (2, 4)])
    assert short == pytest.approx(6.0 * f(4) / f(2))
    assert long == pytest.approx(6.0 * f(4) / f(2) + (16.0 - 6.0))
    assert model.batch_ms([(2, 1)]) == [pytest.approx(6.0)]
    assert f(4) > f(2) > 1.0


def test_oversubscribed_threads_time_share_the_cores():
    # Two 4-thread slices on 4 cores: 8 busy threads, each twice as slow as alone.
    assert service().batch_ms([(4, 4), (4, 4)]) == [18.0, 18.0]


def test_a_slice_the_profile_cannot_carry_is_refused():
    with pytest.raises(ProfileError, match="3 thread"):
        service().alone_ms(3, 1)
