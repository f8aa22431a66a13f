"""Thirty days of adaptation and state on injected clocks, in about a second (the simulation's way with time:
`now` is handed in, packrat_daemon.simulate).

The daemon's learning (live batch sizes, production's estimates, the tuner) and its state file, over a month:
a batch size that vanishes for a week and comes back, one seen for two days only, a restart from the saved
file every day (a new StateKeeper and adaptation, as a restart makes), some of them reboots (the monotonic
clock starts again), and the wall clock stepped back six hours and forward three days. Before the fix, the
first restart after the week raised OverflowError in production's restore.
"""

from __future__ import annotations

import logging
import random
from pathlib import Path

import pytest

from packrat_daemon.adapt.online import OnlineAdaptation
from packrat_daemon.adapt.production import MAX_AGE_S
from packrat_daemon.config import ServeConfig
from packrat_daemon.ops.state import STATE_FILE, Clock, Entry, StateKeeper
from policies.base import Plan
from policies.packrat import PackratPolicy
from policies.planning.distribution import BatchDistribution
from policies.planning.profile import Profile
from policies.planning.topology import Topology

DAY = 86400.0
DAYS = 30
BURST_EVERY_S = 7200.0  # traffic comes in bursts of BURST batches, one a second, every two hours
BURST = 48
SAVE_EVERY_S = 6 * 3600.0  # the periodic write (every minute in the daemon: here every third burst)
CONFIG = ServeConfig(model="builtin:tiny-mlp", max_batch=8, adapt_interval_s=5.0)
TOPOLOGY = Topology.synthetic(2)
OFFLINE = Profile.from_latencies(
    {(t, b): (0.5 + 0.5 * b) / t**0.5 for t in (1, 2) for b in (1, 2, 4, 8)}, model="builtin:tiny-mlp", runtime="torch"
)
# Batches of 4 are not sent for eight days from day 7.7: at the restart that ends day 14, their cells are 7.3 days
# old, past the 1 024 half-lives (of production's 10 minutes) at which 2^(age / half-life) overflowed.
VANISHED = (7.7 * DAY, 15.7 * DAY)
RESTARTED_BOOTS = {5, 12, 21}  # restarts that are reboots: the monotonic clock starts again near 0
WALL_STEPS = {10: -6 * 3600.0, 20: 3 * DAY}  # the wall clock stepped back, then forward, at these days


class Clocks:
    """Virtual time: `t` seconds since the run began; the daemon reads it as a monotonic clock since its boot
    and as a wall clock that may be stepped."""

    def __init__(self) -> None:
        self.t = 0.0
        self.boot = 0.0  # `t` at the last reboot
        self.wall_step = 0.0

    def monotonic(self) -> float:
        return 1000.0 + self.t - self.boot

    def wall(self) -> float:
        return 1.8e9 + self.t + self.wall_step


def sizes(t: float) -> tuple[int, ...]:
    mix = (1, 2) if VANISHED[0] <= t < VANISHED[1] else (1, 2, 4)
    return (*mix, 8) if 3 * DAY <= t < 5 * DAY else mix


class Daemon:
    """One run of the daemon between two restarts: the state read back, the adaptation handed its estimates."""

    def __init__(self, folder: Path, clocks: Clocks) -> None:
        self.clocks = clocks
        self.keeper = StateKeeper(str(folder), clock=Clock(clocks.monotonic, clocks.wall))
        ident = self.keeper.identity(CONFIG, "torch", "fp32", TOPOLOGY)
        entry = self.keeper.restore("torch", ident)
        if entry is None:  # the first start measures
            entry = Entry(ident, OFFLINE, measured_unix=clocks.wall())
        else:
            self.keeper.restored_from = str(self.keeper.path)
        self.keeper.record("torch", entry)
        self.keeper.served_key = "torch"
        policy = PackratPolicy()
        self.profile: Profile | None = entry.profile
        self.plan: Plan = self.keeper.resumed_plan("torch", policy.name, TOPOLOGY, CONFIG.max_batch) or policy.plan(
            entry.profile, TOPOLOGY, BatchDistribution.single(CONFIG.max_batch)
        )
        self.adaptation = OnlineAdaptation(CONFIG, policy, entry.profile, TOPOLOGY)
        self.keeper.attach(self.adaptation)
        self.changes = 0  # plan changes the tuner made

    def burst(self, rng: random.Random, mix: tuple[int, ...]) -> None:
        clocks, adaptation = self.clocks, self.adaptation
        for _ in range(BURST):
            clocks.t += 1.0
            now, batch = clocks.monotonic(), rng.choice(mix)
            adaptation.estimator.observe(batch, now)
            # Timed in production, as if one instance computed it whole (where it goes is not what is tested
            # here): 10% slower than offline (interference), with noise.
            threads = rng.choice(self.plan.instances).threads
            ms = OFFLINE.latency(threads, batch) * 1.1 * rng.uniform(0.9, 1.1)
            adaptation.production.observe(threads, batch, ms, now)
        proposed = adaptation.propose(self.plan, self.profile, clocks.monotonic())
        if proposed is not None:
            self.plan = proposed
            self.changes += 1
            self.keeper.save(self, "plan change")


def test_thirty_days_of_traffic_restarts_and_clock_steps_raise_nothing_and_the_file_stays_bounded(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    rng = random.Random(30)
    clocks, folder = Clocks(), tmp_path / "state"
    daemon = Daemon(folder, clocks)
    sizes_by_day: list[int] = []
    changes = 0
    learned_fours: dict[int, bool] = {}
    with caplog.at_level(logging.WARNING, logger="packrat.daemon"):
        for day in range(DAYS):
            end = (day + 1) * DAY
            while clocks.t + BURST_EVERY_S <= end:
                clocks.t += BURST_EVERY_S - BURST
                daemon.burst(rng, sizes(clocks.t))
                if clocks.t % SAVE_EVERY_S < BURST_EVERY_S:
                    daemon.keeper.save(daemon, "periodic")
            clocks.t = end
            exported = {c.key: c for c in daemon.adaptation.production.export(clocks.monotonic())}
            learned_fours[day] = any(batch == 4 for _, batch in exported)
            assert all(0.0 <= c.age_s <= MAX_AGE_S for c in exported.values())
            daemon.keeper.save(daemon, "stop")
            changes += daemon.changes
            sizes_by_day.append((folder / STATE_FILE).stat().st_size)
            # The restart: a minute down (a reboot: the monotonic clock starts again), the wall clock maybe stepped.
            clocks.t += 60.0
            if day + 1 in RESTARTED_BOOTS:
                clocks.boot = clocks.t
            clocks.wall_step += WALL_STEPS.get(day + 1, 0.0)
            daemon = Daemon(folder, clocks)
            assert daemon.keeper.restored_from is not None  # served from the file, never measured again
            restored = {c.key: c for c in daemon.adaptation.production.export(clocks.monotonic())}
            for key, cell in restored.items():  # a clock stepped back decays nothing, and nothing ever grows
                assert cell.weight <= exported[key].weight * (1 + 1e-9)
    assert "set" not in caplog.text and "aside" not in caplog.text and "could not write" not in caplog.text
    assert sorted(p.name for p in folder.iterdir()) == [STATE_FILE]
    assert changes >= 1  # a plan the tuner chose was saved and served again after the next restart
    # Batches of 4 are forgotten within hours of vanishing (so by the end of day 7), learned again when they come back.
    assert [day for day, learned in learned_fours.items() if not learned] == list(range(7, 15))
    # Bounded: after the first days (batches of 8 for two), the file never grows past what it was then.
    assert max(sizes_by_day[5:]) <= max(sizes_by_day[:5]) and max(sizes_by_day) < 16_384
