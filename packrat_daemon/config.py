"""The daemon's configuration: every `serve` setting declared once, in `SETTINGS`.

Each `Setting` (`packrat_daemon.settings`) carries its name (the TOML key; the flag is the name with dashes),
its `Kind` (type and allowed values), its default, its help, a docs section, and what a reload does with a
new value (`reload=`). The table is declared in two halves by role, `settings_served` (the model, its runtime
and precision, where requests are taken) and `settings_run` (planning, adaptation, timeouts, metrics and logs,
the gateway), and assembled here. From that one table come the `serve` options (`packrat_daemon.commands.options`),
the checks on TOML values, the `ServeConfig` the daemon receives (`load_config`, also on SIGHUP), the settings a
reload keeps until a restart (`RESTART_ONLY`), and what is generated and checked by tests:

- `docs/configuration.md`: `python -m packrat_daemon.config > docs/configuration.md`;
- `packrat_daemon/serve_config.py`, `ServeConfig` as a typed dataclass, so that the type checker sees each setting:
  `python -m packrat_daemon.config --typed > packrat_daemon/serve_config.py`;
- the README's sentence on reloads: `python -m packrat_daemon.config --restart-sentence`.
"""

from __future__ import annotations

import copy
import sys
from collections.abc import Mapping
from typing import Any

from packrat_daemon.serve_config import ServeConfig
from packrat_daemon.settings import Setting, markdown, read_toml, restart_sentence, sectioned, typed_module
from packrat_daemon.settings_run import MIN_ADAPT_GAIN, RUN
from packrat_daemon.settings_served import DEFAULT_PRECISION, DEFAULT_RUNTIME, SERVED

__all__ = [
    "BY_NAME",
    "DEFAULT_PRECISION",
    "DEFAULT_RUNTIME",
    "MIN_ADAPT_GAIN",
    "RESTART_ONLY",
    "SETTINGS",
    "ServeConfig",
    "load_config",
]

SETTINGS: tuple[Setting, ...] = sectioned(*SERVED, *RUN)
BY_NAME: dict[str, Setting] = {setting.name: setting for setting in SETTINGS}

# What a reload keeps at its running value, logging that the new one waits for a restart (packrat_daemon.reload).
RESTART_ONLY: tuple[str, ...] = tuple(setting.name for setting in SETTINGS if setting.reload == "restart")


def load_config(flags: Mapping[str, Any], path: str | None) -> ServeConfig:
    """The ServeConfig of the defaults, then the TOML file at `path`, then the flags typed (they win)."""
    values = read_toml(path, BY_NAME) if path else {}
    values.update(copy.deepcopy(dict(flags)))  # each reload gets its own lists
    return ServeConfig(**values)


if __name__ == "__main__":
    if sys.argv[1:] == ["--restart-sentence"]:  # README.md quotes it; tests/packrat_daemon/test_config.py checks
        sys.stdout.write(restart_sentence(SETTINGS) + "\n")
    elif sys.argv[1:] == ["--typed"]:  # packrat_daemon/serve_config.py; tests/packrat_daemon/test_config.py checks
        sys.stdout.write(typed_module(SETTINGS))
    else:
        sys.stdout.write(markdown(SETTINGS))
