"""The layering contract: which package may import which, and which stay torch-free.

From the bottom: the wire (`packrat_daemon.wire`: errors, framing, protocol, client) imports nothing
else of Packrat; the planning types and policies (`policies`) and the workers (`workers`) build on the
wire alone; the daemon (the rest of `packrat_daemon`) may import everything. Imports inside functions
count too: a lazy import is still a dependency.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("packrat_daemon", "policies", "workers")
WIRE = "packrat_daemon.wire"

# module prefix → the Packrat module prefixes it may import (its own prefix is always allowed)
LAYERS: dict[str, tuple[str, ...]] = {
    WIRE: (WIRE,),
    "packrat_daemon.client": (WIRE,),
    "policies": ("policies", WIRE),
    "workers": ("workers", WIRE),
}

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


def imported_modules(path: Path, root: Path) -> set[str]:
    """Every module `path` imports, absolute, wherever the import statement sits."""
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
    return found


def _within(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def layer_of(module: str) -> str | None:
    """The most specific layer `module` belongs to (the wire before the rest of packrat_daemon)."""
    matches = [prefix for prefix in LAYERS if _within(module, prefix)]
    return max(matches, key=len) if matches else None


def violations(root: Path) -> list[str]:
    found = []
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            module = module_name(path, root)
            layer = layer_of(module)
            if layer is None:
                continue  # the daemon proper may import every layer
            allowed = LAYERS[layer]
            for target in sorted(imported_modules(path, root)):
                ours = any(_within(target, p) for p in PACKAGES)
                if ours and not any(_within(target, prefix) for prefix in allowed):
                    found.append(f"{module} imports {target} (the {layer} layer may import only {', '.join(allowed)})")
    return found


def test_every_module_keeps_to_its_layer() -> None:
    assert violations(REPO) == []


def test_the_check_catches_a_module_that_crosses_a_layer(tmp_path: Path) -> None:
    for package in PACKAGES:
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / "packrat_daemon" / "wire").mkdir()
    (tmp_path / "packrat_daemon" / "wire" / "__init__.py").write_text("")
    (tmp_path / "packrat_daemon" / "wire" / "codec.py").write_text("def f():\n    from ..daemon import Daemon\n")
    (tmp_path / "policies" / "base.py").write_text("from packrat_daemon import tuner\n")
    (tmp_path / "workers" / "worker.py").write_text("import policies.solver\nfrom packrat_daemon.wire import errors\n")
    assert violations(tmp_path) == [
        "packrat_daemon.wire.codec imports packrat_daemon.daemon (the packrat_daemon.wire layer may import only "
        "packrat_daemon.wire)",
        "policies.base imports packrat_daemon (the policies layer may import only policies, packrat_daemon.wire)",
        "workers.worker imports policies.solver (the workers layer may import only workers, packrat_daemon.wire)",
    ]


@pytest.mark.slow
@pytest.mark.parametrize("module", TORCH_FREE)
def test_module_imports_without_torch(module: str) -> None:
    code = f"import sys, {module}; sys.exit('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, f"importing {module} imported torch\n{result.stderr}"
