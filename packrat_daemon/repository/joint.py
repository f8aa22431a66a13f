"""The joint core plan over the models loaded: `packrat coordinate`'s own loop (`coordinate.loop.Coordinator`),
run in a thread, over the loaded models' control sockets, writing its status file (RUN_DIR/coordinator.json,
which `packrat coordinate --status --status-file` reads).

A coordinator drives a fixed set of daemons, so a load or an unload ends the running one and starts another over
the new set: its first look finds every daemon on the CPUs it holds and tells each its share of the new even
division, shrinks first (an unloaded model's cores go to the others; a loaded one's come from them), and from
then on it moves cores as the traffic moves, as `packrat coordinate` does. With more models than usable cores no
model can have cores of its own: every model is then told every CPU (they time-share), and the coordinator
comes back once models are unloaded down to the cores.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from packrat_daemon.control.server import request as control_request
from packrat_daemon.coordinate.lock import coordinating
from packrat_daemon.coordinate.loop import Coordinator, Link
from packrat_daemon.coordinate.shares import cores_of, divide, even_split
from packrat_daemon.wire.errors import PackratError
from policies.planning.topology import Topology, format_cpulist

log = logging.getLogger("packrat.repository")

ASSIGN_TIMEOUT_S = 120.0


class JointPlan:
    """The coordinator over the loaded models, started again at each change of the set."""

    def __init__(self, topology: Topology, status_path: Path, interval_s: float = 0.5, min_gain: float = 0.1) -> None:
        self.topology = topology
        self.cores = cores_of(topology)
        self.status_path = status_path
        self.interval_s, self.min_gain = interval_s, min_gain
        self.coordinator: Coordinator | None = None
        self.mode = "none"  # "joint" (a coordinator runs), "shared" (every model on every CPU), "none"
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def first_cpus(self, names: Sequence[str]) -> dict[str, str | None]:
        """Each model's CPUs at its (re)start for the set `names`: its share of the even division, as the
        coordinator's `first`; None (every CPU) for all when there are more models than cores."""
        if not names or len(names) > len(self.cores):
            return {name: None for name in names}
        shares = divide(self.cores, even_split(len(self.cores), len(names)))
        return {name: format_cpulist(share) for name, share in zip(names, shares, strict=True)}

    def reset(self, daemons: Sequence[tuple[str, str]]) -> None:
        """Plan jointly over `daemons` ((name, control endpoint) each, in share order) from now on."""
        with self._lock:
            self._end()
            if not daemons:
                self.mode = "none"
                return
            if len(daemons) > len(self.cores):
                self.mode = "shared"
                self._share_all(daemons)
                return
            self.mode = "joint"
            links = [Link(name, endpoint) for name, endpoint in daemons]
            self._stop = threading.Event()
            self._thread = threading.Thread(target=self._run, args=(links, self._stop), name="joint-plan", daemon=True)
            self._thread.start()

    def _run(self, links: list[Link], stop: threading.Event) -> None:
        try:
            with coordinating([(link.name, link.endpoint) for link in links]):
                coordinator = Coordinator(
                    links, self.topology, self.interval_s, self.min_gain, ASSIGN_TIMEOUT_S, self.status_path
                )
                self.coordinator = coordinator
                coordinator.run(stop.is_set)
                coordinator.write_status()
        except PackratError as exc:
            log.error("the joint plan stopped: %s; each model keeps the CPUs it holds", exc)

    def _share_all(self, daemons: Sequence[tuple[str, str]]) -> None:
        cpus = sorted(cpu for core in self.cores for cpu in core)
        log.warning(
            "%d models on %d usable cores: no model can have cores of its own, so every model is given every "
            "CPU (they time-share) and no joint plan runs; unload models down to %d for one",
            len(daemons),
            len(self.cores),
            len(self.cores),
        )
        reason = f"repository: {len(daemons)} models share {len(self.cores)} cores"
        self._write_shared([name for name, _ in daemons], reason, cpus)
        for name, endpoint in daemons:
            try:
                control_request(endpoint, {"op": "assign", "cpus": cpus, "reason": reason}, ASSIGN_TIMEOUT_S)
            except PackratError as exc:  # down: it starts again on every CPU (first_cpus)
                log.warning("model %s not told every CPU: %s", name, exc)

    def _write_shared(self, names: list[str], reason: str, cpus: list[int]) -> None:
        """The status file as `packrat coordinate --status` reads it, for the models time-sharing every CPU."""
        every = format_cpulist(cpus)
        status = {
            "time": time.time(), "pid": os.getpid(), "looks": 0, "interval_s": self.interval_s, "mode": "shared",
            "machine": {"cpus": every, "cores": len(self.cores)},
            "models": [{"name": name, "up": True, "cpus": every} for name in names],
            "declined": f"{reason}: no joint plan until the models loaded are at most the cores", "moves": [],
        }  # fmt: skip
        tmp = self.status_path.with_name(f".{self.status_path.name}.tmp")
        try:
            tmp.write_text(json.dumps(status, indent=2), encoding="utf-8")
            os.replace(tmp, self.status_path)
        except OSError as exc:
            log.warning("cannot write %s: %s", self.status_path, exc)

    def _end(self) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join(ASSIGN_TIMEOUT_S)
            self._thread = None
        self.coordinator = None

    def close(self) -> None:
        with self._lock:
            self._end()
