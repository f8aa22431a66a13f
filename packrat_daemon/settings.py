"""The machinery of the settings table (`packrat_daemon.config.SETTINGS`): what a setting accepts (`Kind`), the
`Setting` itself, reading a TOML file against the table, and what is generated from it: the docs and the typed
`ServeConfig` (`packrat_daemon/serve_config.py`).

A setting declares how a running daemon takes a new value: `reload="live"` (a reload, SIGHUP, applies it;
`packrat_daemon.reload`) or `reload="restart"` (a reload keeps the running value and logs that it waits for a
restart). The restart list, the docs' sentence and the README's come from that one declaration.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import textwrap
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from packrat_daemon.wire.errors import ConfigError, ProfileError

Reload = Literal["live", "restart"]
RELOADS: tuple[Reload, ...] = ("live", "restart")


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


def exactly(cls: type) -> Callable[[object], Any]:
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


def integer(words: str, allowed: Callable[[int], bool], optional: bool = False) -> Kind:
    return Kind(words, int | None if optional else int, int, exactly(int), allowed)


def number(words: str, allowed: Callable[[float], bool]) -> Kind:
    return Kind(words, float, float, exactly(float), lambda value: math.isfinite(value) and allowed(value))


def text(words: str, optional: bool) -> Kind:
    return Kind(words, str | None if optional else str, str, exactly(str))


def choice(*options: str) -> Kind:
    return Kind(f"one of {', '.join(options)}", str, str, exactly(str), lambda v: v in options, options)


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
    return sorted({exactly(int)(item) for item in value})


def _budget_from_toml(value: object) -> str:
    """A TOML budget: a number (0.25) or a string ("0.25", "300s")."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    return exactly(str)(value)


def _budget_allowed(text: str) -> bool:
    from packrat_daemon.search.budget import Budget  # the one home of the budget's syntax (no scikit-optimize)

    try:
        Budget.parse(text)
    except ProfileError:
        return False
    return True


POSITIVE_INT = integer("a positive integer", lambda value: value >= 1)
COUNT = integer("an integer, 0 or more", lambda value: value >= 0)
PORT = integer("a port number from 0 to 65535", lambda value: 0 <= value <= 65535)
SECONDS = number("a number of seconds above 0", lambda value: value > 0)
WAIT = number("a number, 0 or more", lambda value: value >= 0)
FRACTION = number("a fraction from 0 up to (not including) 1, e.g. 0.05 for 5%", lambda value: 0 <= value < 1)
MARGIN = number("a number, 1 or more", lambda value: value >= 1)
TEXT = text("a string", optional=False)
OPTIONAL_TEXT = text("a string", optional=True)
SWITCH = Kind("true or false", bool, lambda text: {"true": True, "false": False}[text], exactly(bool))
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
    unset: str = ""  # what an absent setting whose default is empty means, for help and docs
    section: str = field(default="", kw_only=True)  # the docs' heading, filled in by `sectioned`
    reload: Reload = field(kw_only=True)  # what a reload does with a new value: applies it, or waits for a restart
    reload_note: str = field(default="", kw_only=True)  # a live setting's limit, a clause of the docs' sentence

    def __post_init__(self) -> None:
        if self.reload not in RELOADS:
            raise ValueError(f"setting {self.name}: reload must be one of {', '.join(RELOADS)}, not {self.reload!r}")

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


def sectioned(*items: str | Setting) -> tuple[Setting, ...]:
    """The settings among `items`, each in the section named by the heading before it."""
    section, settings = "", []
    for item in items:
        if isinstance(item, str):
            section = item
        else:
            settings.append(dataclasses.replace(item, section=section))
    return tuple(settings)


def toml_text(value: object) -> str:
    """`value` as it is written in TOML, for messages and the docs."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(toml_text(item) for item in value) + "]"
    return repr(value)


def read_toml(path: str, table: Mapping[str, Setting]) -> dict[str, Any]:
    """The settings in the TOML file at `path`, each checked against `table` (name → setting)."""
    try:
        with open(path, "rb") as handle:
            values = tomllib.load(handle)
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
    checked = {}
    for key, value in values.items():
        setting = table.get(key)
        if setting is None:
            raise ConfigError(f"{path}: unknown option {key!r}; {unknown_hint(key, table)}")
        checked[key] = setting.kind.parse_toml(key, value, path)
    return checked


def unknown_hint(key: str, table: Mapping[str, Setting]) -> str:
    """What to write instead of the unknown option `key`: its spelling with underscores (`max-batch` is the
    command line's `--max-batch`; TOML spells it `max_batch`), else the closest names, else where the list is."""
    snake = key.strip().lstrip("-").replace("-", "_").lower()
    if snake in table:
        return f"TOML spells it {snake!r}, with underscores (the command line's --{snake.replace('_', '-')})"
    close = difflib.get_close_matches(snake, list(table), n=3, cutoff=0.6)
    if close:
        return f"did you mean {' or '.join(repr(name) for name in close)}? (every option: docs/configuration.md)"
    return f"no option is close to it; every option, with what it does: docs/configuration.md ({len(table)} options)"


def _listing(names: Sequence[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def restart_sentence(settings: Sequence[Setting]) -> str:
    """What a reload does with each setting, in words: the docs' and the README's sentence, from `reload=`."""
    restart = [f"`{s.name}`" for s in settings if s.reload == "restart"]
    sentence = (
        f"A reload applies every setting at once except {_listing(restart)}, which take a restart: a reload "
        "that changes one logs that its running value stays until then."
    )
    notes = [f"`{s.name}` {s.reload_note}" for s in settings if s.reload_note]
    return sentence + (f" {_listing(notes)}." if notes else "")


def markdown(settings: Sequence[Setting]) -> str:
    """docs/configuration.md, from the table."""
    lines = [
        "<!-- Generated from packrat_daemon/config.py: `python -m packrat_daemon.config > docs/configuration.md`."
        " Do not edit; a test checks that it matches. -->",
        "# Configuring `packrat serve`",
        "",
        "Every setting can be given as a flag or as a key of the TOML file named by `--config`",
        "(the key is the flag's name with underscores for dashes, as in `systemd/example.toml`).",
        "A flag given on the command line wins over the file. On SIGHUP the daemon re-reads the file",
        "and re-plans. " + restart_sentence(settings),
    ]
    lines[-1:] = textwrap.wrap(lines[-1], 110, break_on_hyphens=False)
    header = "| key | flag | allowed | default | on reload | meaning |"
    for section in dict.fromkeys(setting.section for setting in settings):
        lines += ["", f"## {section}", "", header, "|" + " --- |" * 6]
        for s in (s for s in settings if s.section == section):
            cells = (f"`{s.name}`", f"`{s.flag}`", s.kind.words, s.default_text(), s.reload, s.help)
            lines.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    return "\n".join(lines) + "\n"


def _annotation(kind_type: Any) -> str:
    """A `Kind.type` as it is written in Python: `int`, `str | None`, `list[int]`."""
    return kind_type.__name__ if type(kind_type) is type else str(kind_type)  # list[int] is no `type`


def _python(value: object) -> str:
    """A default as Python source, as ruff formats it (strings in double quotes)."""
    return json.dumps(value, ensure_ascii=False) if isinstance(value, str) else repr(value)


def typed_module(settings: Sequence[Setting]) -> str:
    """packrat_daemon/serve_config.py, from the table: `ServeConfig` as a plain dataclass, one typed attribute per
    setting with its default, so that the type checker sees each setting (a misspelt one fails the check)."""
    lines = [
        '"""The daemon\'s configuration: one typed attribute per `serve` setting, with the settings table\'s default.',
        "",
        "Generated from the table (packrat_daemon/config.py): `python -m packrat_daemon.config --typed >",
        "packrat_daemon/serve_config.py`. Do not edit; a test checks that it matches. What each setting means, its",
        "flag and what a reload does with it: docs/configuration.md.",
        '"""',
        "",
        "from __future__ import annotations",
        "",
        "from dataclasses import dataclass" + (", field" if any(isinstance(s.default, list) for s in settings) else ""),
        "",
        "",
        "@dataclass",
        "class ServeConfig:",
        '    """Built by `load_config` (the defaults, then the TOML file, then the flags) at start and on each reload;',
        '    tests build it directly, e.g. ServeConfig(model="builtin:tiny-mlp", max_batch=4)."""',
    ]
    section = None
    for setting in settings:
        if setting.section != section:
            section = setting.section
            lines += ["", f"    # {section}"]
        default = setting.default
        if isinstance(default, list):
            made = "field(default_factory=list)" if not default else f"field(default_factory=lambda: {default!r})"
        else:
            made = _python(default)
        lines.append(f"    {setting.name}: {_annotation(setting.kind.type)} = {made}")
    return "\n".join(lines) + "\n"
