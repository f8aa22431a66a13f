"""The daemon's configuration: every `serve` setting declared once, in `SETTINGS`.

Each `Setting` carries its name (the TOML key; the flag is the name with dashes), its `Kind` (type and
allowed values), its default, its help and a docs section. From that one table come the `serve` options
(`packrat_daemon.commands.options.add_settings`), the checks on TOML values (`read_toml`), the
`ServeConfig` the daemon receives (`load_config`, also on SIGHUP) and `docs/configuration.md`
(`python -m packrat_daemon.config > docs/configuration.md`).

The module runs past 400 lines because the table is the point: every setting is declared here once, and
splitting the table across modules would scatter the one place a reader looks for an option.
"""

from __future__ import annotations

import copy
import json
import math
import sys
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, make_dataclass
from typing import Any

from packrat_daemon.measure.accuracy import DEFAULT_MAX_REL_ERROR, TOP1_CHOICES
from packrat_daemon.wire.errors import ConfigError, ProfileError
from policies.packrat import MIN_SPLIT_GAIN
from workers.models.spec import PRECISION_CHOICES

# fp32 by default, decided by bench/precision.py (bench/README.md, docs/precision.md): with the default runtime
# (torch), bf16 measured no faster than fp32 on a CPU with avx512_bf16 but no AMX, so `auto` would double
# start-up's profiling to serve fp32 anyway; and the guard's own inputs are random samples, so a reduced
# precision is better the user's choice, made with --calibration on their own data.
DEFAULT_PRECISION = "fp32"

# The tuner re-plans only for a predicted gain this large: hysteresis, so that noise in the live
# batch sizes does not make the pool flap between two plans of nearly the same latency.
MIN_ADAPT_GAIN = 0.05


@dataclass(frozen=True)
class Kind:
    """What a setting accepts: its type, how a flag's text and a TOML value become one, and its range."""

    words: str  # what is allowed, in words: error messages and the docs quote it
    type: Any  # the annotation of the ServeConfig attribute
    from_text: Callable[[str], Any]  # a flag's text → value; ValueError when malformed
    from_toml: Callable[[object], Any]  # a TOML value → value; ValueError when of another type
    allowed: Callable[[Any], bool] = lambda value: True
    choices: tuple[str, ...] | None = None

    def parse_text(self, text: str) -> Any:
        """The value of a flag's text; ValueError naming the text and what is allowed."""
        value = self._value(self.from_text, text)
        if value is None:
            raise ValueError(f"expected {self.words}, got {text!r}")
        return value

    def parse_toml(self, key: str, value: object, source: str) -> Any:
        """The value of `key = value` in the TOML file `source`; ConfigError naming all three."""
        checked = self._value(self.from_toml, value)
        if checked is None:
            raise ConfigError(f"{source}: {key} = {toml_text(value)} is not allowed; expected {self.words}")
        return checked

    def _value(self, convert: Callable[[Any], Any], raw: object) -> Any:
        """convert(raw) if that works and is allowed, else None (no setting takes None as a value)."""
        try:
            value = convert(raw)
        except (ValueError, KeyError):
            return None
        return value if self.allowed(value) else None


def _exactly(cls: type) -> Callable[[object], Any]:
    """A TOML value of exactly this type (TOML's true is not the integer 1; an integer is a float)."""

    def convert(value: object) -> Any:
        if isinstance(value, bool) is not (cls is bool):
            raise ValueError(value)
        if cls is float and isinstance(value, int):
            return float(value)
        if not isinstance(value, cls):
            raise ValueError(value)
        return value

    return convert


def _integer(words: str, allowed: Callable[[int], bool]) -> Kind:
    return Kind(words, int, int, _exactly(int), allowed)


def _number(words: str, allowed: Callable[[float], bool]) -> Kind:
    return Kind(words, float, float, _exactly(float), lambda value: math.isfinite(value) and allowed(value))


def _text(words: str, optional: bool) -> Kind:
    return Kind(words, str | None if optional else str, str, _exactly(str))


def _choice(*options: str) -> Kind:
    return Kind(f"one of {', '.join(options)}", str, str, _exactly(str), lambda v: v in options, options)


def _sizes_from_text(text: str) -> list[int]:
    """'1,2,4' or '1-4' or '1,2,8-16' → sorted unique ints."""
    values: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        if "-" in part:
            low, high = (int(x) for x in part.split("-", 1))
            values.update(range(low, high + 1))
        elif part:
            values.add(int(part))
    return sorted(values)


def _sizes_from_toml(value: object) -> list[int]:
    if isinstance(value, str):
        return _sizes_from_text(value)
    if not isinstance(value, list):
        raise ValueError(value)
    return sorted({_exactly(int)(item) for item in value})


def _budget_from_toml(value: object) -> str:
    """A TOML budget: a number (0.25) or a string ("0.25", "300s")."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    return _exactly(str)(value)


def _budget_allowed(text: str) -> bool:
    from packrat_daemon.search.budget import Budget  # the one home of the budget's syntax (no scikit-optimize)

    try:
        Budget.parse(text)
    except ProfileError:
        return False
    return True


POSITIVE_INT = _integer("a positive integer", lambda value: value >= 1)
COUNT = _integer("an integer, 0 or more", lambda value: value >= 0)
PORT = _integer("a port number from 0 to 65535", lambda value: 0 <= value <= 65535)
SECONDS = _number("a number of seconds above 0", lambda value: value > 0)
WAIT = _number("a number, 0 or more", lambda value: value >= 0)
FRACTION = _number("a fraction from 0 up to (not including) 1, e.g. 0.05 for 5%", lambda value: 0 <= value < 1)
TEXT = _text("a string", optional=False)
OPTIONAL_TEXT = _text("a string", optional=True)
SWITCH = Kind("true or false", bool, lambda text: {"true": True, "false": False}[text], _exactly(bool))
BUDGET = Kind(
    'a fraction of the grid in (0, 1] like 0.25, or seconds like "300s"', str, str, _budget_from_toml, _budget_allowed
)
SIZES = Kind(
    'positive integers: "1,4,8", "1-8" or a list [1, 4, 8]',
    list[int],
    _sizes_from_text,
    _sizes_from_toml,
    lambda values: bool(values) and min(values) >= 1,
)


@dataclass(frozen=True)
class Setting:
    """One `serve` setting. The help of a true/false setting says what `true` does."""

    name: str  # TOML key and ServeConfig attribute; the flag is --name-with-dashes (--no-name for a true switch)
    kind: Kind
    default: Any
    help: str
    section: str
    unset: str = ""  # what an absent setting whose default is empty means, for help and docs

    @property
    def flag(self) -> str:
        dashed = self.name.replace("_", "-")
        return f"--no-{dashed}" if self.kind is SWITCH and self.default else f"--{dashed}"

    def default_text(self) -> str:
        if self.unset:
            return self.unset
        if self.kind is SWITCH:
            return "on" if self.default else "off"
        return toml_text(self.default)

    def describe(self) -> str:
        """The help with its default, as `--help` shows it."""
        return f"{self.help} (default: {self.default_text()})"


MODEL, SERVING, PLANNING, ADAPTATION, TIMEOUTS, OBSERVING = (
    "Model",
    "Serving",
    "Planning",
    "Adaptation (packrat policy)",
    "Timeouts",
    "Metrics and logs",
)

SETTINGS: tuple[Setting, ...] = (
    Setting(
        "model", TEXT, "builtin:resnet50", "model spec: builtin:NAME, a .pt2 or .pt file, or module:function", MODEL
    ),
    Setting(
        "input",
        OPTIONAL_TEXT,
        None,
        "input of a model file that does not declare it, e.g. float32:3x224x224",
        MODEL,
        unset="declared by the model",
    ),
    Setting(
        "runtime",
        TEXT,
        "torch",
        "torch, onnxruntime, openvino, or auto: measure each installed one (serve then serves the fastest); "
        "emulated: workers that compute nothing and wait the --profile's latencies (docs/emulation.md)",
        MODEL,
    ),
    Setting(
        "emulate_cores",
        Kind("a positive integer", int | None, int, _exactly(int), lambda value: value >= 1),
        None,
        "runtime emulated: plan for this many made-up cores; the workers run unpinned",
        MODEL,
        unset="this machine's cores",
    ),
    Setting(
        "emulate_interference",
        OPTIONAL_TEXT,
        None,
        "runtime emulated: none, default, or a CSV of busy_cores,factor rows: how much slower each call "
        "waits while that many cores are busy",
        MODEL,
        unset="default (fitted to Inception-v3 side by side on 16 cores)",
    ),
    Setting(
        "precision",
        _choice(*PRECISION_CHOICES),
        DEFAULT_PRECISION,
        "fp32, bf16 (under the accuracy guard), or auto: also measure bf16 where the CPU has bf16 units and "
        "the guard passes, and serve the fastest; int8 (runtime openvino, quantized on --calibration; "
        "never chosen by auto)",
        MODEL,
    ),
    Setting(
        "max_rel_error",
        _number("a number above 0, e.g. 0.05", lambda value: value > 0),
        DEFAULT_MAX_REL_ERROR,
        "accuracy guard: the largest relative error a reduced precision may show against fp32 "
        "(classifiers must also keep every input's top-1 class)",
        MODEL,
    ),
    Setting(
        "calibration",
        OPTIONAL_TEXT,
        None,
        "accuracy guard: a .npy file of your own inputs (N x the model's input) checked besides the samples; "
        "int8 is quantized on them",
        MODEL,
        unset="sample inputs only",
    ),
    Setting(
        "accuracy_top1",
        _choice(*TOP1_CHOICES),
        "auto",
        "accuracy guard: hold the output to top-1 agreement (class scores): on, off, or auto: a 2-D output "
        "of probabilities or of scores not all within [-1, 1] (embeddings stay within it)",
        MODEL,
    ),
    Setting("allocator", _choice("system", "jemalloc", "tcmalloc"), "system", "malloc to preload", MODEL),
    Setting("endpoint", TEXT, "tcp://127.0.0.1:5555", "where clients connect (tcp:// or ipc://)", SERVING),
    Setting(
        "server_key",
        OPTIONAL_TEXT,
        None,
        "the daemon's CURVE key pair, the .key_secret file of `packrat keygen`: clients must then encrypt "
        "and present a key listed in allowed_clients (docs/security.md)",
        SERVING,
        unset="none: plaintext",
    ),
    Setting(
        "allowed_clients",
        OPTIONAL_TEXT,
        None,
        "with server_key: the folder of the public .key files of the clients that may connect; "
        "re-read when a file is added or removed",
        SERVING,
        unset="none",
    ),
    Setting(
        "insecure_public",
        SWITCH,
        False,
        "serve plaintext on an endpoint beyond loopback and ipc (refused otherwise): anyone who reaches it "
        "may use the model",
        SERVING,
    ),
    Setting("max_batch", POSITIVE_INT, 16, "most inputs in one batch", SERVING),
    Setting("max_delay_ms", WAIT, 1.0, "longest wait in milliseconds to fill a batch", SERVING),
    Setting("max_queue", POSITIVE_INT, 1024, "inputs that may wait, across requests", SERVING),
    Setting(
        "run_dir", OPTIONAL_TEXT, None, "folder for the internal ipc sockets", SERVING, unset="a private temp folder"
    ),
    Setting(
        "control",
        OPTIONAL_TEXT,
        None,
        "the endpoint `packrat reconfigure` talks to: ipc://PATH in a folder only this user may enter, or "
        "tcp on loopback; never the serving endpoint (docs/status.md)",
        SERVING,
        unset="ipc://RUN_DIR/control.ipc, logged at start",
    ),
    Setting("policy", TEXT, "packrat", "packrat, single, torchserve, fixed, or an installed plug-in", PLANNING),
    Setting("plan", OPTIONAL_TEXT, None, "the plan for policy fixed, e.g. 2*1x8", PLANNING, unset="none"),
    Setting(
        "profile", OPTIONAL_TEXT, None, "latency profile CSV", PLANNING, unset="the needed cells are measured at start"
    ),
    Setting(
        "save_profile",
        OPTIONAL_TEXT,
        None,
        "write the profile measured at start to this CSV",
        PLANNING,
        unset="not written",
    ),
    Setting("batches", SIZES, [], "batch sizes to plan for", PLANNING, unset="max_batch"),
    Setting(
        "min_split_gain",
        FRACTION,
        MIN_SPLIT_GAIN,
        "packrat policy: serve several instances only if predicted this much faster than one (0: the exact optimum)",
        PLANNING,
    ),
    Setting(
        "split_check_rounds",
        COUNT,
        5,
        "packrat policy: at start, run each split the plan makes against one "
        "instance this many interleaved rounds and plan on what was measured (0: off)",
        PLANNING,
    ),
    Setting(
        "profile_budget",
        BUDGET,
        "0.25",
        "without a profile, a large grid is measured by the adaptive (Bayesian) search within this "
        "budget: a fraction of the grid's cells like 0.25, or seconds like 300s (1: always the full grid); "
        "the plan's own cells are always measured (docs/profiling.md)",
        PLANNING,
    ),
    Setting(
        "state_dir",
        OPTIONAL_TEXT,
        None,
        "folder where the learned profile (cells measured at start, production's timings, the plan) is kept "
        "across restarts, written atomically (docs/state.md); systemd's StateDirectory= gives one",
        PLANNING,
        unset="none: a restart measures again",
    ),
    Setting(
        "emulate_measure",
        SWITCH,
        False,
        "runtime emulated: measure the start-up profile on the emulated workers, as a daemon without a "
        "profile does, instead of planning on the profile they wait",
        MODEL,
    ),
    Setting("adapt", SWITCH, True, "re-plan when the live batch sizes move and that is predicted to pay", ADAPTATION),
    Setting("adapt_interval_s", SECONDS, 5.0, "how often the live batch sizes are looked at", ADAPTATION),
    Setting("adapt_min_batches", POSITIVE_INT, 50, "batches seen since the last plan before re-planning", ADAPTATION),
    Setting("adapt_cooldown_s", WAIT, 30.0, "least time in seconds between two re-plans", ADAPTATION),
    Setting("adapt_min_gain", FRACTION, MIN_ADAPT_GAIN, "predicted gain needed to re-plan", ADAPTATION),
    Setting(
        "job_timeout_s",
        SECONDS,
        120.0,
        "a worker that has not answered its part of a batch for this long is replaced and the part sent to another "
        "(the bound when the profile predicts nothing shorter)",
        TIMEOUTS,
    ),
    Setting(
        "slice_deadline_margin",
        _number("a number, 1 or more", lambda value: value >= 1),
        # Generous by default: killing a worker that is merely slow (a noisy neighbour, a burst of load)
        # costs a fork, a warm-up and a re-run, and under load that cascades. bench/faults.py shows 1.5.
        3.0,
        "a worker is presumed hung once its part of a batch takes this many times the profile's latency "
        "(at least slice_deadline_floor_ms, at most job_timeout_s): it is replaced and the part sent to another",
        TIMEOUTS,
    ),
    Setting(
        "slice_deadline_floor_ms",
        WAIT,
        1000.0,
        "the least time in milliseconds a part of a batch is given before its worker is presumed hung",
        TIMEOUTS,
    ),
    Setting(
        "slice_hedge_margin",
        _number("a number, 1 or more", lambda value: value >= 1),
        # A hedge kills nothing (the first answer is used, the other dropped), so it can come long before the
        # deadline that replaces a worker: a hung worker costs about this margin plus one slice.
        1.5,
        "a part of a batch not answered after this many times the profile's latency (at least "
        "slice_hedge_floor_ms) is also sent to an idle worker, and the first answer is used; "
        "at slice_deadline_margin or more, nothing is hedged",
        TIMEOUTS,
    ),
    Setting(
        "slice_hedge_floor_ms",
        WAIT,
        100.0,
        "the least time in milliseconds a part of a batch is given before it is hedged",
        TIMEOUTS,
    ),
    Setting(
        "drain_timeout_s",
        SECONDS,
        30.0,
        "on stop, the longest wait for queued requests to finish (keep it under systemd's TimeoutStopSec)",
        TIMEOUTS,
    ),
    Setting(
        "startup_timeout_s",
        SECONDS,
        600.0,
        "the longest wait for the model to load, and again for the workers "
        "to become ready (keep it under systemd's TimeoutStartSec)",
        TIMEOUTS,
    ),
    Setting("metrics_port", PORT, 0, "serve Prometheus metrics on this port (0: off)", OBSERVING),
    Setting("metrics_address", TEXT, "127.0.0.1", "address of the metrics endpoint", OBSERVING),
    Setting(
        "log_level",
        _choice("debug", "info", "warning", "error"),
        "info",
        "show log lines of this level and above",
        OBSERVING,
    ),
    Setting(
        "log_format",
        _choice("text", "json"),
        "text",
        "text: one line per record for people; json: one JSON object per line for log shippers",
        OBSERVING,
    ),
)
BY_NAME: dict[str, Setting] = {setting.name: setting for setting in SETTINGS}


def _field(setting: Setting) -> tuple[str, Any, Any]:
    default = setting.default
    made = field(default_factory=lambda: list(default)) if isinstance(default, list) else field(default=default)
    return setting.name, setting.kind.type, made


# The daemon's configuration: one attribute per setting, with the table's default (tests build it
# directly, e.g. ServeConfig(model="builtin:tiny-mlp", max_batch=4)).
ServeConfig = make_dataclass("ServeConfig", [_field(s) for s in SETTINGS], namespace={"__module__": __name__})


def toml_text(value: object) -> str:
    """`value` as it is written in TOML, for messages and the docs."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(toml_text(item) for item in value) + "]"
    return repr(value)


def read_toml(path: str) -> dict[str, Any]:
    """The settings in the TOML file at `path`, each checked against the table."""
    try:
        with open(path, "rb") as handle:
            values = tomllib.load(handle)
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
    checked = {}
    for key, value in values.items():
        setting = BY_NAME.get(key)
        if setting is None:
            known = ", ".join(sorted(BY_NAME))
            raise ConfigError(f"{path}: unknown option {key!r}; known options: {known}")
        checked[key] = setting.kind.parse_toml(key, value, path)
    return checked


def load_config(flags: Mapping[str, Any], path: str | None) -> ServeConfig:
    """The ServeConfig of the defaults, then the TOML file at `path`, then the flags typed (they win)."""
    values = read_toml(path) if path else {}
    values.update(copy.deepcopy(dict(flags)))  # each reload gets its own lists
    return ServeConfig(**values)


def markdown() -> str:
    """docs/configuration.md, from the table."""
    lines = [
        "<!-- Generated from packrat_daemon/config.py: `python -m packrat_daemon.config > docs/configuration.md`."
        " Do not edit; a test checks that it matches. -->",
        "# Configuring `packrat serve`",
        "",
        "Every setting can be given as a flag or as a key of the TOML file named by `--config`",
        "(the key is the flag's name with underscores for dashes, as in `systemd/example.toml`).",
        "A flag given on the command line wins over the file. On SIGHUP the daemon re-reads the file",
        "and re-plans; `model`, `input`, `endpoint`, `runtime`, `precision`, `max_rel_error`, `calibration`,",
        "`allocator`, `run_dir`, `control`, `server_key`, `allowed_clients` and `insecure_public` take a restart",
        "(the allowed clients' folder itself is re-read whenever a key file is added or removed),",
        "and `max_batch` can only shrink.",
    ]
    for section in dict.fromkeys(setting.section for setting in SETTINGS):
        lines += ["", f"## {section}", "", "| key | flag | allowed | default | meaning |", "|" + " --- |" * 5]
        for s in (s for s in SETTINGS if s.section == section):
            cells = (f"`{s.name}`", f"`{s.flag}`", s.kind.words, s.default_text(), s.help)
            lines.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.stdout.write(markdown())
