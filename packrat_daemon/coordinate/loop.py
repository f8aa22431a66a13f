"""The coordinator's loop: look at every daemon, give back the share of one that returned, plan the models
jointly, and move cores when the move pays (hysteresis), shrinking before growing.

What one look does is the co-location loop's core (packrat_daemon.coordinate.core.LookCore, which its
simulation ticks too); this module drives it every interval on the monotonic clock, with the daemons over
their control sockets (packrat_daemon.coordinate.links.ControlDaemons), and writes the status file after each
look. The rate each model is planned for and the rule that moves cores are `packrat_daemon.coordinate.watch`'s,
the simulation's own. A daemon that does not answer is down: it is skipped, its share stays reserved for it,
and no core moves while it is away. When it answers again it is told its share at once. Cores move only when
every daemon is up with a profile and the watch says so (a model's queue backlogged on its share, or a
predicted gain worth a move); each daemon is then told its new CPUs and plan (`{"op": "assign"}`) in
`shares.move_order`: one that loses cores finishes its switch before one that gains them is told.
The coordinator never stops because a daemon is gone: every control error is logged and the next look retries.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from packrat_daemon.control.server import request as control_request
from packrat_daemon.coordinate.core import LookCore
from packrat_daemon.coordinate.links import ControlDaemons, Link, Move, Request, describe
from packrat_daemon.coordinate.readings import WatchSettings
from packrat_daemon.coordinate.shares import cores_of
from packrat_daemon.coordinate.strategies import Strategy
from packrat_daemon.coordinate.watch import Watch
from policies.colocation import JointPlan
from policies.planning.topology import Topology, format_cpulist

log = logging.getLogger("packrat.coordinate")

__all__ = ["Coordinator", "Link", "Move"]


class Coordinator:
    def __init__(
        self,
        links: Sequence[Link],
        topology: Topology,
        interval_s: float,
        min_gain: float,
        timeout_s: float,
        status_path: Path | None,
        request: Request = control_request,
        watch: WatchSettings | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.topology = topology
        self.cores = cores_of(topology)
        self.interval_s, self.min_gain, self.timeout_s = interval_s, min_gain, timeout_s
        self.status_path = status_path
        self.clock = clock
        self.daemons = ControlDaemons(links, self.cores, interval_s, timeout_s, request, clock)
        settings = watch or WatchSettings(min_gain=min_gain)
        self.core = LookCore(self.daemons, Strategy("joint", len(self.cores)), settings, clock)
        log.info(
            "coordinating %d models on %d cores (%s): %s",
            len(self.links), len(self.cores), topology.describe(), describe(self.daemons.shares),
        )  # fmt: skip

    # What the status file shows, and the tests read: the daemons' books and the core's.
    @property
    def links(self) -> list[Link]:
        return self.daemons.links

    @property
    def split(self) -> tuple[int, ...]:
        return tuple(self.daemons.split)

    @property
    def moves(self) -> deque[Move]:
        return self.daemons.moves

    @property
    def declined(self) -> str:
        return self.daemons.declined

    @property
    def watch(self) -> Watch:
        return self.core.watch

    @property
    def joint(self) -> JointPlan | None:
        return self.core.joint

    @property
    def looks(self) -> int:
        return self.core.looks

    # -- the loop -------------------------------------------------------------------------------
    def run(self, stopping: Callable[[], bool]) -> None:
        """Look every interval until `stopping()`; a look that fails is logged, never fatal."""
        while not stopping():
            started = time.monotonic()
            self.tick()
            while not stopping() and time.monotonic() - started < self.interval_s:
                time.sleep(min(0.1, self.interval_s))

    def tick(self) -> None:
        """One look (coordinate.core's phases: every daemon's demand, shares given back, the joint plan, a move
        if it pays), then the status file."""
        self.core.tick()
        self.write_status()

    # -- status ---------------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        daemons = self.daemons
        return {
            "time": time.time(),
            "pid": os.getpid(),
            "looks": self.looks,
            "interval_s": self.interval_s,
            "min_gain": self.min_gain,
            "watch": self.watch.settings.to_json(),
            "machine": {"cpus": format_cpulist(self.topology.cpu_ids), "cores": len(self.cores)},
            "split": dict(zip(daemons.names, self.split, strict=True)),
            "models": [link.to_json(daemons.shares[link.name], self._offered(link)) for link in self.links],
            "joint_plan": None if self.joint is None else self.joint.to_json(),
            # What it serves and why: the joint plan's split, or the simple one that wins for the traffic seen.
            "serving": None if self.core.choice is None else self.core.choice.to_json(),
            "declined": self.declined,
            "moves": [move.to_json() for move in self.moves],
        }

    def write_status(self) -> None:
        """The status file, replaced atomically (`packrat coordinate --status` reads it)."""
        if self.status_path is None:
            return
        tmp = self.status_path.with_name(f".{self.status_path.name}.tmp")
        try:
            tmp.write_text(json.dumps(self.status(), indent=2), encoding="utf-8")
            os.replace(tmp, self.status_path)
        except OSError as exc:
            log.warning("coordinator: could not write %s: %s", self.status_path, exc)

    def _offered(self, link: Link) -> float | None:
        if not link.up:
            return None
        return round(self.watch.inputs_per_s(link.name, self.clock(), self.watch.settings.arrivals_s), 3)
