"""A reload (SIGHUP), in one place and in order: `reload` re-reads the configuration, re-checks it against the
running one (`accept`), re-plans (`replan`), hands each changed live setting to the object that uses it
(`apply`), and hands the new configuration and plan over to the daemon, which switches to the plan.

Each setting declares in the table (`packrat_daemon.config`) whether a reload may change it. `accept` puts
back the running value of each restart-only setting that changed and logs that it waits for a restart;
`apply` hands each changed live setting to its owner (`OWNERS`) and logs it. The planning and adaptation
settings take effect through the new plan and the tuner rebuilt from the new configuration.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from packrat_daemon.config import RESTART_ONLY, SETTINGS, ServeConfig
from packrat_daemon.ops.logs import setup_logging
from packrat_daemon.ops.notify import READY, reloading, sd_notify
from packrat_daemon.requests.timing import Deadlines
from packrat_daemon.settings import toml_text
from packrat_daemon.startup.context import distribution_for, policy_for, read_profile
from packrat_daemon.wire.errors import PackratError
from policies.base import Plan, Policy
from policies.planning.profile import Profile
from policies.planning.topology import Topology
from workers.models.spec import EMULATED

if TYPE_CHECKING:
    from packrat_daemon.measure.profiling import ProfileFile
    from packrat_daemon.ops.metrics import Metrics
    from packrat_daemon.ops.notify import Watchdog
    from packrat_daemon.requests.batcher import Batcher
    from packrat_daemon.requests.dispatcher import Dispatcher

log = logging.getLogger("packrat.daemon")


@dataclass(frozen=True)
class Replanned:
    """A reload's outcome: the configuration in force from now on and the plan for it."""

    config: ServeConfig
    policy: Policy
    profile: Profile | None
    plan: Plan


@dataclass(frozen=True)
class Serving:
    """The daemon's side of a reload: what it serves now, where its configuration is read from, and what takes
    the outcome (the daemon keeps the new configuration, policy and profile, switches to the plan, rebuilds its
    tuner)."""

    config: ServeConfig
    runtime: str
    profile: Profile | None
    topology: Topology
    read_config: Callable[[], ServeConfig]
    hand_over: Callable[[Replanned], None]


def reload(serving: Serving, owners: Owners) -> Replanned | None:
    """SIGHUP: re-read, re-check, re-plan, apply the live settings, hand the plan over. A configuration that
    cannot be read or planned (PackratError) changes nothing: logged, and the daemon serves on. Returns the
    outcome handed over, or None."""
    sd_notify(reloading())
    running = serving.config
    try:
        fresh = serving.read_config()
        new = replan(running, fresh, serving.runtime, serving.profile, serving.topology)  # accept(), then plan
    except PackratError as exc:
        log.error("reload failed, still serving the current plan: %s", exc)
        sd_notify(READY)
        return None
    apply(running, new.config, owners)  # each changed live setting to the object that uses it, logged
    log.info("reload: plan %s — %s", new.plan.describe(), new.plan.reason)
    serving.hand_over(new)
    sd_notify(READY)
    return new


def replan(
    running: ServeConfig, fresh: ServeConfig, runtime: str, profile: Profile | None, topology: Topology
) -> Replanned:
    """`fresh`, less what takes a restart (`accept`, logged), with the profile re-read and a new plan.

    Raises PackratError when the new configuration cannot be planned; the caller keeps serving.
    """
    accept(running, fresh, runtime)
    policy = policy_for(fresh)
    if fresh.profile:
        profile = read_profile(fresh.profile, runtime, profile.precision if profile is not None else "fp32")
    return Replanned(fresh, policy, profile, policy.plan(profile, topology, distribution_for(fresh)))


@dataclass(frozen=True)
class Change:
    name: str
    old: Any
    new: Any

    def __str__(self) -> str:
        return f"{self.name} {toml_text(self.old)} → {toml_text(self.new)}"


def changes(old: ServeConfig, new: ServeConfig) -> list[Change]:
    """Every setting whose value differs, in the table's order."""
    found = [Change(s.name, getattr(old, s.name), getattr(new, s.name)) for s in SETTINGS]
    return [change for change in found if change.old != change.new]


def accept(running: ServeConfig, fresh: ServeConfig, runtime: str) -> list[Change]:
    """Make `fresh` what a running daemon can take: each restart-only setting that changed back at its running
    value, `max_batch` no larger, an emulated daemon's profile as it started. Returns the changes kept back."""
    kept = []
    for change in changes(running, fresh):
        if change.name in RESTART_ONLY:
            log.warning("reload: %s changed; that takes a restart, the running value %s stays until then",
                        change.name, toml_text(change.old))  # fmt: skip
        elif change.name == "max_batch" and change.new > change.old:
            log.warning("reload: max_batch can only shrink without a restart; keeping %d", change.old)
        elif change.name == "profile" and runtime == EMULATED:
            log.warning("reload: the emulated workers wait the profile they started with; a new one takes a restart")
        else:
            continue
        setattr(fresh, change.name, change.old)
        kept.append(change)
    return kept


@dataclass(frozen=True)
class Owners:
    """The objects a reload reconfigures, each through one small call (`APPLY`)."""

    batcher: Batcher
    dispatcher: Dispatcher
    watchdog: Watchdog
    metrics: Metrics
    profiles: ProfileFile


def _batcher(owners: Owners, c: ServeConfig) -> None:
    owners.batcher.configure(c.max_batch, c.max_delay_ms / 1000.0, c.max_queue)


def _dispatcher(owners: Owners, c: ServeConfig) -> None:
    owners.dispatcher.set_deadlines(Deadlines.from_config(c))  # the six settings, read in one place


def _watchdog(owners: Owners, c: ServeConfig) -> None:
    owners.watchdog.off_plan_bound_s = c.startup_timeout_s  # the workers' time to become ready, after start too


def _metrics(owners: Owners, c: ServeConfig) -> None:
    owners.metrics.rebind(c.metrics_port, c.metrics_address)


def _logging(owners: Owners, c: ServeConfig) -> None:
    setup_logging(c.log_level, c.log_format)


def _profiles(owners: Owners, c: ServeConfig) -> None:
    owners.profiles.path = c.save_profile  # where the production timings are written at stop


Apply = Callable[[Owners, ServeConfig], None]
DEADLINES = (
    "job_timeout_s",
    "slice_deadline_margin",
    "slice_deadline_floor_ms",
    "slice_spin_floor_ms",
    "slice_hedge_margin",
    "slice_hedge_floor_ms",
)

# Where each live setting takes effect: an owner's call (run once when any of its settings changed), or None
# where the daemon itself does it on every reload (it re-plans and rebuilds the tuner from the new
# configuration) or reads the configuration in force when it needs the value (drain_timeout_s, at stop).
OWNERS: dict[str, tuple[Apply | None, tuple[str, ...]]] = {
    "batcher": (_batcher, ("max_batch", "max_delay_ms", "max_queue")),
    "dispatcher": (_dispatcher, DEADLINES),
    "watchdog": (_watchdog, ("startup_timeout_s",)),
    "metrics": (_metrics, ("metrics_port", "metrics_address")),
    "profile file": (_profiles, ("save_profile",)),
    "plan": (None, ("policy", "plan", "profile", "batches", "min_split_gain")),
    "adaptation": (None, ("adapt", "adapt_interval_s", "adapt_min_batches", "adapt_cooldown_s", "adapt_min_gain")),
    "stop": (None, ("drain_timeout_s",)),
    "logging": (_logging, ("log_level", "log_format")),  # last: the reload's other lines in the format they began in
}


def apply(old: ServeConfig, new: ServeConfig, owners: Owners) -> list[Change]:
    """Hand each changed live setting to its owner and log it. An owner that refuses a value (PackratError: a
    metrics port in use) keeps its old ones, which are put back into `new`. Returns the changes applied."""
    changed = {change.name: change for change in changes(old, new)}
    applied = []
    for owner, (call, names) in OWNERS.items():
        mine = [changed[name] for name in names if name in changed]
        if not mine:
            continue
        try:
            if call is not None:
                call(owners, new)
        except PackratError as exc:
            for change in mine:
                setattr(new, change.name, change.old)
            log.error("reload: %s not applied (%s keeps its old values): %s",
                      ", ".join(map(str, mine)), owner, exc)  # fmt: skip
            continue
        applied += mine
        log.info("reload: %s (%s)", ", ".join(map(str, mine)), owner)
    return applied
