"""The request path of two revisions side by side: `e2e.py`'s tiny-model transport ratios, interleaved.

    .venv/bin/python bench/revisions.py --base REV [--runs 6] [--tiny-blocks 40]

Checks REV out into a temporary git worktree and runs `bench/e2e.py --skip-resnet --skip-memory` of
each tree in turn, alternating which goes first, `--runs` times each, so that the machine's drift hits
both alike. Each run measures the daemon's batch-1 round trip against a bare two-hop pyzmq relay on the
tiny model, so a ratio is the daemon's transport overhead and does not depend on the machine's speed.
Prints one JSON object: each revision's runs and the medians of its ratios, and current ÷ base.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
RATIOS = ("daemon_over_relay", "daemon_bare_socket_over_relay")


def tiny_run(tree: Path, tiny_blocks: int) -> dict[str, Any]:
    """One `e2e.py` tiny-model run of the code in `tree` (its packages first on the import path)."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    command = [sys.executable, "bench/e2e.py", "--skip-resnet", "--skip-memory", "--tiny-blocks", str(tiny_blocks)]
    done = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True, timeout=900, check=False)
    if done.returncode != 0:
        raise SystemExit(f"bench/e2e.py failed in {tree}:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout)["tiny"]


def summary(runs: list[dict[str, Any]]) -> dict[str, float]:
    return {f"{name}_median": statistics.median(run[name] for run in runs) for name in RATIOS}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, help="the revision to compare the working tree with, e.g. HEAD~5")
    parser.add_argument("--runs", type=int, default=6, help="runs of each revision (default 6)")
    parser.add_argument("--tiny-blocks", type=int, default=40, help="e2e.py's blocks of 100 calls per run")
    args = parser.parse_args()
    if args.runs < 1 or args.tiny_blocks < 1:
        parser.error("--runs and --tiny-blocks must be at least 1")
    base_rev = subprocess.run(
        ["git", "rev-parse", "--verify", args.base], cwd=REPO, capture_output=True, text=True, check=False
    )
    if base_rev.returncode != 0:
        parser.error(f"{args.base!r} is not a revision of this repository")
    with tempfile.TemporaryDirectory(prefix="packrat-base-") as folder:
        base_tree = Path(folder) / "tree"
        subprocess.run(["git", "worktree", "add", "--detach", str(base_tree), args.base], cwd=REPO, check=True,
                       capture_output=True)  # fmt: skip
        try:
            trees = {"base": base_tree, "current": REPO}
            runs: dict[str, list[dict[str, Any]]] = {"base": [], "current": []}
            for k in range(args.runs):
                order = ["base", "current"] if k % 2 == 0 else ["current", "base"]
                for name in order:
                    runs[name].append(tiny_run(trees[name], args.tiny_blocks))
                    print(f"run {k + 1}/{args.runs} {name}: done", file=sys.stderr)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(base_tree)], cwd=REPO, check=False)
    medians = {name: summary(value) for name, value in runs.items()}
    result = {
        "base": base_rev.stdout.strip(),
        "runs_each": args.runs,
        "calls_each_per_run": runs["current"][0]["calls_each"],
        "medians": medians,
        "current_over_base": {key: medians["current"][key] / medians["base"][key] for key in medians["current"]},
        "runs": runs,
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
