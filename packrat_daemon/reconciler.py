"""The reconciler: the only code that changes the worker pool.

It is given a desired Plan and makes the live pool match it (after gunicorn's manage_workers:
describe the target, converge to it). Each plan is a new generation of slots (threads, cores):
  1. live workers that already have a slot's threads and cores join the new generation as they are;
  2. other ready workers are re-threaded and re-pinned in place (no fork, no reload): they keep
     serving with their old threads until the switch is done;
  3. slots still empty get freshly forked workers;
  4. workers the plan has no slot for are retired only once every slot is served.
Every ready worker takes batches meanwhile, so no request ever finds the pool empty. Workers that
die are replaced within the current generation.
"""

from __future__ import annotations

import logging
from collections import Counter

from packrat_daemon.pool import Pool, WorkerHandle, WorkerState
from policies.base import Plan
from policies.planning.topology import CoreAllocator, Topology

log = logging.getLogger("packrat.reconciler")

Slot = tuple[int, tuple[int, ...]]  # (threads, cores)


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
        # Each layout gets disjoint cores of its own; layouts overlap one another (one runs at a time).
        self.layouts = []
        for layout in plan.layouts:
            counts = [instance.threads for instance in layout]
            allocate = self.allocator.allocate_oversubscribed if plan.oversubscribed else self.allocator.allocate
            self.layouts.append(list(zip(counts, allocate(counts), strict=True)))
        # A worker serves every layout that has its exact (threads, cores): count each slot once.
        needed: Counter[Slot] = Counter()
        for layout in self.layouts:
            needed |= Counter(layout)
        self._slots = sorted(needed.elements(), key=lambda slot: (-slot[0], slot[1]))
        log.info("reconciling to generation %d: %s", self.generation, plan.describe())
        self._adopt_live_workers()

    def step(self) -> None:
        """Fork what is missing; once every slot is served, retire what the plan has no slot for."""
        if self.plan is None:
            return
        for threads, cores in self._missing():
            self.pool.spawn(threads, cores, self.generation)
        if self._complete():
            if self._complete_logged != self.generation:
                self._complete_logged = self.generation
                log.info("generation %d serves with %d worker(s)", self.generation, len(self._slots))
            for worker in self.pool.live():
                if worker.generation != self.generation and worker.pending is None:
                    self.pool.retire(worker)

    def serving(self) -> list[WorkerHandle]:
        """Every ready worker takes batches; retired ones are no longer ready."""
        return sorted(self.pool.ready(), key=lambda w: w.id)

    def converged(self) -> bool:
        return self.plan is not None and self._complete() and len(self.pool.live()) == len(self._slots)

    # -- internals --------------------------------------------------------------------------
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
