"""The background measurement's outcome, adopted while serving (`startup.Measuring`): a switch of runtime,
precision or plan through the board, and `packrat status`'s account of the choice."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from packrat_daemon.startup.sequence import measured_profile

if TYPE_CHECKING:
    from packrat_daemon.control.board import Board
    from packrat_daemon.fleet.backend import ModelInfo
    from packrat_daemon.requests.frontend import Frontend
    from packrat_daemon.startup import Measuring

log = logging.getLogger("packrat.daemon")


class MeasuredSwitch:
    def __init__(self, board: Board, frontend: Frontend, measuring: Measuring | None) -> None:
        self.board, self.frontend, self.measuring = board, frontend, measuring
        self.next_info: ModelInfo | None = None  # the runtime switched to, said in `info` once it alone serves

    def tick(self, _now: float) -> None:
        """Switch to what the background measurement chose: the state file keeps what it measured and its
        choice; the plan (on the new runtime's template, if it won) goes to the reconciler. The `info` reply
        says the new runtime once no worker of the old one serves."""
        board = self.board
        if self.next_info is not None:
            pool, serving = board.reconciler.pool, board.reconciler.serving()
            if serving and all(pool.via(worker) is pool.backend for worker in serving):
                info = self.frontend.info = self.next_info
                board.set_runtime(info)
                self.next_info = None
                guard = "not needed" if info.guard is None else "passed"
                board.metrics.served(info.runtime, info.precision, guard)
                log.info("serving %s at %s (accuracy guard: %s)", info.runtime, info.precision, guard)
            return
        done = None if self.measuring is None else self.measuring.take()
        if done is None:
            return
        chosen = done.candidate
        for key, entry in done.entries.items():
            board.state.record(key, entry)
        board.state.choice, board.state.served_key = done.choice, chosen.key
        board.set_profile(chosen.profile)
        measured_profile(board.metrics, board.state, chosen)
        backend = None if done.same_template else chosen.backend
        log.info("switching to %s on %s: measured fastest while %s served (%s)",
                 chosen.key, chosen.plan.describe(), board.served.info.runtime, done.reason)  # fmt: skip
        board.switch(chosen.plan, f"runtime: {chosen.key}", backend)
        if backend is not None:
            self.next_info = chosen.info

    def status(self) -> dict[str, Any] | None:
        """`packrat status`'s runtime choice: the background measurement's while it runs, then the state's."""
        if self.measuring is not None and not self.measuring.done:
            return self.measuring.status()
        choice = self.board.state.choice_status()
        if choice is not None and self.measuring is not None:
            choice["still_measuring"] = []
            choice["switching"] = self.next_info is not None
        return choice
