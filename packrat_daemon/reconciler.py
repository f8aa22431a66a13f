"""The reconciler: the only code that changes the worker pool.

It is given a desired Plan and makes the live pool match it (after gunicorn's manage_workers:
describe the target, converge to it). Each plan is a new generation of slots (threads, cores):
  1. live workers that already have a slot's threads and cores join the new generation as they are;
  2. other ready workers are re-threaded and re-pinned in place (no fork, no reload): they keep
     serving with their old threads until the switch is done;
  3. slots still empty get freshly forked workers;
  4. workers the plan has no slot for are retired only once every slot is served.
Every ready worker takes batches meanwhile, so no request ever finds the pool empty. Workers that
die after they were ready are replaced at once, within the current generation.

Workers that die before they were ready (boot failures) are re-forked one at a time after a growing
pause, and after MAX_BOOT_FAILURES in a row the reconciler raises WorkerBootError with the last one's
reason (after circus's max_retry and gunicorn's WORKER_BOOT_ERROR): a model that cannot start stops
the daemon with that message instead of being re-forked in a loop.
"""

from __future__ import annotations

import logging
import time
from collections import Counter

from packrat_daemon.notify import sd_notify, status
from packrat_daemon.pool import Pool, WorkerHandle, WorkerState
from packrat_daemon.wire.errors import WorkerBootError
from policies.base import Plan
from policies.planning.cores import CoreAllocator
from policies.planning.topology import Topology

log = logging.getLogger("packrat.reconciler")

Slot = tuple[int, tuple[int, ...]]  # (threads, cores)

MAX_BOOT_FAILURES = 5  # workers in a row that fail before they are ready; then the daemon stops
BOOT_BACKOFF_FIRST_S = 0.25  # the pause after the first boot failure, doubled after each further one
BOOT_BACKOFF_MAX_S = 8.0


def boot_backoff_s(failures: int) -> float:
    """How long to wait after the last of `failures` boot failures in a row before forking again."""
    if failures <= 0:
        return 0.0
    return min(BOOT_BACKOFF_MAX_S, BOOT_BACKOFF_FIRST_S * 2 ** (failures - 1))


def plan_slots(plan: Plan, allocator: CoreAllocator) -> list[list[Slot]]:
    """Each of the plan's layouts as slots. Each layout gets disjoint cores of its own; layouts overlap
    one another (one runs at a time)."""
    allocate = allocator.allocate_oversubscribed if plan.oversubscribed else allocator.allocate
    slots = []
    for layout in plan.layouts:
        counts = [instance.threads for instance in layout]
        slots.append(list(zip(counts, allocate(counts), strict=True)))
    return slots


class Reconciler:
    def __init__(self, pool: Pool, topology: Topology) -> None:
        self.pool = pool
        self.allocator = CoreAllocator(topology)
        self.plan: Plan | None = None
        self.generation = 0
        self._slots: list[Slot] = []
        self.layouts: list[list[Slot]] = []
        self._complete_logged = -1

    def set_plan(self, plan: Plan) -> None:
        self.plan = plan
        self.generation += 1
        self.layouts = plan_slots(plan, self.allocator)
        # A worker serves every layout that has its exact (threads, cores): count each slot once.
        needed: Counter[Slot] = Counter()
        for layout in self.layouts:
            needed |= Counter(layout)
        self._slots = sorted(needed.elements(), key=lambda slot: (-slot[0], slot[1]))
        log.info("reconciling to generation %d: %s", self.generation, plan.describe())
        sd_notify(status(f"reconciling the pool to {plan.describe()}"))  # systemd's status line
        self._adopt_live_workers()

    def step(self) -> None:
        """Fork what is missing; once every slot is served, retire what the plan has no slot for.

        Raises WorkerBootError once MAX_BOOT_FAILURES workers in a row have failed before they were ready.
        """
        if self.plan is None:
            return
        self._fork(self._missing())
        if self._complete():
            if self._complete_logged != self.generation:
                self._complete_logged = self.generation
                log.info("generation %d serves with %d worker(s)", self.generation, len(self._slots))
                sd_notify(status(f"serving {self.plan.describe()} with {len(self._slots)} worker(s)"))
            for worker in self.pool.live():
                if worker.generation != self.generation and worker.pending is None:
                    self.pool.retire(worker)

    def replace(self, worker: WorkerHandle) -> None:
        """A hung or overdue worker: kill it; a later step forks its replacement into the same slot."""
        self.pool.kill(worker)

    def serving(self) -> list[WorkerHandle]:
        """Every ready worker takes batches; retired ones are no longer ready."""
        return sorted(self.pool.ready(), key=lambda w: w.id)

    def converged(self) -> bool:
        return self.plan is not None and self._complete() and len(self.pool.live()) == len(self._slots)

    # -- internals --------------------------------------------------------------------------
    def _fork(self, missing: list[Slot]) -> None:
        pool = self.pool
        if pool.boot_failures == 0:
            # No boot failure outstanding: every missing slot at once (at start, and for a worker lost
            # while serving, whose clients are waiting).
            for threads, cores in missing:
                pool.spawn(threads, cores, self.generation)
            return
        if pool.boot_failures >= MAX_BOOT_FAILURES:
            raise WorkerBootError(
                f"{pool.boot_failures} workers in a row failed before they were ready, so the daemon stops "
                f"instead of forking more; the last one said: {pool.boot_error}. Fix what it reports (the model, "
                "its --input, or the cores and memory it may use) and start the daemon again."
            )
        # After a boot failure, every fork (a replacement of a lost worker too) waits its turn: one worker
        # at a time, each after a longer pause, until one is ready.
        if not missing or any(w.state is WorkerState.STARTING for w in pool.live()):
            return
        pause = boot_backoff_s(pool.boot_failures)
        if time.monotonic() < pool.boot_failed_at + pause:
            return
        threads, cores = missing[0]
        log.info("forking a %d-thread worker again after a %.2f s pause (%d boot failure(s) in a row)",
                 threads, pause, pool.boot_failures)  # fmt: skip
        pool.spawn(threads, cores, self.generation)

    def _adopt_live_workers(self) -> None:
        free = Counter(self._slots)
        leftovers: list[WorkerHandle] = []
        for worker in sorted(self.pool.live(), key=lambda w: w.id):
            if worker.pending is None and free[(worker.threads, worker.cores)] > 0:
                free[(worker.threads, worker.cores)] -= 1
                worker.generation = self.generation
            elif worker.state is WorkerState.READY:
                leftovers.append(worker)
            else:
                # Still starting for an older plan: it will be retired once the new plan is served.
                continue
        remaining = [slot for slot in self._slots for _ in range(free[slot])]
        # Slots keep plan order; pair each with a worker that already has that many threads if possible.
        for slot in list(remaining):
            match = next((w for w in leftovers if w.threads == slot[0]), None) or (leftovers[0] if leftovers else None)
            if match is None:
                break
            leftovers.remove(match)
            remaining.remove(slot)
            self.pool.reconfigure(match, slot[0], slot[1], self.generation)
            log.info("re-threading worker %d in place: %d→%d thread(s) on cores %s",
                     match.id, match.threads, slot[0], list(slot[1]))  # fmt: skip

    def _mine(self) -> list[WorkerHandle]:
        return [
            w
            for w in self.pool.live()
            if (w.pending is not None and w.pending[2] == self.generation)
            or (w.pending is None and w.generation == self.generation)
        ]

    def _missing(self) -> list[Slot]:
        have = Counter(w.target for w in self._mine())
        missing = []
        for slot in self._slots:
            if have[slot]:
                have[slot] -= 1
            else:
                missing.append(slot)
        return missing

    def _complete(self) -> bool:
        ready = [w for w in self._mine() if w.state is WorkerState.READY and w.pending is None]
        return Counter((w.threads, w.cores) for w in ready) == Counter(self._slots)
