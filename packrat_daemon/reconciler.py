"""The reconciler: the only code that changes the worker pool.

It is given a desired Plan and makes the live pool match it, new-first: a new generation of
workers is started beside the serving one, and the old generation is retired only once every new
worker is ready, so no request ever finds the pool empty. Workers that die are replaced within the
current generation. (Shape after gunicorn's manage_workers: describe the target, converge to it.)
"""

from __future__ import annotations

import logging
from collections import Counter

from packrat_daemon.pool import Pool, WorkerHandle, WorkerState
from packrat_daemon.topology import CoreAllocator, Topology
from policies.base import Plan

log = logging.getLogger("packrat.reconciler")


class Reconciler:
    def __init__(self, pool: Pool, topology: Topology) -> None:
        self.pool = pool
        self.allocator = CoreAllocator(topology)
        self.plan: Plan | None = None
        self.generation = 0  # the generation being built (== serving once it is complete)
        self.serving_generation: int | None = None
        self._slots: list[tuple[int, tuple[int, ...]]] = []

    def set_plan(self, plan: Plan) -> None:
        if self.plan is not None and self._same_pool(plan):
            self.plan = plan
            return
        self.plan = plan
        self.generation += 1
        counts = plan.thread_counts
        cores = (
            self.allocator.allocate_oversubscribed(counts)
            if plan.oversubscribed
            else self.allocator.allocate(counts)
        )
        self._slots = list(zip(counts, cores, strict=True))
        log.info("reconciling to generation %d: %s", self.generation, plan.describe())

    def step(self) -> None:
        """Start what is missing from the target generation; retire what the target replaces."""
        if self.plan is None:
            return
        mine = [w for w in self.pool.live() if w.generation == self.generation]
        for threads, cores in self._missing(mine):
            self.pool.spawn(threads, cores, self.generation)
        target_ready = self.pool.ready(self.generation)
        if len(target_ready) == len(self._slots) and self.serving_generation != self.generation:
            self.serving_generation = self.generation
            log.info("generation %d is serving with %d worker(s)", self.generation, len(target_ready))
        if self.serving_generation == self.generation:
            for worker in self.pool.live():
                if worker.generation != self.generation:
                    self.pool.retire(worker)

    def serving(self) -> list[WorkerHandle]:
        """Workers that take batches now: the newest complete generation, else the previous one."""
        if self.serving_generation is None:
            return []
        workers = self.pool.ready(self.serving_generation)
        if not workers:  # every serving worker died: use anything ready rather than nothing
            workers = self.pool.ready()
        return sorted(workers, key=lambda w: w.id)

    def converged(self) -> bool:
        if self.plan is None or self.serving_generation != self.generation:
            return False
        ready = self.pool.ready(self.generation)
        return len(ready) == len(self._slots) and len(self.pool.live()) == len(ready)

    def _missing(self, mine: list[WorkerHandle]) -> list[tuple[int, tuple[int, ...]]]:
        have = Counter((w.threads, w.cores) for w in mine if w.state is not WorkerState.DEAD)
        missing = []
        for slot in self._slots:
            if have[slot]:
                have[slot] -= 1
            else:
                missing.append(slot)
        return missing

    def _same_pool(self, plan: Plan) -> bool:
        assert self.plan is not None
        return sorted(plan.thread_counts) == sorted(self.plan.thread_counts) and (
            plan.oversubscribed == self.plan.oversubscribed
        )
