"""The layering contract: the packages stand in one order, each importing only its own modules and those below it;
and some modules stay torch-free.

`ORDER` lists the layers from the bottom (docs/architecture.md draws it). A layer holds one part or several side by
side; a part is a set of module prefixes, and a module belongs to the part with its longest matching prefix. A module
may import the modules of its own part and of any lower layer, never those of a part beside it or above it. Imports
inside functions and under `if TYPE_CHECKING:` count too: a lazy or a type-only import is still a dependency. Where a
lower layer needs a higher one's type, the type moves to a leaf module below both, or the lower layer names what it
reads as a protocol (`packrat_daemon.ops.records`). Every product module must lie in a part, so a new package is
placed in the order when it is made.
"""

from __future__ import annotations

import ast
import fnmatch
import functools
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("packrat_daemon", "policies", "workers")
ROOT = "packrat_daemon"  # the package's own __init__ (its version only): part of the bottom layer
WIRE = "packrat_daemon.wire"
# The state store: what was measured and learned, saved across restarts. It lives in ops/ but stores what measure/
# and adapt/ make, so it stands above them, apart from the telemetry (the rest of ops/, below the fleet).
STORE = tuple(f"packrat_daemon.ops.{name}" for name in ("state", "state_document", "state_files", "state_identity"))

# Bottom to top: each layer maps its parts' names to their module prefixes.
ORDER: tuple[dict[str, tuple[str, ...]], ...] = (
    {"wire": (WIRE, ROOT)},  # errors, framing, the protocol's messages, the clients' sockets
    {
        "policies": ("policies",),  # planning types, profiles, the solver and the policies
        "workers": ("workers",),  # the worker processes: runtimes, models, the arena
        "client": ("packrat_daemon.client",),  # users' programs' client
        "gateway": ("packrat_daemon.protocol",),  # the Open Inference Protocol gateway, a process of its own
        "signals": ("packrat_daemon.signals",),  # the signal table
    },
    {"search": ("packrat_daemon.search",)},  # the adaptive search's algorithms (on policies' planning types)
    {"settings": ("packrat_daemon.settings",)},  # the settings table's machinery: Setting, Kind, TOML, the docs
    {
        "config": (  # the settings table itself and ServeConfig, read and checked
            "packrat_daemon.config",
            "packrat_daemon.serve_config",
            "packrat_daemon.settings_served",
            "packrat_daemon.settings_run",
        )
    },
    {"telemetry": ("packrat_daemon.ops",)},  # metrics, tallies, logs, progress, hardening, sd_notify
    {
        "fleet": ("packrat_daemon.fleet",),  # worker processes: backend, pool, reconciler, supervisor
        "load": ("packrat_daemon.load",),  # the load generator (`packrat load`)
    },
    {"measure": ("packrat_daemon.measure",)},  # timing plans on a fleet: bench, profiling, the accuracy guard
    {"adapt": ("packrat_daemon.adapt",)},  # learning from production: estimator, tuner, online adaptation
    {
        "requests": ("packrat_daemon.requests",),  # the data path: frontend, batcher, splitter, dispatcher
        "store": STORE,
    },
    {"startup": ("packrat_daemon.startup", "packrat_daemon.reload")},  # start-up checks and measuring; SIGHUP
    {
        "loop": ("packrat_daemon.loop",),  # the daemon's loop (LoopCore), shared with the simulation
        "wiring": ("packrat_daemon.wiring",),  # the serving parts assembled in their order
    },
    {"control": ("packrat_daemon.control",)},  # the control socket: server, board, status
    {"coordinate": ("packrat_daemon.coordinate",)},  # co-location: shares of the cores among daemons
    {
        "daemon": ("packrat_daemon.daemon",),  # the daemon
        "simulate": ("packrat_daemon.simulate",),  # `packrat simulate`: the daemon's loop on a simulated clock
    },
    {
        "service": ("packrat_daemon.service",),  # the daemon and its gateway as one service
        "repository": ("packrat_daemon.repository",),  # `serve --repository`: a daemon per model, one gateway
    },
    {"commands": ("packrat_daemon.commands",)},  # the CLI's commands
    {"cli": ("packrat_daemon.cli", "packrat_daemon.__main__")},
)

# Upward imports that stand until their module's rework (issue 39) removes them: (importer, imported) -> why. Each
# is checked to still exist, so the list only shrinks.
UPWARD_FOR_NOW: dict[tuple[str, str], str] = {}

# Modules that must import without torch: users' programs, the CLI's `solve` and the daemon's own process.
TORCH_FREE = (
    "packrat_daemon.client",
    "packrat_daemon.wire.client",
    "packrat_daemon.daemon",
    "policies.registry",
    "packrat_daemon.commands.solve",
)


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@functools.cache
def imported_modules(path: Path, root: Path) -> frozenset[str]:
    """Every module `path` imports, absolute, wherever the import statement sits. Kept for the session: the layer
    checks here and the import-cycle checks (tests/test_import_cycles.py) read every product module, five times
    over otherwise."""
    name = module_name(path, root)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            names = False  # a name from the package itself, not only its submodules
            for alias in node.names:  # `from pkg import module` imports pkg.module, as `import pkg.module` does
                candidate = root.joinpath(*target.split("."), alias.name)
                if candidate.with_suffix(".py").exists() or (candidate / "__init__.py").exists():
                    found.add(f"{target}.{alias.name}")
                else:
                    names = True
            if names:
                found.add(target)
    return frozenset(found)


def _within(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def place(module: str) -> tuple[int, str] | None:
    """(layer, part) of `module`: the part with its longest matching prefix; None when it lies in none."""
    if module == ROOT:
        return 0, "wire"
    best: tuple[int, int, str] | None = None
    for layer, parts in enumerate(ORDER):
        for part, prefixes in parts.items():
            for prefix in prefixes:
                if prefix != ROOT and _within(module, prefix) and (best is None or len(prefix) > best[0]):
                    best = (len(prefix), layer, part)
    return None if best is None else (best[1], best[2])


def product_modules(root: Path) -> dict[str, Path]:
    return {module_name(path, root): path for package in PACKAGES for path in sorted((root / package).rglob("*.py"))}


def upward_imports(root: Path) -> list[tuple[str, str, str]]:
    """(importer, imported, why it may not) for every import of a product module that is not of its own part or a
    lower layer."""
    found = []
    for module, path in product_modules(root).items():
        here = place(module)
        if here is None:
            continue  # unplaced() names it
        for target in sorted(imported_modules(path, root)):
            there = place(target) if any(_within(target, p) for p in PACKAGES) else None
            if there is None or there[1] == here[1] or there[0] < here[0]:
                continue
            where = "beside" if there[0] == here[0] else "above"
            found.append((module, target, f"{there[1]} (layer {there[0]}) is {where} {here[1]} (layer {here[0]})"))
    return found


def violations(root: Path, allowed: dict[tuple[str, str], str] = UPWARD_FOR_NOW) -> list[str]:
    return [f"{a} imports {b}: {why}" for a, b, why in upward_imports(root) if (a, b) not in allowed]


def unplaced(root: Path) -> list[str]:
    return [module for module in product_modules(root) if place(module) is None]


def test_every_module_keeps_to_its_layer() -> None:
    assert violations(REPO) == []


def test_every_module_lies_in_a_layer() -> None:
    assert unplaced(REPO) == [], "add each to a part of ORDER (and docs/architecture.md's drawing)"


def test_each_upward_import_let_stand_still_exists() -> None:
    """An exception whose import is gone is struck from UPWARD_FOR_NOW, so the list only shrinks."""
    standing = {(a, b) for a, b, _ in upward_imports(REPO)}
    assert [pair for pair in UPWARD_FOR_NOW if pair not in standing] == []


def test_no_part_is_declared_twice() -> None:
    prefixes = [prefix for parts in ORDER for part in parts.values() for prefix in part]
    names = [name for parts in ORDER for name in parts]
    assert len(prefixes) == len(set(prefixes)) and len(names) == len(set(names))


def drawn_layers(page: str) -> dict[int, list[str]]:
    """The names in each numbered row of the drawing in docs/architecture.md's "Layers" section."""
    block = page.split("## Layers", 1)[1].split("```")[1]
    rows = re.finditer(r"^ *(\d+) │(.*)│$", block, re.MULTILINE)
    return {int(row[1]): re.findall(r"[\w/.*]+", row[2]) for row in rows}


def drawn_name(prefix: str, root: Path) -> str | None:
    """How the drawing names a part's prefix (`packrat_daemon/` left out); None for one that is not there."""
    path = root.joinpath(*prefix.split("."))
    shown = "/".join(prefix.split(".")[1:] or prefix.split("."))
    if path.is_dir():
        return shown + "/"
    return shown + ".py" if path.with_suffix(".py").exists() else None


def undrawn(page: str, root: Path) -> list[str]:
    """Each prefix of ORDER that the drawing does not show in its layer's row."""
    rows, missing = drawn_layers(page), []
    for layer, parts in enumerate(ORDER):
        for prefix in (prefix for prefixes in parts.values() for prefix in prefixes if prefix != ROOT):
            name = drawn_name(prefix, root)
            names = rows.get(layer, [])
            if name is not None and not any(name == n or ("*" in n and fnmatch.fnmatch(name, n)) for n in names):
                missing.append(f"{name} (layer {layer})")
    return missing


def test_the_architecture_page_draws_every_part_in_its_layer() -> None:
    assert undrawn((REPO / "docs" / "architecture.md").read_text(encoding="utf-8"), REPO) == []


def test_the_drawing_check_catches_a_part_drawn_in_another_layer() -> None:
    page = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
    moved = page.replace(" 6 │ fleet/ │ load/ ", " 6 │ flee/ │ load/ ").replace("  7 │ measure/ ", "  7 │ fleet/   ")
    assert moved != page and undrawn(moved, REPO) == ["fleet/ (layer 6)", "measure/ (layer 7)"]


def _tree(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        for folder in reversed(path.relative_to(root).parents[:-1]):
            (root / folder).mkdir(exist_ok=True)
            if not (root / folder / "__init__.py").exists():
                (root / folder / "__init__.py").write_text("")
        path.write_text(text)


def test_the_check_catches_a_module_that_imports_upward(tmp_path: Path) -> None:
    _tree(
        tmp_path,
        {
            "packrat_daemon/__init__.py": "__version__ = '0'\n",
            "packrat_daemon/daemon.py": "from packrat_daemon.fleet import pool\n",  # downward: allowed
            "packrat_daemon/fleet/pool.py": "from packrat_daemon import __version__\nfrom . import backend\n",
            "packrat_daemon/fleet/backend.py": "",
            "packrat_daemon/wire/codec.py": "def f():\n    from ..daemon import Daemon\n",  # lazy, and upward
            "packrat_daemon/ops/metrics.py": (
                "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from packrat_daemon.requests.jobs import C\n"
            ),
            "packrat_daemon/requests/jobs.py": "",
            "packrat_daemon/ops/state.py": "import packrat_daemon.adapt.production\n",  # the store stands above adapt
            "packrat_daemon/adapt/production.py": "import packrat_daemon.ops.state\n",
            "packrat_daemon/load/generator.py": "from packrat_daemon.fleet import pool\n",  # a part beside it
            "packrat_daemon/gadget.py": "",  # in no layer
            "policies/base.py": "import workers.worker\n",
            "workers/worker.py": "from packrat_daemon.wire import codec\n",
        },
    )
    assert violations(tmp_path, allowed={}) == [
        "packrat_daemon.adapt.production imports packrat_daemon.ops.state: store (layer 9) is above adapt (layer 8)",
        "packrat_daemon.load.generator imports packrat_daemon.fleet.pool: fleet (layer 6) is beside load (layer 6)",
        "packrat_daemon.ops.metrics imports packrat_daemon.requests.jobs: requests (layer 9) is above telemetry "
        "(layer 5)",
        "packrat_daemon.wire.codec imports packrat_daemon.daemon: daemon (layer 14) is above wire (layer 0)",
        "policies.base imports workers.worker: workers (layer 1) is beside policies (layer 1)",
    ]
    allowed = {("packrat_daemon.wire.codec", "packrat_daemon.daemon"): "a reason"}
    assert len(violations(tmp_path, allowed=allowed)) == 4
    assert unplaced(tmp_path) == ["packrat_daemon.gadget"]


@pytest.mark.slow
@pytest.mark.parametrize("module", TORCH_FREE)
def test_module_imports_without_torch(module: str) -> None:
    code = f"import sys, {module}; sys.exit('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, f"importing {module} imported torch\n{result.stderr}"
