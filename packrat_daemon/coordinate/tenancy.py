"""The daemon's side of co-location (docs/colocation.md): its share of the machine, which `packrat coordinate`
moves with an `assign`, and the demand the coordinator plans it from. The control channel hands these requests
here (`control.server.Colocation`); the CPUs themselves are in what the board serves (`control.board.Served`),
changed through it."""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from packrat_daemon.fleet.pool import WorkerState
from packrat_daemon.measure import emulation
from packrat_daemon.startup import distribution_for
from packrat_daemon.wire.errors import PolicyError
from policies.planning.topology import Topology, format_cpulist

if TYPE_CHECKING:
    from packrat_daemon.control.board import Board
    from packrat_daemon.requests.batcher import Batcher
    from policies.base import Plan
    from policies.planning.profile import Profile

log = logging.getLogger("packrat.daemon")


@dataclass(frozen=True)
class Share:
    """This model's share of the machine: the CPUs it plans and pins on, who gave them, and the move that did."""

    cpus: tuple[int, ...]
    cores: int  # usable cores among them (physical cores, capped by the cgroup quota)
    by: str  # who assigned it: "--cpus", "every usable CPU", or the coordinator's reason
    wall: float  # time.time() of the assignment
    generation: int | None = None  # the plan generation that serves it (None: the start's)
    predicted_gain: float | None = None  # the coordinator's predicted gain of the move, if it said
    previous: tuple[int, ...] | None = None  # the CPUs before this move (None: the initial share)

    @classmethod
    def initial(cls, topology: Topology, by: str) -> Share:
        return cls(topology.cpu_ids, topology.usable_cores, by, time.time())

    @classmethod
    def assigned(cls, topology: Topology, reason: str, generation: int, gain: float | None, before: Share) -> Share:
        return cls(topology.cpu_ids, topology.usable_cores, reason, time.time(), generation, gain, before.cpus)

    def describe(self) -> str:
        return f"CPUs {format_cpulist(self.cpus)} ({self.cores} core{'s' if self.cores != 1 else ''})"

    def to_json(self, moves: int | None = None) -> dict[str, Any]:
        last = None
        if self.previous is not None:
            last = {
                "from": format_cpulist(self.previous),
                "to": format_cpulist(self.cpus),
                "time": self.wall,
                "generation": self.generation,
                "predicted_gain": self.predicted_gain,
                "reason": self.by,
            }
        reply: dict[str, Any] = {
            "cpus": format_cpulist(self.cpus),
            "cpu_ids": list(self.cpus),
            "cores": self.cores,
            "assigned_by": self.by,
            "since": self.wall,
            "last_move": last,
        }
        if moves is not None:
            reply["moves"] = moves
        return reply


class Tenancy:
    """This daemon's share of `machine`, the whole machine (with --cpus, an emulated one), of which the board's
    CPUs at start are all usable ones or those of --cpus."""

    def __init__(self, board: Board, batcher: Batcher) -> None:
        config, topology = board.config, board.served.topology
        self.board, self.batcher = board, batcher
        self.machine = emulation.topology(config) if config.cpus else topology
        self.share = Share.initial(topology, "--cpus" if config.cpus else "every usable CPU")
        self.moves = 0
        board.metrics.share_assigned(topology.usable_cores, moved=False)

    def assign(self, cpus: Sequence[int], plan: Plan | None, reason: str, gain: float | None = None) -> int | None:
        """Serve on `cpus` only from now on, with `plan`, else the policy's plan inside them: the allocator and
        adaptation get the restricted topology and the reconciler switches (no request fails). Returns the
        generation that will serve it, None when nothing changes. Raises (TopologyError, PolicyError) before
        anything changed when the CPUs are not this machine's usable ones or the plan does not fit them."""
        board = self.board
        share = self.machine.restricted(cpus)
        if plan is None:
            distribution = board.adaptation.estimator.distribution(time.monotonic()) or distribution_for(board.config)
            plan = board.served.policy.plan(self._profile(), share, distribution)
        why = plan.misfit(share, board.config.max_batch)
        if why is not None:
            raise PolicyError(
                f"the plan {plan.describe()} does not fit the {share.usable_cores} core(s) assigned: {why}; "
                "assign more CPUs or a plan of fewer threads (leave the plan out to have this daemon's policy plan)"
            )
        moved = share.cpu_ids != board.served.topology.cpu_ids
        if not moved and plan == board.served.plan:
            self.share = dataclasses.replace(self.share, by=reason)  # the same CPUs, now the coordinator's
            return None
        board.restrict(share)
        generation = board.switch(plan, f"assign: {reason}")
        if moved:
            self.moves += 1
            board.metrics.share_assigned(share.usable_cores, moved=True)
            self.share = Share.assigned(share, reason, generation, gain, self.share)
            log.info("share: %s (%s); plan %s", self.share.describe(), reason, plan.describe())
        return generation

    def vacated(self) -> bool:
        """No worker of this daemon, serving, parked, switching or still stopping, holds a CPU outside its share:
        the cores given away are free for the model they go to."""
        share = set(self.board.served.topology.cpu_ids)
        return all(
            set(w.cores) <= share and (w.pending is None or set(w.pending[1]) <= share)
            for w in self.board.reconciler.pool.workers.values()
            if w.state is not WorkerState.DEAD
        )

    def demand(self) -> dict[str, Any]:
        """What a coordinator plans this model from: its profile, the live batch sizes and their rate, its share."""
        now = time.monotonic()
        board, batcher, profile = self.board, self.batcher, self._profile()
        distribution = board.adaptation.estimator.distribution(now)
        batches_per_s, inputs_per_s = board.adaptation.estimator.rates(now)
        return {
            "model": board.config.model,
            "runtime": board.served.info.runtime,
            "profile": None if profile is None else profile.to_csv(),
            "batch_sizes": [] if distribution is None else [[b, w] for b, w in distribution.weights],
            "batches_per_s": batches_per_s,
            "inputs_per_s": inputs_per_s,
            # Cumulative counts at `now_s` (this daemon's monotonic clock) and the queue at that instant: the
            # coordinator's own estimate of the offered rate (packrat_daemon.coordinate.watch) reads these.
            "now_s": now,
            "arrived_requests": batcher.arrived_requests,
            "arrived_inputs": batcher.arrived_inputs,
            "queued_inputs": batcher.queued_inputs,
            "max_batch": board.config.max_batch,
            "policy": board.served.policy.name,
            "plan": board.served.plan.to_json(),
            "share": self.share.to_json(),
            "machine_cpus": list(self.machine.cpu_ids),
            "vacated": self.vacated(),
        }

    def status(self) -> dict[str, Any]:
        """The share in the `status` reply, with the number of moves."""
        return self.share.to_json(moves=self.moves)

    def _profile(self) -> Profile | None:
        """The profile plans are made from: the tuner's (production's timings folded in), else the offline one."""
        tuner = self.board.adaptation.tuner
        return tuner.profile if tuner is not None else self.board.served.profile
