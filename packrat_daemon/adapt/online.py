"""Online adaptation as the daemon drives it: the live batch sizes, the production timings, and the
tuner that turns them into a new plan when one is predicted to pay.

The daemon's loop feeds `estimator` (each dispatched batch) and `production` (each computed slice)
directly, as both sit on the request path; it asks `propose` only once `due` has passed.
"""

from __future__ import annotations

import logging
import time

from packrat_daemon.adapt.estimator import BatchSizeEstimator
from packrat_daemon.adapt.production import ProductionProfile, revert_plan, slow_splits
from packrat_daemon.adapt.tuner import SwitchCost, Tuner, TunerSettings
from packrat_daemon.config import ServeConfig
from packrat_daemon.wire.errors import PackratError
from policies.base import Plan, Policy
from policies.planning.profile import Profile
from policies.planning.topology import Topology

log = logging.getLogger("packrat.daemon")


class OnlineAdaptation:
    def __init__(self, config: ServeConfig, policy: Policy, profile: Profile | None, topology: Topology) -> None:
        self.estimator = BatchSizeEstimator()
        self.production = ProductionProfile()
        self.topology = topology
        self.tuner: Tuner | None = None
        self.interval_s = config.adapt_interval_s
        self.due = 0.0  # time.monotonic() of the next look at the live batch sizes
        self.restarts_seen = 0  # the estimator's restarts as of the last look
        self.splitting = profile  # what the dispatcher splits by (the production guard judges its splits)
        self.switch_cost: SwitchCost | None = None  # what a switch forks (the reconciler); None: switches are free
        self.retune(config, policy, profile)

    def retune(self, config: ServeConfig, policy: Policy, profile: Profile | None) -> None:
        """A new configuration or policy (start, reload): only a policy that adapts, with a profile, gets a tuner."""
        self.interval_s = config.adapt_interval_s
        self.min_split_gain = config.min_split_gain
        if config.adapt and policy.adapts and profile is not None:
            self.tuner = Tuner(policy, profile, self.topology, TunerSettings.of(config))
            self.tuner.switch_cost = self.switch_cost
        else:
            self.tuner = None

    def costs(self, switch_cost: SwitchCost) -> None:
        """Weigh each switch's forks against its gain from now on (the reconciler: what a plan forks, a fork's time)."""
        self.switch_cost = switch_cost
        if self.tuner is not None:
            self.tuner.switch_cost = switch_cost

    def restrict(self, topology: Topology, now: float) -> None:
        """Plan inside this share of the machine from now on (`packrat coordinate` moved its cores); the plan
        it was given stands for a cool-down, as a plan the tuner chose would."""
        self.topology = topology
        if self.tuner is not None:
            self.tuner.topology = topology
            self.tuner.last_switch = now

    def planning_profile(self, offline: Profile | None) -> Profile | None:
        """The profile plans are divided by: the tuner's (production's timings folded in) once there is one."""
        self.splitting = self.tuner.profile if self.tuner is not None else offline
        return self.splitting

    def propose(self, plan: Plan, offline: Profile | None, now: float) -> Plan | None:
        """A plan for the batch sizes clients actually send, if the tuner predicts it pays; else None."""
        self.due = now + self.interval_s
        if self.tuner is None:
            return None
        distribution = self.estimator.distribution(now)
        if distribution is None:
            return None
        # The traffic moved since the last look (the estimator restarted its counts): say what the tuner makes of it.
        moved, self.restarts_seen = self.estimator.restarts != self.restarts_seen, self.estimator.restarts
        # Plan on what production has measured, interference included, over the offline profile.
        self.tuner.profile = self.production.merged_into(offline, now) or self.tuner.profile
        learned, cores = self.production.learned(now), self.topology.usable_cores
        # The production half of the split check guards the policies whose splits the start-up check guards; a
        # baseline that does not (the paper's estimator) is served as it decides, or it would flap against the guard.
        slow = self.tuner.policy.checks_splits and slow_splits(
            plan, self.splitting, self.tuner.profile, learned, distribution, cores, self.min_split_gain
        )
        if slow:  # a measurement, not a prediction: past the hysteresis and the cool-down
            reverted = revert_plan(self.tuner.policy, self.tuner.profile, learned, distribution, self.topology,
                                   self.min_split_gain, slow)  # fmt: skip
            log.warning("%s; plan %s", reverted.reason, reverted.describe())
            self.tuner.last_switch = now
            return reverted
        try:
            lasted = self.estimator.lasted_s(now)
            decision = self.tuner.consider(plan, distribution, self.estimator.observed, now, moved, lasted)
        except PackratError as exc:
            log.warning("adaptation skipped: %s", exc)
            return None
        sizes = ", ".join(f"{b}: {w:.0%}" for b, w in distribution.weights)
        if decision is None:
            if moved:
                log.info("the batch sizes moved (%s), the plan stays: %s", sizes, self.tuner.declined)
            return None
        log.info(
            "adapting to the live batch sizes (%s): predicted %.1f → %.1f ms (offline cells ×%.2f for "
            "production's conditions); plan %s",
            sizes, decision.current_ms, decision.proposed_ms, self.production.conditions_factor(offline, now),
            decision.plan.describe(),
        )  # fmt: skip
        self.estimator.reset_count()
        return decision.plan

    def predicted(self, old: Plan | None, new: Plan, now: float) -> tuple[float, float] | None:
        """The tuner's expected latency (ms) of `old` and of `new` over the live batch sizes, for the plan
        history; None without a tuner, live batch sizes, or a prediction."""
        distribution = self.estimator.distribution(now)
        if self.tuner is None or old is None or distribution is None:
            return None
        try:
            return self.tuner.expected_latency(old, distribution), self.tuner.expected_latency(new, distribution)
        except PackratError:
            return None

    def learned(self, offline: Profile | None, plan: Plan, model: str, runtime: str) -> Profile | None:
        """`offline` with what production measured folded in, for `model` on `runtime`; None when production
        has nothing to add, or when its workers shared cores (their timings describe the contention, not the cells).
        """
        if not self.production.samples or plan.oversubscribed:
            return None
        learned = self.production.merged_into(offline, time.monotonic())
        if learned is None or learned is offline:
            return None
        return Profile(dict(learned.items()), model=model, runtime=runtime, precision=learned.precision)
