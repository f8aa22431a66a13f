"""The docs cite only what exists: results files, repository paths, modules and section anchors.

Checked in the README, `docs/*.md` and `bench/README.md`, outside fenced code blocks unless said:
- every `bench/results/…` file named anywhere (code blocks included: a command's output file counts);
- in `bench/README.md` and `docs/evaluation.md`, every bare `NAME.json` or `NAME.txt`, read as a file in
  `bench/results/`;
- every relative markdown link, and its `#anchor` when it points into a markdown file (GitHub's slugs);
- every path in inline code that starts at a top-level folder (`packrat_daemon/…`, `bench/…`, …), every
  other `name.py` or `folder/name.py` in inline code (some file's path must end so), and every dotted module
  (`packrat_daemon.fleet.pool`, `tests.model_factories:slow_mlp`).
A name with a placeholder in capitals (`manycore-HOST-DATE.json`, `bench/NAME.py`) or a `*` is a pattern:
it must match at least one file, or is skipped when it holds a placeholder.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RESULTS = Path("bench") / "results"
RESULT_DOCS = ("bench/README.md", "docs/evaluation.md")  # where a bare `x.json` means bench/results/x.json
TOP = ("packrat_daemon", "workers", "policies", "tests", "bench", "docs", "systemd", "deploy", ".ci")
SKIP_DIRS = {"venv", "node_modules", "__pycache__", "site-packages"}  # and every folder whose name starts with "."
PLACEHOLDER = re.compile(r"(?<![A-Za-z])(NAME|HOST|DATE|FILE|PID|PORT|RUN_DIR|MODEL|COMMAND)(?![a-z])")

FENCE = re.compile(r"^[ \t]*(```|~~~).*?^[ \t]*\1[^\n]*$", re.M | re.S)
LINK = re.compile(r"(?<!!)\[[^\]\n]*\]\(([^)\s]+)\)|!\[[^\]\n]*\]\(([^)\s]+)\)")
INLINE = re.compile(r"`([^`\n]+)`")
RESULT_PATH = re.compile(r"bench/results/([\w.*-]+\.\w+)")
BARE_RESULT = re.compile(r"(?<![\w/.*-])([\w-]+(?:\*[\w-]*)?\.(?:json|txt))\b")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$", re.M)


def doc_paths(root: Path) -> list[Path]:
    paths = [root / "README.md", root / "bench" / "README.md", *sorted((root / "docs").glob("*.md"))]
    return [path for path in paths if path.is_file()]


def _without_code_blocks(text: str) -> str:
    return FENCE.sub("", text)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: markup dropped, lower case, punctuation gone, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link keeps its text
    text = re.sub(r"[^\w\- ]", "", text.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    found = set()
    for match in HEADING.finditer(_without_code_blocks(path.read_text(encoding="utf-8"))):
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def _exists(root: Path, relative: str) -> bool:
    """A path or a glob pattern (`*`) under root that names at least one file or folder."""
    if "*" in relative:
        return any(root.glob(relative))
    return (root / relative).exists()


def _file_paths(root: Path) -> set[str]:
    """Every file under the top-level folders and at the root, relative to root, as `a/b/c.py`."""
    paths = {p.name for p in root.iterdir() if p.is_file()}
    for top in TOP:
        for folder, dirs, files in os.walk(root / top):
            dirs[:] = [d for d in dirs if d not in SKIP_DIRS and not d.startswith(".")]
            base = Path(folder).relative_to(root).as_posix()
            paths.update(f"{base}/{name}" for name in files)
    return paths


def _module_exists(root: Path, dotted: str) -> bool:
    """`a.b.c` (or `a.b:c`): the longest prefix that is a module, the rest at most two names it mentions."""
    module, _, attribute = dotted.partition(":")
    parts = module.split(".")
    for cut in range(len(parts), 0, -1):
        base = root.joinpath(*parts[:cut])
        source = base.with_suffix(".py") if base.with_suffix(".py").is_file() else base / "__init__.py"
        if not source.is_file():
            continue
        rest = parts[cut:] + ([attribute] if attribute else [])
        if len(rest) > 2:
            return False
        if not rest:
            return True
        name = re.escape(rest[0])
        defined = rf"^\s*(?:async\s+def|def|class)\s+{name}\b|^\s*{name}\s*[:=]|^\s*(?:from\s.*)?import\s.*\b{name}\b"
        return re.search(defined, source.read_text(encoding="utf-8"), re.M) is not None
    return False


def _missing(root: Path, token: str, files: set[str]) -> str | None:
    """What is wrong with one word of inline code, or None: a path, a file name or a dotted module."""
    if "/" in token and token.split("/")[0] in TOP:
        return None if _exists(root, token.split("#")[0].rstrip("/")) else "does not exist"
    if re.fullmatch(r"[\w/]+\.py", token):  # `pool.py`, `fleet/pool.py`: some file's path ends so
        return None if any(f == token or f.endswith("/" + token) for f in files) else "no file of that name"
    if re.fullmatch(r"(packrat_daemon|workers|policies|tests)(\.\w+)+(:\w+)?", token):
        return None if _module_exists(root, token) else "names no module"
    return None


def _check_inline(root: Path, doc: str, code: str, files: set[str]) -> list[str]:
    problems = []
    for token in re.split(r"[\s,;()\[\]'\"=]+", code):
        token = token.rstrip(".:")
        if not token or PLACEHOLDER.search(token) or "://" in token:
            continue
        why = _missing(root, token, files)
        if why == "no file of that name":
            problems.append(f"{doc}: `{token}`: {why}")
        elif why:
            problems.append(f"{doc}: `{token}` {why}")
    return problems


def problems(root: Path) -> list[str]:
    """Everything the docs under `root` cite that does not exist, one line each."""
    found: list[str] = []
    files = _file_paths(root)
    anchor_cache: dict[Path, set[str]] = {}
    for path in doc_paths(root):
        doc = path.relative_to(root).as_posix()
        text = path.read_text(encoding="utf-8")
        prose = _without_code_blocks(text)
        for name in sorted(set(RESULT_PATH.findall(text))):
            if not PLACEHOLDER.search(name) and not _exists(root, (RESULTS / name).as_posix()):
                found.append(f"{doc}: bench/results/{name} does not exist")
        if doc in RESULT_DOCS:
            for name in sorted(set(BARE_RESULT.findall(text))):
                if not PLACEHOLDER.search(name) and not _exists(root, (RESULTS / name).as_posix()):
                    found.append(f"{doc}: {name} is not in bench/results/")
        for match in LINK.finditer(prose):
            target = match.group(1) or match.group(2)
            if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                continue
            file_part, _, anchor = target.partition("#")
            linked = (path.parent / file_part).resolve() if file_part else path
            if file_part and not linked.exists():
                found.append(f"{doc}: link to {target}: {file_part} does not exist")
                continue
            if anchor and linked.suffix == ".md":
                if linked not in anchor_cache:
                    anchor_cache[linked] = anchors(linked)
                if anchor not in anchor_cache[linked]:
                    found.append(f"{doc}: link to {target}: no section #{anchor}")
        for match in INLINE.finditer(prose):
            found.extend(_check_inline(root, doc, match.group(1), files))
    return found


def test_every_doc_cites_only_what_exists() -> None:
    assert problems(REPO) == []


def test_the_check_catches_what_is_missing(tmp_path: Path) -> None:
    (tmp_path / "bench" / "results").mkdir(parents=True)
    (tmp_path / "bench" / "results" / "kept.json").write_text("{}")
    (tmp_path / "docs").mkdir()
    (tmp_path / "packrat_daemon" / "fleet").mkdir(parents=True)
    (tmp_path / "packrat_daemon" / "__init__.py").write_text("")
    (tmp_path / "packrat_daemon" / "fleet" / "__init__.py").write_text("")
    (tmp_path / "packrat_daemon" / "fleet" / "pool.py").write_text("class Pool:\n    pass\n")
    (tmp_path / "README.md").write_text(
        "See bench/results/kept.json and bench/results/gone.json; [deploy](docs/deploy.md) and "
        "[pool](packrat_daemon/fleet/pool.py).\n\n```sh\nrun > bench/results/also-gone.json\n```\n"
    )
    (tmp_path / "docs" / "guide.md").write_text(
        "# Guide\n\n## The pool\n\n[here](#the-pool), [there](#no-such-section), [back](../README.md),\n"
        "[file](../packrat_daemon/frontend.py), `packrat_daemon/fleet/pool.py`, `packrat_daemon/batcher.py`,\n"
        "`packrat_daemon.fleet.pool.Pool`, `packrat_daemon.batcher`, `pool.py`, `live_status.py`,\n"
        "`bench/results/manycore-HOST-DATE.json`, `bench/NAME.py`, `fleet/pool.py`, `fleet/gone.py`.\n"
    )
    (tmp_path / "bench" / "README.md").write_text("| `solver.py` | `kept.json`, `absent.json`, `kept*.json` |\n")
    assert sorted(problems(tmp_path)) == sorted(
        [
            "README.md: bench/results/also-gone.json does not exist",
            "README.md: bench/results/gone.json does not exist",
            "README.md: link to docs/deploy.md: docs/deploy.md does not exist",
            "bench/README.md: absent.json is not in bench/results/",
            "bench/README.md: `solver.py`: no file of that name",
            "docs/guide.md: link to #no-such-section: no section #no-such-section",
            "docs/guide.md: link to ../packrat_daemon/frontend.py: ../packrat_daemon/frontend.py does not exist",
            "docs/guide.md: `packrat_daemon/batcher.py` does not exist",
            "docs/guide.md: `packrat_daemon.batcher` names no module",
            "docs/guide.md: `live_status.py`: no file of that name",
            "docs/guide.md: `fleet/gone.py`: no file of that name",
        ]
    )


def test_slugs_follow_github() -> None:
    assert slug("(a) T = 16, one client, batch 1…64") == "a-t--16-one-client-batch-164"
    assert slug("The daemon's own time") == "the-daemons-own-time"
    assert slug("`packrat simulate`") == "packrat-simulate"
