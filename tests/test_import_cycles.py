"""No import cycles in product code (`packrat_daemon`, `workers`, `policies`).

A cycle means neither module can be read, tested or moved without the other, and whichever is imported
first sees the other half-initialised. Every import counts, wherever the statement sits: at the top, inside
a function (a lazy import is still a dependency) and under `if TYPE_CHECKING:` (a type-only import still
says the module needs the other's types; the fix is the same, a narrower interface or a shared home for the
type). A package's `__init__` that Python runs before a submodule is not an edge; only what a module names.
"""

from __future__ import annotations

from collections import deque
from pathlib import Path

import pytest

from tests.test_layering import PACKAGES, REPO, imported_modules, module_name


def import_graph(root: Path) -> dict[str, set[str]]:
    """Each product module → the product modules it imports (itself left out)."""
    paths = {module_name(path, root): path for package in PACKAGES for path in sorted((root / package).rglob("*.py"))}
    return {name: (imported_modules(path, root) & paths.keys()) - {name} for name, path in paths.items()}


def strongly_connected(graph: dict[str, set[str]]) -> list[set[str]]:
    """Tarjan's components, iteratively (the graph is a few hundred modules deep at most)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, targets = work[-1]
            target = next(targets, None)
            if target is not None:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph[target]))))
                elif target in on_stack:
                    low[node] = min(low[node], index[target])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                found.append(component)
    return found


def shortest_cycle(graph: dict[str, set[str]], start: str, within: set[str]) -> list[str]:
    """The shortest import path from `start` back to itself inside one component."""
    came_from: dict[str, str] = {}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for target in sorted(graph[node] & within):
            if target == start:
                path = [node]
                while path[-1] != start:
                    path.append(came_from[path[-1]])
                return [*reversed(path), start]
            if target not in came_from:
                came_from[target] = node
                queue.append(target)
    raise AssertionError(f"{start} is in a component without a cycle through it")


def cycles(root: Path) -> list[str]:
    """Each import cycle, as one of its shortest loops: `a → b → a`."""
    graph = import_graph(root)
    found = []
    for component in strongly_connected(graph):
        if len(component) > 1:
            found.append(" → ".join(shortest_cycle(graph, min(component), component)))
    return sorted(found)


# The cycle below came back in workers with 475cf94: `workers.runtimes.emulated.main` (the shape-learning
# subprocess) imports `make_runtime` from the registry in `workers.runtimes`, which imports the emulated runtime.
# It is for whoever owns workers/runtimes/ to break (say, the subprocess's entry point in a module of its own);
# strict, so this mark fails the suite once the cycle is gone and must then be removed.
@pytest.mark.parametrize(
    "package",
    [
        "packrat_daemon",
        "policies",
        "workers",
    ],
)
def test_product_code_has_no_import_cycle(package: str) -> None:
    """Each package's cycles (one through two packages is both's)."""
    assert [cycle for cycle in cycles(REPO) if package in {module.split(".")[0] for module in cycle.split(" → ")}] == []


def test_the_check_catches_a_planted_cycle(tmp_path: Path) -> None:
    for package in PACKAGES:
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("")
    requests = tmp_path / "packrat_daemon" / "requests"
    requests.mkdir()
    (requests / "__init__.py").write_text("")
    # a three-module loop: an absolute import, a relative one inside a function, a TYPE_CHECKING one
    (requests / "dispatcher.py").write_text("from packrat_daemon.ops.tallies import HOP\n")
    (tmp_path / "packrat_daemon" / "ops").mkdir()
    (tmp_path / "packrat_daemon" / "ops" / "__init__.py").write_text("")
    (tmp_path / "packrat_daemon" / "ops" / "tallies.py").write_text("def f():\n    from ..daemon import Daemon\n")
    (tmp_path / "packrat_daemon" / "daemon.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from packrat_daemon.requests import dispatcher\n"
    )
    # a two-module loop through `from package import module`; and a package importing its own submodule
    (tmp_path / "workers" / "a.py").write_text("from workers import b\n")
    (tmp_path / "workers" / "b.py").write_text("import workers.a\n")
    (tmp_path / "policies" / "__init__.py").write_text("from policies import base\n")
    (tmp_path / "policies" / "base.py").write_text("X = 1\n")
    assert cycles(tmp_path) == [
        "packrat_daemon.daemon → packrat_daemon.requests.dispatcher → packrat_daemon.ops.tallies → "
        "packrat_daemon.daemon",
        "workers.a → workers.b → workers.a",
    ]
