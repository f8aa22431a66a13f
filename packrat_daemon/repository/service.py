"""The repository's models at run time: which are loaded, their daemons, the joint plan over them, and the
routes of the one gateway to them. Loads and unloads (at start, and from the repository extension) go one at a
time; the joint plan is started again over the new set once a loaded model serves or an unloaded one has gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from packrat_daemon.protocol.errors import OipError, Status
from packrat_daemon.repository.daemons import LOADING, READY, ModelDaemon
from packrat_daemon.repository.joint import JointPlan
from packrat_daemon.repository.layout import Repository
from packrat_daemon.repository.plane import RepositoryPlane

log = logging.getLogger("packrat.repository")

UNLOADED = "UNLOADED"
DEFAULT_LOAD_TIMEOUT_S = 600.0


class RepositoryService:
    """The repository extension's `Models`: index, load, unload; on the gateway's loop."""

    def __init__(
        self,
        repository: Repository,
        flags: Mapping[str, Any],
        run_dir: Path,
        joint: JointPlan,
        plane: RepositoryPlane,
        log_dir: Path | None = None,
    ) -> None:
        self.repository, self.flags, self.run_dir = repository, dict(flags), run_dir
        self.joint, self.plane, self.log_dir = joint, plane, log_dir
        self.daemons: dict[str, ModelDaemon] = {}
        self.failures: dict[str, str] = {}  # why a model's last load failed
        self._one_at_a_time = asyncio.Lock()
        plane.on_probe = self._probed

    def _probed(self, name: str, ready: bool) -> None:
        daemon = self.daemons.get(name)
        if daemon is not None:
            daemon.mark(ready)

    def loaded(self) -> list[str]:
        """The loaded models, in the repository's order (the order of their shares)."""
        return [name for name in self.repository.models if name in self.daemons]

    # -- the extension ------------------------------------------------------------------------
    async def index(self, ready_only: bool = False) -> list[dict[str, str]]:
        entries = []
        for name, entry in self.repository.models.items():
            daemon = self.daemons.get(name)
            if daemon is not None and daemon.state != READY:
                await self.plane.model_ready(name)  # asked now, so the index says what serves
            state = UNLOADED if daemon is None else daemon.state
            reason = self.failures.get(name, "") if daemon is None else self._reason(daemon)
            if not ready_only or state == READY:
                entries.append({"name": name, "version": entry.version, "state": state, "reason": reason})
        return entries

    @staticmethod
    def _reason(daemon: ModelDaemon) -> str:
        if daemon.state == READY or not daemon.restarts:
            return ""
        return f"its daemon exited (code {daemon.last_exit}); restarted {daemon.restarts} time(s)"

    async def load(self, name: str) -> None:
        """Start `name`'s daemon and wait until it serves, then plan the cores again; OipError if it cannot."""
        self._known(name)
        async with self._one_at_a_time:
            if name in self.daemons:
                return  # loaded already: the repository on disk is served as it was read at start
            await self._start([name])
            await self._replan()

    async def unload(self, name: str) -> None:
        """Stop routing to `name`, drain and stop its daemon, then give its cores to the others."""
        self._known(name)
        async with self._one_at_a_time:
            daemon = self.daemons.pop(name, None)
            if daemon is None:
                return  # not loaded: nothing to do, as Triton answers
            self.plane.remove(name)
            code = await asyncio.to_thread(daemon.stop)
            log.info("model %s unloaded (its daemon exited with code %s)", name, code)
            await self._replan()

    def _known(self, name: str) -> None:
        if name not in self.repository.models:
            held = ", ".join(self.repository.models)
            raise OipError(Status.NOT_FOUND, f"the repository has no model {name!r}; it holds {held}")

    # -- start and stop -----------------------------------------------------------------------
    async def start(self) -> None:
        """Load every model the repository loads at start, together; then plan the cores."""
        async with self._one_at_a_time:
            # One that fails is logged and listed in the index with its reason; the other models serve.
            with contextlib.suppress(OipError):
                await self._start([name for name, entry in self.repository.models.items() if entry.load])
            await self._replan()

    async def _start(self, names: list[str]) -> None:
        cpus = self.joint.first_cpus([n for n in self.repository.models if n in self.daemons or n in names])
        for name in names:
            settings = self.repository.settings(name, self.flags)
            log_path = None if self.log_dir is None else self.log_dir / f"{name}.log"
            daemon = ModelDaemon(name, self.run_dir / "models" / name, settings, log_path)
            daemon.cpus = cpus[name]
            for note in self.repository.models[name].notes:
                log.info("model %s: %s", name, note)
            daemon.start()
            self.daemons[name] = daemon
            self.plane.add(name, daemon.endpoint)
            self.failures.pop(name, None)
        results = await asyncio.gather(*(self._serving(name) for name in names), return_exceptions=True)
        errors = [result for result in results if isinstance(result, BaseException)]
        if errors:
            raise errors[0]

    async def _serving(self, name: str) -> None:
        daemon = self.daemons[name]
        timeout_s = float(daemon.settings.get("startup_timeout_s", DEFAULT_LOAD_TIMEOUT_S)) + 60.0
        deadline = asyncio.get_running_loop().time() + timeout_s
        while not await self.plane.model_ready(name):
            if daemon.restarts or asyncio.get_running_loop().time() > deadline:
                why = (
                    f"its daemon exited (code {daemon.last_exit}) before it served"
                    if daemon.restarts
                    else f"it did not serve within {timeout_s:.0f} s"
                )
                self.failures[name] = f"{why}; its log says why"
                log.error("model %s failed to load: %s", name, self.failures[name])
                self.daemons.pop(name, None)
                self.plane.remove(name)
                await asyncio.to_thread(daemon.stop, 5.0)
                raise OipError(Status.INVALID_ARGUMENT, f"model {name!r} failed to load: {self.failures[name]}")
            await asyncio.sleep(0.2)
        daemon.mark(True)
        log.info("model %s serves (%s)", name, daemon.endpoint)

    async def _replan(self) -> None:
        """The joint plan over the models loaded now; each daemon's next restart on its share of the new set."""
        names = self.loaded()
        for name, cpus in self.joint.first_cpus(names).items():
            self.daemons[name].cpus = cpus
        daemons = [(name, self.daemons[name].control) for name in names]
        await asyncio.to_thread(self.joint.reset, daemons)

    async def close(self) -> None:
        """Stop the joint plan, then every daemon at once (each drains)."""
        await asyncio.to_thread(self.joint.close)
        daemons = list(self.daemons.values())
        self.daemons.clear()
        await asyncio.gather(*(asyncio.to_thread(daemon.stop) for daemon in daemons))

    def status(self) -> dict[str, Any]:
        return {
            "models": [
                self.daemons[n].status() if n in self.daemons else {"name": n, "state": UNLOADED}
                for n in self.repository.models
            ],
            "joint_plan": self.joint.mode,
            "loading": [name for name, daemon in self.daemons.items() if daemon.state == LOADING],
        }
