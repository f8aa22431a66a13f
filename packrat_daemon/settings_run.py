"""The settings table, its second half: how the daemon plans, adapts, times out, reports and logs, and the Open
Inference Protocol gateway it starts. `packrat_daemon.config` assembles the table from `settings_served` and this.
"""

from __future__ import annotations

from packrat_daemon.settings import (
    BUDGET,
    COUNT,
    FRACTION,
    MARGIN,
    OPTIONAL_TEXT,
    PORT,
    POSITIVE_INT,
    SECONDS,
    SIZES,
    SWITCH,
    TEXT,
    WAIT,
    Kind,
    Setting,
    choice,
    exactly,
)
from policies.packrat import MIN_SPLIT_GAIN
from policies.planning.kernel_files import parse_cpulist

# The tuner re-plans only for a predicted gain this large: hysteresis, so that noise in the live
# batch sizes does not make the pool flap between two plans of nearly the same latency.
MIN_ADAPT_GAIN = 0.05


def _cpulist(text: str) -> str:
    """A non-empty cpulist, kept as written (start-up checks it against the machine's usable CPUs)."""
    if not parse_cpulist(text):
        raise ValueError(text)
    return text


CPULIST = Kind("a CPU list like 0-7 or 0,2,4", str | None, _cpulist, lambda value: _cpulist(exactly(str)(value)))

# The headings and the settings below each, in the docs' order (`settings.sectioned` files each under its heading).
RUN: tuple[str | Setting, ...] = (
    "Planning",
    Setting("policy", TEXT, "packrat", "packrat, single, torchserve, fixed, or an installed plug-in", reload="live"),
    Setting("plan", OPTIONAL_TEXT, None, "the plan for policy fixed, e.g. 2*1x8", unset="none", reload="live"),
    Setting(
        "cpus",
        CPULIST,
        None,
        "plan and pin on these CPUs only (a cpulist like 0-7 or 0,2,4): this model's share of a machine that "
        "serves others too; `packrat coordinate` moves it while serving (docs/colocation.md)",
        unset="every usable CPU",
        reload="restart",
    ),
    Setting(
        "profile",
        OPTIONAL_TEXT,
        None,
        "latency profile CSV; under runtime auto only the runtimes it has rows for are candidates",
        unset="the needed cells are measured at start",
        reload="live",
        reload_note='takes a restart under `runtime = "emulated"`, whose workers wait the profile they started with',
    ),
    Setting(
        "save_profile",
        OPTIONAL_TEXT,
        None,
        "write the profile measured at start to this CSV",
        unset="not written",
        reload="live",
    ),
    Setting("batches", SIZES, [], "batch sizes to plan for", unset="max_batch", reload="live"),
    Setting(
        "min_split_gain",
        FRACTION,
        MIN_SPLIT_GAIN,
        "packrat policy: serve several instances only if predicted this much faster than one (0: the exact optimum)",
        reload="live",
    ),
    Setting(
        "split_check_rounds",
        COUNT,
        5,
        "packrat policy: at start, run each split the plan makes against one "
        "instance this many interleaved rounds and plan on what was measured (0: off)",
        reload="restart",
    ),
    Setting(
        "profile_budget",
        BUDGET,
        "0.25",
        "without a profile, a large grid is measured by the adaptive (Bayesian) search within this "
        "budget: a fraction of the grid's cells like 0.25, or seconds like 300s (1: always the full grid); "
        "the plan's own cells are always measured (docs/profiling.md)",
        reload="restart",
    ),
    Setting(
        "state_dir",
        OPTIONAL_TEXT,
        None,
        "folder where what a start measured (each candidate's cells and verdict, the accuracy guard, "
        "production's timings, the plan) is kept across restarts, written atomically (docs/state.md); "
        "none: keep nothing, a restart measures again",
        unset="$STATE_DIRECTORY (systemd's StateDirectory=), else $XDG_STATE_HOME/packrat/MODEL or "
        "~/.local/state/packrat/MODEL",
        reload="restart",
    ),
    "Adaptation (packrat policy)",
    Setting(
        "adapt", SWITCH, True, "re-plan when the live batch sizes move and that is predicted to pay", reload="live"
    ),
    Setting("adapt_interval_s", SECONDS, 5.0, "how often the live batch sizes are looked at", reload="live"),
    Setting(
        "adapt_min_batches", POSITIVE_INT, 50, "batches seen since the last plan before re-planning", reload="live"
    ),
    Setting("adapt_cooldown_s", WAIT, 30.0, "least time in seconds between two re-plans", reload="live"),
    Setting("adapt_min_gain", FRACTION, MIN_ADAPT_GAIN, "predicted gain needed to re-plan", reload="live"),
    "Timeouts",
    Setting(
        "job_timeout_s",
        SECONDS,
        120.0,
        "a worker that has not answered its part of a batch for this long is replaced and the part sent to another "
        "(the bound when no prediction, the profile's or production's, says shorter)",
        reload="live",
    ),
    Setting(
        "slice_deadline_margin",
        MARGIN,
        # Generous by default: killing a worker that is merely slow (a noisy neighbour, a burst of load)
        # costs a fork, a warm-up and a re-run, and under load that cascades. bench/faults.py shows 1.5.
        3.0,
        "a part of a batch past this many times its predicted latency (the profile's, else production's; at least "
        "slice_deadline_floor_ms) has its worker watched: hung once it has used this many times the part's CPU "
        "time unanswered, its CPU time has stopped, or job_timeout_s has passed; it is then replaced and the part's "
        "requests run again each alone",
        reload="live",
    ),
    Setting(
        "slice_deadline_floor_ms",
        WAIT,
        1000.0,
        "the least time in milliseconds (and CPU time) a part of a batch is given before its worker is watched",
        reload="live",
    ),
    Setting(
        "slice_spin_floor_ms",
        WAIT,
        # Below slice_deadline_floor_ms: only a worker that computes without a pause is judged this early, and only by
        # the CPU it used; one that sleeps between bursts (waiting on something) keeps the deadline floor. 200 ms tells
        # a spin on a small model within the 1 s stall target (bench/faults.py --attack hanging_model).
        200.0,
        "from this many milliseconds (or slice_deadline_margin times the part's predicted latency, if later) a part "
        "of a batch is looked at every 0.1 s for a spin, before its deadline too: its worker is hung once a thread "
        "of it was on a CPU or waiting for one throughout a look (it never paused) and it has used "
        "slice_deadline_margin times the part's CPU time unanswered, at least this many milliseconds of CPU time",
        reload="live",
    ),
    Setting(
        "slice_hedge_margin",
        MARGIN,
        # A hedge kills nothing (the first answer is used, the other dropped), so it can come long before the
        # deadline that replaces a worker: a hung worker costs about this margin plus one slice.
        1.5,
        "a part of a batch not answered after this many times the profile's latency (at least "
        "slice_hedge_floor_ms) is also sent to an idle worker, and the first answer is used; "
        "at slice_deadline_margin or more, nothing is hedged",
        reload="live",
    ),
    Setting(
        "slice_hedge_floor_ms",
        WAIT,
        100.0,
        "the least time in milliseconds a part of a batch is given before it is hedged",
        reload="live",
    ),
    Setting(
        "drain_timeout_s",
        SECONDS,
        30.0,
        "on stop, the longest wait for queued requests to finish (keep it under systemd's TimeoutStopSec)",
        reload="live",
    ),
    Setting(
        "startup_timeout_s",
        SECONDS,
        600.0,
        "the longest wait for the model to load, and again for the workers "
        "to become ready (keep it under systemd's TimeoutStartSec)",
        reload="live",
    ),
    "Metrics and logs",
    Setting("metrics_port", PORT, 0, "serve Prometheus metrics on this port (0: off)", reload="live"),
    Setting("metrics_address", TEXT, "127.0.0.1", "address of the metrics endpoint", reload="live"),
    Setting(
        "log_level",
        choice("debug", "info", "warning", "error"),
        "info",
        "show log lines of this level and above",
        reload="live",
    ),
    Setting(
        "log_format",
        choice("text", "json"),
        "text",
        "text: one line per record for people; json: one JSON object per line for log shippers",
        reload="live",
    ),
    "Open Inference Protocol (docs/oip.md)",
    Setting(
        "http_port", PORT, 0, "serve KServe v2 / Triton REST on this port, beside ZeroMQ (0: off)", reload="restart"
    ),
    Setting("grpc_port", PORT, 0, "serve KServe v2 / Triton gRPC on this port (0: off)", reload="restart"),
    Setting(
        "oip_address",
        TEXT,
        "127.0.0.1",
        "where REST and gRPC bind; beyond loopback only with oip_tls_cert (or insecure_public)",
        reload="restart",
    ),
    Setting(
        "oip_model_name",
        OPTIONAL_TEXT,
        None,
        "the model's name in the protocol's URLs and calls",
        unset="from the model spec: builtin:resnet50 → resnet50, /mnt/models/model.pt2 → model",
        reload="restart",
    ),
    Setting("oip_tls_cert", OPTIONAL_TEXT, None, "PEM certificate: TLS for REST, gRPC", unset="none", reload="restart"),
    Setting("oip_tls_key", OPTIONAL_TEXT, None, "PEM private key of oip_tls_cert", unset="none", reload="restart"),
    Setting(
        "oip_limits",
        OPTIONAL_TEXT,
        None,
        "REST's limits changed from their defaults, NAME=VALUE,... (e.g. max_connections=2000; docs/oip.md, Limits)",
        unset="the defaults",
        reload="restart",
    ),  # fmt: skip
    Setting(
        "oip_metrics_port",
        PORT,
        0,
        "the gateway's own metrics on this port too (they are at /metrics on http_port; for a gRPC-only gateway)",
        reload="restart",
    ),  # fmt: skip
)
