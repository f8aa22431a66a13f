"""The interference estimate of `--emulate-interference auto` for the built-in models, and its check against
the one real side-by-side table (docs/emulation.md, "Interference per model").

    .venv/bin/python bench/interference.py [--models resnet50,bert-base,inception3] [--rounds 7] \
        > bench/results/interference.json

Each model is measured as `auto` measures it (packrat_daemon.measure.interference: one 1-thread instance
alone, then beside one on each other core, paired rounds in alternating order, CPU time), with more rounds
than `auto` takes by default. Timing on this machine: run it when the machine is quiet; the JSON records
the load average before each model and how much of the time the co-runners were on a core.

inception3 is torchvision's Inception-v3 (bench/models/inception_v3.py: set TORCHVISION_SOURCE); it is the
model of bench/profiles/multi-inception-fiddle16.csv, so its estimate, measured here and never fitted to
that table, is checked there: the per-group slow-down, and the error of the split's speed-up over the
all-core instance that the emulation predicts from the isolated table with none, default, the estimate
and F = 1.4 (emulation.speedup_errors).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from packrat_daemon.measure import emulation, interference  # noqa: E402

MODELS = {
    "resnet50": "builtin:resnet50",
    "bert-base": "builtin:bert-base",
    "inception3": "inception_v3:build",  # bench/models, torchvision's source from $TORCHVISION_SOURCE
}
FIDDLE = ROOT / "bench" / "profiles" / "multi-inception-fiddle16.csv"
ISOLATED = ROOT / "bench" / "profiles" / "inception3-cloudlab16.csv"
PESSIMISTIC = 1.4


def check_on_fiddle(factor: float | None) -> dict[str, Any]:
    """Per group of the fiddle table: its slow-down, and each interference model's speed-up error."""
    groups = emulation.side_by_side_groups(FIDDLE, ISOLATED)
    models = {"none": "none", "default": "default", "pessimistic": str(PESSIMISTIC)}
    if factor is not None:
        models["estimate"] = f"{factor:.6f}"
    errors = {
        label: emulation.speedup_errors(FIDDLE, ISOLATED, emulation.Interference.named(text))
        for label, text in models.items()
    }
    return {
        "groups": [
            {
                "instances": f"{g.threads} thread(s), batch {g.batch}",
                "alone_batch": g.alone_batch,
                "factor": round(g.factor, 4),
                **{f"error_{label}": round(e[k], 4) for label, e in errors.items()},
            }
            for k, g in enumerate(groups)
        ],  # fmt: skip
        "mean_abs_error": {label: round(statistics.mean(abs(x) for x in e), 4) for label, e in errors.items()},
        "note": "default is fitted to these groups (in-sample); the estimate and the others are not",
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--batches", default=",".join(map(str, interference.AUTO_BATCHES)))
    args = parser.parse_args()
    models_dir = str(ROOT / "bench" / "models")  # the corun child resolves inception_v3:build there
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [models_dir, os.environ.get("PYTHONPATH")]))
    cpus = interference.side_by_side_cpus()
    batches = [int(b) for b in args.batches.split(",")]
    results: dict[str, Any] = {
        "kind": "measured on this machine: 1-thread instances alone and side by side, CPU time, paired rounds",
        "command": " ".join(["bench/interference.py", *sys.argv[1:]]),
        "machine": interference.machine_name(),
        "cpus": list(cpus),
        "rounds": args.rounds,
        "batches": batches,
        "default": emulation.DEFAULT_FULL_LOAD,
        "models": {},
    }
    for name in args.models.split(","):
        print(f"{name}: measuring side by side on {len(cpus)} cores ...", file=sys.stderr)
        found = interference.measure(MODELS[name], None, cpus, batches, args.rounds)
        results["models"][name] = {"spec": MODELS[name], **found.to_json(), "describe": found.describe()}
        print(f"{name}: {found.describe()}", file=sys.stderr)
    inception = results["models"].get("inception3")
    results["fiddle_check"] = check_on_fiddle(inception["factor"] if inception else None)
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
