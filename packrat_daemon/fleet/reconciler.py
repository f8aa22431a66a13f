"""The reconciler: the only code that changes the worker pool.

It is given a desired Plan and makes the live pool match it (after gunicorn's manage_workers:
describe the target, converge to it). Each plan is a new generation of slots (threads, cores):
  1. live workers that already have a slot's threads and cores join the new generation as they are;
  2. other ready workers are re-threaded and re-pinned in place (no fork, no reload): they keep
     serving with their old threads until the switch is done;
  3. slots still empty get freshly forked workers; make before break: the workers to re-thread serve the old
     plan as they are until every fork serves (at once, a 2-thread worker became a 1-thread one for the
     other core's fork's whole warm-up, and ResNet-50's queue grew for seconds under load);
  4. workers the plan has no slot for stop serving only once every slot is served. They are parked, not
     stopped: idle, pinned as they were, for PARK_S, so that a later plan with their slot (switching back
     and forth between two plans, by hand or by adaptation) takes them at once instead of forking and
     warming up a worker again. A parked worker that is not taken is stopped after PARK_S.
Every ready worker takes batches meanwhile, so no request ever finds the pool empty.

A plan may come with another template (`set_plan(plan, backend=…)`: a change of runtime or precision). Its
generation is then forked from the new template, every slot afresh (a worker cannot change its runtime in
place); the old template's workers serve until every new slot serves, are then stopped (never parked: no
later plan of the new template could take them), and the old template is closed once the last has exited. Workers that
die after they were ready are replaced at once, within the current generation.

Workers that die before they were ready (boot failures) are re-forked one at a time after a growing
pause, and after MAX_BOOT_FAILURES in a row the reconciler raises WorkerBootError with the last one's
reason (after circus's max_retry and gunicorn's WORKER_BOOT_ERROR): a model that cannot start stops
the daemon with that message instead of being re-forked in a loop.

Every plan change is measured (`Reconfiguration`): the decision, the first re-threaded or forked worker
serving, every slot serving (the new pool), and the last worker of an older plan retired. The history
feeds `packrat status`, and each finished change is handed to `on_measured` (the metrics' histogram). Forks are
timed from spawn to READY (`fork_s`): what a plan that needs one (`forks_needed`) costs adaptation (adapt.tuner).
"""

from __future__ import annotations

import logging
import time
from collections import Counter, deque
from collections.abc import Callable

from packrat_daemon.fleet.backend import Backend
from packrat_daemon.fleet.pool import Pool, WorkerHandle, WorkerState
from packrat_daemon.fleet.reconfiguration import Reconfiguration
from packrat_daemon.ops.notify import sd_notify, status
from packrat_daemon.wire.errors import WorkerBootError
from policies.base import Plan
from policies.planning.cores import CoreAllocator
from policies.planning.topology import Topology

log = logging.getLogger("packrat.reconciler")

Slot = tuple[int, tuple[int, ...]]  # (threads, cores)

MAX_BOOT_FAILURES = 5  # workers in a row that fail before they are ready; then the daemon stops
BOOT_BACKOFF_FIRST_S = 0.25  # the pause after the first boot failure, doubled after each further one
BOOT_BACKOFF_MAX_S = 8.0
# A parked worker costs its private memory and a heartbeat a second, no CPU; a fork costs a model warm-up (seconds
# for ResNet-50 under load). Parked workers never outnumber the usable cores (what a plan without oversubscription has).
PARK_S = 300.0
HISTORY = 100  # plan changes kept for `packrat status` (a status reply stays far below any frame limit)


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


def forks_for(plan: Plan, allocator: CoreAllocator, live: Counter[Slot]) -> list[int]:
    """The threads of each worker a switch to `plan` forks, given the `live` workers' slots: the plan's slots that no
    live worker has, beyond those the others are re-threaded into (in plan order, as the reconciler pairs them)."""
    needed: Counter[Slot] = Counter()
    for layout in plan_slots(plan, allocator):
        needed |= Counter(layout)
    spare = sum((live - needed).values())  # live workers without their slot: re-threaded, not forked
    empty = sorted((needed - live).elements(), key=lambda slot: (-slot[0], slot[1]))
    return [threads for threads, _ in empty[spare:]]


class Reconciler:
    def __init__(
        self, pool: Pool, topology: Topology, on_measured: Callable[[Reconfiguration], None] | None = None
    ) -> None:
        self.pool = pool
        self.allocator = CoreAllocator(topology)
        self.plan: Plan | None = None
        self.generation = 0
        self._slots: list[Slot] = []
        self.layouts: list[list[Slot]] = []
        self._complete_logged = -1
        self.history: deque[Reconfiguration] = deque(maxlen=HISTORY)
        self.on_measured = on_measured
        self._changed: set[int] = set()  # workers re-threaded, forked or unparked for the current generation
        # Make before break: (worker, slot) re-threads that wait until every fork of the generation serves.
        self._deferred: list[tuple[WorkerHandle, Slot]] = []
        self._spawned_at: dict[int, float] = {}  # forks not yet ready: worker id -> time.monotonic() of the spawn
        self.fork_s: float | None = None  # the last fork's time from spawn to ready (None: none timed yet)

    def set_plan(
        self,
        plan: Plan,
        reason: str = "start",
        predicted_ms: tuple[float, float] | None = None,
        backend: Backend | None = None,
    ) -> None:
        """Converge to `plan` from now on; `reason` and `predicted_ms` (expected latency of the old and the
        new plan) go into the history. `backend`: the template to fork this generation from (another runtime or
        precision), when it is not the one the pool forks from now."""
        if backend is not None:
            self.pool.switch_backend(backend)
        if self.history and not self.history[-1].done:
            self.history[-1].superseded = True
        self.history.append(
            Reconfiguration(self.generation + 1, reason, self.plan, plan, time.monotonic(), time.time(), predicted_ms)
        )
        self._changed = set()
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

        Raises WorkerBootError once MAX_BOOT_FAILURES workers in a row have failed before they were ready, and
        TemplateLost once the template is gone: nothing can be forked, and its workers died with it.
        """
        if self.plan is None:
            return
        # Every step: a template killed takes its workers with it, and then no message comes (Backend.template_fd).
        self.pool.check_template()
        self._fork(self._missing())
        self._time_forks()
        self._rethread_when_forks_serve()
        record = self.history[-1] if self.history else None
        # The first worker re-threaded or forked for this plan that serves (or at once: nothing had to change).
        if (record is not None and record.first_serving is None
                and (not self._changed or any(w.id in self._changed for w in self._ready_mine()))):  # fmt: skip
            record.first_serving = time.monotonic()
        if self._complete():
            if self._complete_logged != self.generation:
                self._complete_logged = self.generation
                log.info("generation %d serves with %d worker(s)", self.generation, len(self._slots))
                sd_notify(status(f"serving {self.plan.describe()} with {len(self._slots)} worker(s)"))
            old = False
            live = self.pool.live()
            for worker in live:
                if worker.pending is None and worker.generation != self.generation:
                    self._park_or_retire(worker)
                elif worker.pending is not None and worker.pending[2] != self.generation:
                    old = True  # still switching for an older plan: retired once it has
            if record is not None and not record.done:
                self._measured(record, old)
        for closed in self.pool.close_drained():  # an older runtime's template, its last worker gone
            log.info("the template at %s is closed: none of its workers is left", closed.endpoint)

    def replace(self, worker: WorkerHandle) -> None:
        """A hung or overdue worker: kill it; a later step forks its replacement into the same slot."""
        self.pool.kill(worker)

    def serving(self) -> list[WorkerHandle]:
        """Every ready worker takes batches but the parked ones; retired ones are no longer ready."""
        return sorted((w for w in self.pool.ready() if w.parked_since is None), key=lambda w: w.id)

    @property
    def parked(self) -> dict[int, float]:
        """The live parked workers: worker id -> time.monotonic() it was parked (a dead one is gone with it)."""
        return {w.id: w.parked_since for w in self.pool.live() if w.parked_since is not None}

    @property
    def planned_workers(self) -> int:
        """Processes the plan needs: layouts that ask for the same threads on the same cores share one."""
        return len(self._slots)

    def converged(self) -> bool:
        live = [w for w in self.pool.live() if w.parked_since is None]
        return self.plan is not None and self._complete() and len(live) == len(self._slots)

    # -- internals --------------------------------------------------------------------------
    def _measured(self, record: Reconfiguration, old_left: bool) -> None:
        """Stamp the new pool serving and, once no older worker is left, the last one retired."""
        now = time.monotonic()
        if record.serving is None:
            record.serving = now
        if old_left:
            return
        record.retired = now
        log.info(
            "reconfiguration to generation %d (%s): first new worker serving after %.0f ms, the new pool after "
            "%.0f ms, the last old worker retired after %.0f ms",
            record.generation, record.reason, 1000 * (record.first_serving or now) - 1000 * record.decided,
            1000 * (record.serving - record.decided), 1000 * (now - record.decided),
        )  # fmt: skip
        if self.on_measured is not None and record.old is not None:  # the start is a boot, not a change
            self.on_measured(record)

    def _park_or_retire(self, worker: WorkerHandle) -> None:
        """A worker of an older plan, once the new one serves: park it, or stop it once parked long enough."""
        now = time.monotonic()
        # Cores a coordinator moved to another model (the allocator's topology lost them) are not ours to idle on.
        outside = not set(worker.cores) <= set(self.allocator.topology.cpu_ids)
        # A worker of an older template (another runtime or precision) can serve no later plan: stopped too.
        outside = outside or self.pool.via(worker) is not self.pool.backend
        if worker.parked_since is not None:
            if outside or now - worker.parked_since > PARK_S:
                worker.parked_since = None
                self.pool.retire(worker)
        elif (
            not outside
            and worker.state is WorkerState.READY
            and len(self.parked) < self.allocator.topology.usable_cores
        ):
            worker.parked_since = now
            log.info("worker %d (%d thread(s) on cores %s) parked for a later plan",
                     worker.id, worker.threads, list(worker.cores))  # fmt: skip
        else:
            self.pool.retire(worker)

    def _fork(self, missing: list[Slot]) -> None:
        pool = self.pool
        if pool.boot_failures == 0:
            # No boot failure outstanding: every missing slot at once (at start, and for a worker lost
            # while serving, whose clients are waiting).
            for threads, cores in missing:
                self._spawned(pool.spawn(threads, cores, self.generation))
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
        self._spawned(pool.spawn(threads, cores, self.generation))

    def _spawned(self, worker: WorkerHandle) -> None:
        self._changed.add(worker.id)
        self._spawned_at[worker.id] = time.monotonic()

    def _adopt_live_workers(self) -> None:
        free = Counter(self._slots)
        leftovers: list[WorkerHandle] = []
        # Serving workers first: a parked worker is taken only for a slot no serving worker already has.
        for worker in sorted(self.pool.live(), key=lambda w: (w.parked_since is not None, w.id)):
            if self.pool.via(worker) is not self.pool.backend:
                continue  # another runtime's worker: it serves until this generation does, then is stopped
            if worker.pending is None and free[(worker.threads, worker.cores)] > 0:
                free[(worker.threads, worker.cores)] -= 1
                worker.generation = self.generation
                if worker.parked_since is not None:
                    worker.parked_since = None
                    self._changed.add(worker.id)
                    log.info("worker %d unparked: it has this plan's slot already", worker.id)
            elif worker.state is WorkerState.READY:
                leftovers.append(worker)
            else:
                # Still starting for an older plan: it will be retired once the new plan is served.
                continue
        remaining = [slot for slot in self._slots for _ in range(free[slot])]
        # Slots keep plan order; pair each with a worker that already has that many threads if possible.
        pairs: list[tuple[WorkerHandle, Slot]] = []
        for slot in list(remaining):
            match = next((w for w in leftovers if w.threads == slot[0]), None) or (leftovers[0] if leftovers else None)
            if match is None:
                break
            leftovers.remove(match)
            remaining.remove(slot)
            pairs.append((match, slot))
        self._deferred = []
        if remaining and pairs:
            self._deferred = pairs  # they serve the old plan as they are until the forks serve
            log.info("forking %d worker(s) first; %d worker(s) keep serving as they are until the forks serve, "
                     "then are re-threaded", len(remaining), len(pairs))  # fmt: skip
            return
        for worker, slot in pairs:
            self._rethread(worker, slot)

    def _rethread(self, worker: WorkerHandle, slot: Slot) -> None:
        self.pool.reconfigure(worker, slot[0], slot[1], self.generation)
        self._changed.add(worker.id)
        worker.parked_since = None
        log.info("re-threading worker %d in place: %d→%d thread(s) on cores %s",
                 worker.id, worker.threads, slot[0], list(slot[1]))  # fmt: skip

    def _rethread_when_forks_serve(self) -> None:
        """The deferred re-threads, once every fork of this generation serves (a dead one's slot is forked)."""
        if not self._deferred:
            return
        if any(w.state is not WorkerState.READY for w in self._mine()) or self._missing():
            return
        deferred, self._deferred = self._deferred, []
        for worker, slot in deferred:
            if worker.state is WorkerState.READY and worker.pending is None:
                self._rethread(worker, slot)

    def _time_forks(self) -> None:
        if not self._spawned_at:  # stamp each fork's time from spawn to ready (`fork_s`)
            return
        now = time.monotonic()
        for worker in self.pool.live():
            spawned = self._spawned_at.get(worker.id)
            if spawned is not None and worker.state is WorkerState.READY:
                self.fork_s = now - spawned
                del self._spawned_at[worker.id]
        live = {w.id for w in self.pool.live()}
        self._spawned_at = {wid: at for wid, at in self._spawned_at.items() if wid in live}

    def forks_needed(self, plan: Plan) -> list[int]:
        """The threads of each worker a switch to `plan` would fork (`forks_for`, the live workers of this template)."""
        mine = Counter(w.target for w in self.pool.live() if self.pool.via(w) is self.pool.backend)
        return forks_for(plan, self.allocator, mine)

    def _mine(self) -> list[WorkerHandle]:
        return [
            w
            for w in self.pool.live()
            if (w.pending is not None and w.pending[2] == self.generation)
            or (w.pending is None and w.generation == self.generation)
        ]

    def _missing(self) -> list[Slot]:
        have = Counter(w.target for w in self._mine())
        have.update(slot for worker, slot in self._deferred if worker.state is WorkerState.READY)  # re-threaded later
        missing = []
        for slot in self._slots:
            if have[slot]:
                have[slot] -= 1
            else:
                missing.append(slot)
        return missing

    def _ready_mine(self) -> list[WorkerHandle]:
        return [w for w in self._mine() if w.state is WorkerState.READY and w.pending is None]

    def _complete(self) -> bool:
        return Counter((w.threads, w.cores) for w in self._ready_mine()) == Counter(self._slots)
