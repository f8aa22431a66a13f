"""What the daemon serves, in one record with one owner: the plan, the profile and the policy it plans with, the
runtime answering, and the CPUs it plans and pins on (`Served`). `Board` keeps it and is the only one to change
it, each change with the parts it concerns: a new plan goes to the reconciler (which alone changes the pool) and,
split by its layouts, to the dispatcher; a new policy or profile to online adaptation; new CPUs to the allocator.

The board is the control channel's `Switchboard` (`control.server`); the daemon's loop (adaptation's plans), the
co-location side (`coordinate.tenancy`), the background measurement's switch (`control.measured`) and a reload
change what is served through it too. What the others keep of it is derived and set only from here: the
reconciler's plan (the one it converges to), the dispatcher's splitter, adaptation's topology and the allocator's.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from packrat_daemon.control.server import Planning
from policies.base import Plan, Policy
from policies.planning.cores import CoreAllocator

if TYPE_CHECKING:
    from packrat_daemon.adapt.online import OnlineAdaptation
    from packrat_daemon.config import ServeConfig
    from packrat_daemon.fleet.backend import Backend, ModelInfo
    from packrat_daemon.fleet.reconciler import Reconciler, Reconfiguration, Slot
    from packrat_daemon.ops.metrics import Metrics
    from packrat_daemon.ops.state import StateKeeper
    from packrat_daemon.requests.dispatcher import Dispatcher
    from packrat_daemon.requests.splitter import Splitter
    from packrat_daemon.startup import Started
    from policies.planning.profile import Profile
    from policies.planning.topology import Topology

    SplitterFor = Callable[[Profile | None, Plan, list[list[Slot]], ServeConfig], Splitter]


@dataclass(frozen=True)
class Served:
    """What is served, or being switched to: replaced whole by `Board`, read by everyone else."""

    plan: Plan
    profile: Profile | None  # the offline profile it plans from (None: served without one)
    policy: Policy
    info: ModelInfo  # the runtime and precision answering (the `info` reply's)
    topology: Topology  # the CPUs it plans and pins on: all usable ones, --cpus, or the coordinator's share

    @classmethod
    def at_start(cls, started: Started) -> Served:
        first = started.served
        return cls(first.plan, first.profile, started.policy, first.info, started.topology)


@dataclass
class Kept:
    """What the state file keeps of what is served (ops.state.Serving)."""

    plan: Plan
    profile: Profile | None
    adaptation: OnlineAdaptation


class Board:
    """The owner of `served` and of the configuration in force; the parts it hands changes to are its
    attributes, for those that read them (the `status` reply, the co-location side)."""

    def __init__(
        self,
        config: ServeConfig,
        served: Served,
        reconciler: Reconciler,
        dispatcher: Dispatcher,
        adaptation: OnlineAdaptation,
        state: StateKeeper,
        metrics: Metrics,
        splitter_for: SplitterFor,
    ) -> None:
        self.config, self.served = config, served
        self.reconciler, self.dispatcher, self.adaptation = reconciler, dispatcher, adaptation
        self.state, self.metrics, self.splitter_for = state, metrics, splitter_for

    @property
    def plan(self) -> Plan:
        return self.served.plan

    def current(self) -> tuple[Plan, Profile | None]:
        """The plan served and the offline profile it was planned from (the loop core's `served`)."""
        return self.served.plan, self.served.profile

    def switch(self, plan: Plan, reason: str, backend: Backend | None = None) -> int:
        """Hand a new plan to the reconciler (the supervisor looks at the new generation on the next check);
        the dispatcher splits by its layouts from now on. `backend`: another runtime's template to fork it from.
        Returns the generation that will serve it."""
        self.served = dataclasses.replace(self.served, plan=plan)
        predicted = self.adaptation.predicted(self.reconciler.plan, plan, time.monotonic())
        self.reconciler.set_plan(plan, reason, predicted, backend=backend)
        self.metrics.plan_changed(plan, reason, self.reconciler.planned_workers)
        profile = self.adaptation.planning_profile(self.served.profile)
        self.dispatcher.splitter = self.splitter_for(profile, plan, self.reconciler.layouts, self.config)
        self.save(reason)
        return self.reconciler.generation

    def set_policy(self, policy: Policy) -> None:
        """Plan with `policy` from now on (online adaptation too)."""
        self.served = dataclasses.replace(self.served, policy=policy)
        self.adaptation.retune(self.config, policy, self.served.profile)

    def set_profile(self, profile: Profile | None) -> None:
        """Plan from `profile` from now on (a runtime measured in the background); the caller switches the plan."""
        self.served = dataclasses.replace(self.served, profile=profile)
        self.adaptation.retune(self.config, self.served.policy, profile)

    def set_runtime(self, info: ModelInfo) -> None:
        """The runtime switched to serves alone now."""
        self.served = dataclasses.replace(self.served, info=info)

    def reconfigured(self, config: ServeConfig, policy: Policy, profile: Profile | None) -> None:
        """A reload's configuration, policy and profile, in force from now on; the caller switches to its plan
        and retunes adaptation (after the switch: its predicted gain is the previous tuner's view)."""
        self.config = config
        self.served = dataclasses.replace(self.served, policy=policy, profile=profile)

    def restrict(self, topology: Topology) -> None:
        """Plan and pin on `topology`'s CPUs only from now on (`packrat coordinate` moved them); the caller
        switches to a plan that fits them."""
        self.served = dataclasses.replace(self.served, topology=topology)
        self.reconciler.allocator = CoreAllocator(topology)
        self.adaptation.restrict(topology, time.monotonic())

    def planning(self) -> Planning:
        distribution = self.adaptation.estimator.distribution(time.monotonic())
        return Planning(self.served.profile, self.served.topology, distribution)

    def reconfiguration(self, generation: int) -> Reconfiguration | None:
        return next((record for record in self.reconciler.history if record.generation == generation), None)

    def kept(self) -> Kept:
        return Kept(self.served.plan, self.served.profile, self.adaptation)

    def save(self, why: str) -> None:
        """Write the state file now (a switch, the stop)."""
        self.state.save(self.kept(), why)

    def tick(self, now: float) -> None:
        """The state file's periodic write."""
        self.state.tick(self.kept(), now)
