"""Emulated service times: L̂ of each slice, interference, CPU sharing when cores are oversubscribed."""

from __future__ import annotations

import pytest

from packrat_daemon.simulate.service import ServiceModel
from packrat_daemon.wire.errors import ProfileError
from policies.planning.profile import Profile

PROFILE = Profile.from_latencies({(1, 1): 10.0, (1, 4): 30.0, (2, 1): 6.0, (2, 4): 16.0, (4, 4): 9.0})


def test_each_slice_takes_lhat_of_its_rows():
    service = ServiceModel(PROFILE, cores=4)
    # 3 rows on 1 thread: the smallest profiled batch >= 3 is 4 (the solver's rule).
    assert service.batch_ms([(1, 3), (2, 1)]) == [30.0, 6.0]


def test_interference_scales_by_the_number_of_busy_instances():
    service = ServiceModel(PROFILE, cores=4, interference=lambda busy: 1.0 + 0.1 * (busy - 1))
    assert service.batch_ms([(2, 4)]) == [16.0]
    assert service.batch_ms([(2, 4), (2, 4)]) == pytest.approx([17.6, 17.6])


def test_oversubscribed_instances_each_get_their_share_of_the_cores():
    service = ServiceModel(PROFILE, cores=4)
    # Two 4-thread instances on 4 cores: each runs as a 2-thread instance would.
    assert service.batch_ms([(4, 4), (4, 4)]) == [16.0, 16.0]
    # Eight on 4 cores: half a core each, as a 1-thread instance twice as slow.
    assert service.batch_ms([(4, 1)] * 8) == [20.0] * 8
    # Not oversubscribed: each its own threads' L̂.
    assert service.batch_ms([(2, 1), (2, 1)]) == [6.0, 6.0]


def test_rows_past_the_profile_scale_the_largest_batch_and_a_missing_thread_count_is_refused():
    service = ServiceModel(PROFILE, cores=4)
    assert service.alone_ms(2, 8) == pytest.approx(32.0)
    with pytest.raises(ProfileError, match="no row for 3 threads"):
        service.alone_ms(3, 1)
