"""The daemon's own costs as the simulation charges them: checked on construction, per sample and per
request, written out in full; and the one loop that serves each piece of work once it is free."""

from __future__ import annotations

import json

import pytest

from packrat_daemon.simulate.costs import DaemonCosts, LoopModel
from packrat_daemon.wire.errors import ConfigError


def test_every_cost_is_zero_unless_given() -> None:
    costs = DaemonCosts()
    assert costs.transport_s(100) == costs.read_s(100) == costs.answer_s(100) == 0.0
    assert costs.dispatch_ms == costs.hop_ms == costs.switch_ms == 0.0


def test_the_daemons_costs_cannot_be_negative() -> None:
    with pytest.raises(ConfigError, match=r"hop_ms \(--hop-ms\) must be zero or more, got -1.0"):
        DaemonCosts(hop_ms=-1.0)
    with pytest.raises(ConfigError, match=r"read_ms \(--read-ms\) must be zero or more"):
        DaemonCosts(read_ms=(0.5, -0.1))
    with pytest.raises(ConfigError, match=r"transport_ms \(--transport-ms\)"):
        DaemonCosts(transport_ms=(-0.1, 0.0))


def test_fixed_and_per_item_parts_add_up_in_seconds() -> None:
    costs = DaemonCosts(transport_ms=(0.2, 0.1), read_ms=(0.3, 0.05), answer_ms=(0.4, 0.25))
    assert costs.transport_s(1) == pytest.approx(0.0003)
    assert costs.transport_s(8) == pytest.approx(0.001)
    assert costs.read_s(0) == pytest.approx(0.0003)
    assert costs.read_s(4) == pytest.approx(0.0005)
    assert costs.answer_s(2) == pytest.approx(0.0009)


def test_the_json_names_every_cost_with_pairs_as_lists() -> None:
    costs = DaemonCosts(transport_ms=(0.2, 0.1), dispatch_ms=0.3, switch_ms=400.0)
    written = json.loads(json.dumps(costs.to_json()))
    assert written == {
        "transport_ms": [0.2, 0.1],
        "read_ms": [0.0, 0.0],
        "dispatch_ms": 0.3,
        "answer_ms": [0.0, 0.0],
        "hop_ms": 0.0,
        "switch_ms": 400.0,
    }
    assert DaemonCosts(**{k: tuple(v) if isinstance(v, list) else v for k, v in written.items()}) == costs


def test_the_loop_takes_work_in_turn() -> None:
    loop = LoopModel()
    assert loop.take(1.0, 0.5) == (1.0, 1.5)  # free: starts at once
    assert loop.take(1.2, 0.25) == (1.5, 1.75)  # busy until 1.5: waits for it
    assert loop.take(3.0, 0.0) == (3.0, 3.0)  # idle meanwhile: the gap is not charged
    assert loop.free_at == 3.0
