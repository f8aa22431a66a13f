"""The daemon's configuration: every `serve` setting declared once, in `SETTINGS`.

Each `Setting` (`packrat_daemon.settings`) carries its name (the TOML key; the flag is the name with dashes),
its `Kind` (type and allowed values), its default, its help, a docs section, and what a reload does with a
new value (`reload=`). From that one table come the `serve` options (`packrat_daemon.commands.options`),
the checks on TOML values, the `ServeConfig` the daemon receives (`load_config`, also on SIGHUP), the
settings a reload keeps until a restart (`RESTART_ONLY`) and `docs/configuration.md`
(`python -m packrat_daemon.config > docs/configuration.md`; `--restart-sentence`: the README's sentence).
"""

from __future__ import annotations

import copy
import sys
from collections.abc import Mapping
from dataclasses import field, make_dataclass
from typing import TYPE_CHECKING, Any

from packrat_daemon.measure.accuracy import DEFAULT_MAX_REL_ERROR, TOP1_CHOICES
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
    integer,
    markdown,
    number,
    read_toml,
    restart_sentence,
    sectioned,
)
from policies.packrat import MIN_SPLIT_GAIN
from policies.planning.kernel_files import parse_cpulist
from workers.models.spec import PRECISION_CHOICES

# auto by default: the accuracy guard, not the user, decides whether a reduced precision is served, and it
# leaves one out where it fails (or where the CPU flags show no units for it). Whether bf16 pays is measured
# here at start on this CPU, never assumed: with AMX it served ResNet-50 about 4x faster than fp32, without
# AMX it measured no faster, and either way what the first start measured is kept in the state directory, so
# only the first start pays for the extra candidates. int8 is never chosen by auto (it needs --calibration
# on the user's own data); --precision fp32 pins fp32.
DEFAULT_PRECISION = "auto"
DEFAULT_RUNTIME = "auto"  # every installed runtime is measured and the fastest served, under the same rule

# The tuner re-plans only for a predicted gain this large: hysteresis, so that noise in the live
# batch sizes does not make the pool flap between two plans of nearly the same latency.
MIN_ADAPT_GAIN = 0.05


def _cpulist(text: str) -> str:
    """A non-empty cpulist, kept as written (start-up checks it against the machine's usable CPUs)."""
    if not parse_cpulist(text):
        raise ValueError(text)
    return text


CPULIST = Kind("a CPU list like 0-7 or 0,2,4", str | None, _cpulist, lambda value: _cpulist(exactly(str)(value)))

SETTINGS: tuple[Setting, ...] = sectioned(
    "Model",
    Setting(
        "model",
        TEXT,
        "builtin:resnet50",
        "model spec: builtin:NAME, a .pt2, .pt or .onnx file, a Hugging Face folder (hf:DIR), or module:function",
        reload="restart",
    ),
    Setting(
        "input",
        OPTIONAL_TEXT,
        None,
        "input of a model file that does not declare it, e.g. float32:3x224x224",
        unset="declared by the model",
        reload="restart",
    ),
    Setting(
        "runtime",
        TEXT,
        DEFAULT_RUNTIME,
        "auto: measure each installed runtime (serve then serves the fastest); torch, onnxruntime or openvino "
        "pins one; "
        "emulated: workers that compute nothing and wait the --profile's latencies (docs/emulation.md)",
        reload="restart",
    ),
    Setting(
        "emulate_cores",
        integer("a positive integer", lambda value: value >= 1, optional=True),
        None,
        "runtime emulated: plan for this many made-up cores; the workers run unpinned",
        unset="this machine's cores",
        reload="restart",
    ),
    Setting(
        "emulate_interference",
        OPTIONAL_TEXT,
        None,
        "runtime emulated: none, default, auto (the model's own, measured side by side on this machine "
        "once and cached), a number F (the slow-down with every core busy, linear in the cores busy), or a "
        "CSV of busy_cores,factor rows: how much slower each call waits while that many cores are busy",
        unset="default (fitted to Inception-v3 side by side on 16 cores)",
        reload="restart",
    ),
    Setting(
        "precision",
        choice(*PRECISION_CHOICES),
        DEFAULT_PRECISION,
        "auto: also measure bf16 where the CPU has bf16 units and the accuracy guard passes, and serve the "
        "fastest; fp32 pins fp32; bf16 (under the guard); int8 (runtime openvino, quantized on --calibration; "
        "never chosen by auto)",
        reload="restart",
    ),
    Setting(
        "first_answer",
        TEXT,
        "auto",
        "auto: with several runtime candidates to measure, the first one (fp32, no conversion) answers at once on "
        "a plan that needs no profile while every candidate is measured in the background at a lower priority, "
        "and the daemon switches, with no failed request, to the one measured fastest (docs/precision.md); off: "
        "measure every candidate before answering; torch, onnxruntime or openvino: that runtime at fp32 answers "
        "first, whether or not it is a candidate",
        reload="restart",
    ),
    Setting(
        "max_rel_error",
        number("a number above 0, e.g. 0.05", lambda value: value > 0),
        DEFAULT_MAX_REL_ERROR,
        "accuracy guard: the largest relative error a reduced precision may show against fp32 "
        "(classifiers must also keep every input's top-1 class)",
        reload="restart",
    ),
    Setting(
        "calibration",
        OPTIONAL_TEXT,
        None,
        "accuracy guard: a .npy file of your own inputs (N x the model's input) checked besides the samples; "
        "int8 is quantized on them",
        unset="sample inputs only",
        reload="restart",
    ),
    Setting(
        "accuracy_top1",
        choice(*TOP1_CHOICES),
        "auto",
        "accuracy guard: hold the output to top-1 agreement (class scores): on, off, or auto: a 2-D output "
        "of probabilities or of scores not all within [-1, 1] (embeddings stay within it)",
        reload="restart",
    ),
    Setting("allocator", choice("system", "jemalloc", "tcmalloc"), "system", "malloc to preload", reload="restart"),
    Setting(
        "emulate_measure",
        SWITCH,
        False,
        "runtime emulated: measure the start-up profile on the emulated workers, as a daemon without a "
        "profile does, instead of planning on the profile they wait",
        reload="restart",
    ),
    "Serving",
    Setting("endpoint", TEXT, "tcp://127.0.0.1:5555", "where clients connect (tcp:// or ipc://)", reload="restart"),
    Setting(
        "server_key",
        OPTIONAL_TEXT,
        None,
        "the daemon's CURVE key pair, the .key_secret file of `packrat keygen`: clients must then encrypt "
        "and present a key listed in allowed_clients (docs/security.md)",
        unset="none: plaintext",
        reload="restart",
    ),
    Setting(
        "allowed_clients",
        OPTIONAL_TEXT,
        None,
        "with server_key: the folder of the public .key files of the clients that may connect; "
        "re-read when a file is added or removed",
        unset="none",
        reload="restart",
    ),
    Setting(
        "insecure_public",
        SWITCH,
        False,
        "serve plaintext on an endpoint beyond loopback and ipc (refused otherwise): anyone who reaches it "
        "may use the model",
        reload="restart",
    ),
    Setting(
        "max_batch",
        POSITIVE_INT,
        16,
        "most inputs in one batch",
        reload="live",
        reload_note="can only shrink without a restart",
    ),
    Setting("max_delay_ms", WAIT, 1.0, "longest wait in milliseconds to fill a batch", reload="live"),
    Setting("max_queue", POSITIVE_INT, 1024, "inputs that may wait, across requests", reload="live"),
    Setting(
        "run_dir",
        OPTIONAL_TEXT,
        None,
        "folder for the internal ipc sockets",
        unset="a private temp folder",
        reload="restart",
    ),
    Setting(
        "control",
        OPTIONAL_TEXT,
        None,
        "the endpoint `packrat reconfigure` talks to: ipc://PATH in a folder only this user may enter, or "
        "tcp on loopback; never the serving endpoint (docs/status.md)",
        unset="ipc://RUN_DIR/control.ipc, logged at start",
        reload="restart",
    ),
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
BY_NAME: dict[str, Setting] = {setting.name: setting for setting in SETTINGS}

# What a reload keeps at its running value, logging that the new one waits for a restart (packrat_daemon.reload).
RESTART_ONLY: tuple[str, ...] = tuple(setting.name for setting in SETTINGS if setting.reload == "restart")


def _field(setting: Setting) -> tuple[str, Any, Any]:
    default = setting.default
    made = field(default_factory=lambda: list(default)) if isinstance(default, list) else field(default=default)
    return setting.name, setting.kind.type, made


# The daemon's configuration: one attribute per setting, with the table's default (tests build it
# directly, e.g. ServeConfig(model="builtin:tiny-mlp", max_batch=4)).
if TYPE_CHECKING:  # a type checker cannot see make_dataclass's fields: to it, every setting is Any

    class ServeConfig:
        def __init__(self, **settings: Any) -> None: ...
        def __getattr__(self, name: str) -> Any: ...
        def __setattr__(self, name: str, value: Any) -> None: ...

else:
    ServeConfig = make_dataclass("ServeConfig", [_field(s) for s in SETTINGS], namespace={"__module__": __name__})


def load_config(flags: Mapping[str, Any], path: str | None) -> ServeConfig:
    """The ServeConfig of the defaults, then the TOML file at `path`, then the flags typed (they win)."""
    values = read_toml(path, BY_NAME) if path else {}
    values.update(copy.deepcopy(dict(flags)))  # each reload gets its own lists
    return ServeConfig(**values)


if __name__ == "__main__":
    if sys.argv[1:] == ["--restart-sentence"]:  # README.md quotes it; tests/packrat_daemon/test_config.py checks
        sys.stdout.write(restart_sentence(SETTINGS) + "\n")
    else:
        sys.stdout.write(markdown(SETTINGS))
