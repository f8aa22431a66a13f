"""The background measurement of a first start that answers early (`--first-answer`): every candidate prepared
and measured in a thread of its own, at a lower priority, while the first answer serves; its outcome is handed to
the main loop, which switches (the reconciler's generation on the chosen candidate's template, no request failed).
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import threading
from dataclasses import dataclass
from typing import Any

from packrat_daemon.measure.runtime_choice import MEASURING, ms_text, verdicts
from packrat_daemon.ops.state import Choice, Entry
from packrat_daemon.startup.candidates import prepare_candidates, prepare_runtime
from packrat_daemon.startup.choice import choice_settings, predictions, settle
from packrat_daemon.startup.context import RuntimeCandidate, StartContext
from policies.planning.profile import profile_key

log = logging.getLogger("packrat.daemon")

# The background measurement's templates (and the workers they fork, which inherit it) run at this niceness: the
# serving workers come first, by a little. Its weight is not its share: a multi-threaded step waits for its slowest
# thread, so under traffic that keeps every core busy nice 5 (a third of nice 0's weight) measured many times
# slower than alone, and a large model's first start reached its best candidate only after many minutes, serving
# the slow first answer meanwhile. Every candidate is measured so, the served runtime included, so that their
# profiles are compared under the same conditions.
MEASURE_NICE = 1


@dataclass(frozen=True)
class Measured:
    """The background measurement's outcome: the candidate to serve from now on and the choice made."""

    candidate: RuntimeCandidate  # its template ready at the daemon's priority (the served one's: `same_template`)
    same_template: bool  # the runtime answering now won: only its plan changes, on the template already serving
    choice: Choice
    entries: dict[str, Entry]  # what was measured, for the state file
    reason: str


class Measuring:
    """Every candidate prepared and measured in a thread of its own while the first answer serves.

    The thread owns every socket and template it starts (none is the main loop's); its one outcome, `Measured` or
    the error it ended with, is taken by the main loop (`take`), which alone switches the pool. Each candidate is
    measured on its own template at MEASURE_NICE, the runtime serving now included (on a second template of it),
    so that no profile is taken on a quieter machine than another. The winner, unless it is the runtime serving
    now, is started afresh at the daemon's priority (its profile and guard taken from what was just measured)."""

    def __init__(
        self, pairs: list[tuple[str, str]], served_key: str, identities: dict[str, dict[str, Any]], ctx: StartContext
    ) -> None:
        self.pairs, self.served_key, self.identities = pairs, served_key, identities
        # The state file as the thread sees it: the saved entries to read, its own to record (handed over after).
        recorder = copy.copy(ctx.state)
        recorder.entries = {}
        self._stop = threading.Event()
        self.ctx = dataclasses.replace(ctx, state=recorder, interrupted=self._stop.is_set)
        self.remaining = [profile_key(*pair) for pair in pairs]  # read by `status` on the main thread
        self.done = False
        self._finished = threading.Event()  # the outcome is there to take
        self._outcome: Measured | BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="packrat-measuring", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def take(self) -> Measured | None:
        """The outcome, once, when the thread has ended: None while it measures (or after). An error it ended with
        is logged and None returned: the first answer serves on."""
        if self.done or not self._finished.is_set() or self._outcome is None:
            return None
        self.done = True
        outcome, self._outcome = self._outcome, None
        if isinstance(outcome, BaseException):
            log.error("measuring the candidates failed, so %s serves on as it is: %s", self.served_key, outcome)
            return None
        return outcome

    def status(self) -> dict[str, Any]:
        """What `packrat status` says while measuring: what serves, and the candidates still being measured."""
        remaining = list(self.remaining)
        why = f"being measured in the background while {self.served_key} answers"
        candidates = [{"candidate": key, "verdict": MEASURING, "predicted_ms": None, "why": why} for key in remaining]
        # Every candidate measured, the choice not yet taken: its split check, or the winner's template starting.
        return {"served": self.served_key, "decided_at_this_start": True, "decided_age_s": 0.0,
                "candidates": candidates, "still_measuring": remaining, "switching": not remaining}  # fmt: skip

    def close(self) -> None:
        """Stop measuring (between two measurements), close what the thread started and nobody took, and let the
        thread end: after the pool has stopped its templates (one may be the thread's: see `_run`)."""
        self._stop.set()
        if self._thread.ident is not None:  # never started when the daemon failed before serving
            self._thread.join(timeout=60)
        outcome, self._outcome = self._outcome, None
        if isinstance(outcome, Measured) and not outcome.same_template:
            outcome.candidate.backend.close()

    def _run(self) -> None:
        try:
            self._outcome = self._measure()
        except KeyboardInterrupt:
            log.info("measuring the candidates stopped")
        except BaseException as exc:  # noqa: BLE001 - handed to the main loop, which serves on (take)
            self._outcome = exc
        finally:
            self.remaining = []
            self._finished.set()
        # A template dies with the thread that started it (its PR_SET_PDEATHSIG fires on the parent thread's exit,
        # not the process's), and the chosen candidate's was started here: this thread lives until the daemon closes.
        self._stop.wait()

    def _measure(self) -> Measured:
        ctx, state = self.ctx, self.ctx.state
        refused: dict[str, str] = {}
        screened: dict[str, str] = {}

        def decided(key: str) -> None:
            self.remaining = [each for each in self.remaining if each != key]

        candidates = prepare_candidates(ctx, self.pairs, True, refused, screened, MEASURE_NICE, decided)
        for key, entry in state.entries.items():
            if entry is not state.saved.get(key):  # measured now, beside the first answer's workers
                entry.measured_while = self.served_key
        try:
            served, reason = settle(ctx, candidates)
        finally:
            for candidate in candidates:
                candidate.backend.close()
        choice = Choice(verdicts(served.key, reason, predictions(candidates), refused, screened), self.identities,
                        choice_settings(ctx.config))  # fmt: skip
        for verdict in choice.verdicts:
            expected = "" if verdict.predicted_ms is None else f" (predicted {ms_text(verdict.predicted_ms)} ms)"
            log.info("candidate %s: %s%s, measured while %s served: %s", verdict.candidate, verdict.verdict,
                     expected, self.served_key, verdict.why)  # fmt: skip
        if served.key == self.served_key:
            return Measured(served, True, choice, state.entries, reason)
        # Started afresh at the daemon's priority, on what was just measured: nothing is measured or guarded again.
        state.saved = {**state.saved, **state.entries}
        runtime, _, precision = served.key.partition("/")
        fresh = prepare_runtime(ctx, runtime, precision or "fp32")
        assert fresh is not None  # its guard passed moments ago, under the same settings
        fresh = dataclasses.replace(fresh, profile=served.profile, plan=served.plan)  # as the split check left them
        return Measured(fresh, False, choice, state.entries, reason)
