"""Reduced precision: whether this CPU has the units for it, and the accuracy guard's runs.

The CPU side is torch-free (the daemon asks it for `--precision auto`). The guard's runs happen in a
subprocess, ``python -m workers.models.precision``, because they run inference: the template that asks must
never start a thread pool before it forks, and the daemon never imports torch. The subprocess loads the
model twice through the same runtime, at fp32 and at the reduced precision, runs the same inputs through
both and writes both outputs; the daemon (`packrat_daemon.measure.accuracy`) compares them and decides.

int8's calibration inputs, and how a template is told them (`int8:FILE`), are `workers.models.calibration`'s.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from workers.models.calibration import template_precision
from workers.runtimes import make_runtime

CPUINFO = "/proc/cpuinfo"

# The CPU flags (as Linux names them) of the units that run each reduced precision natively. Without
# them a runtime emulates bf16 in float32 arithmetic: correct, but slower than fp32.
# int8's are listed for the record (bench/precision.py, docs): `--precision auto` never serves int8.
PRECISION_FLAGS: dict[str, frozenset[str]] = {
    "bf16": frozenset({"amx_bf16", "avx512_bf16"}),
    "int8": frozenset({"amx_int8", "avx512_vnni", "avx_vnni"}),
}

GUARD_CHUNK = 16  # inputs per run in the guard, so a large calibration file never makes one huge batch


def cpu_flags(path: str = CPUINFO) -> frozenset[str]:
    """The flags of the first processor in /proc/cpuinfo (empty when it cannot be read, e.g. not Linux)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            for line in handle:
                key, _, value = line.partition(":")
                if key.strip() == "flags":
                    return frozenset(value.split())
    except OSError:
        pass
    return frozenset()


def cpu_units(precision: str, flags: frozenset[str] | None = None) -> list[str]:
    """The flags of this CPU that run `precision` natively (fp32: none are needed, so none are listed)."""
    flags = cpu_flags() if flags is None else flags
    return sorted(flags & PRECISION_FLAGS.get(precision, frozenset()))


def run_both(
    model: str,
    input_override: str | None,
    runtime: str,
    precision: str,
    inputs: np.ndarray,
    calibration: str | None = None,
) -> dict:
    """Run `inputs` through `runtime` at fp32 and at `precision`: the outputs, the runtime's own report and,
    for int8, how it was quantized."""
    outputs = {}
    report: bool | None = None
    quantization: dict | None = None
    for served in ("fp32", precision):
        instance = make_runtime(runtime, template_precision(served, calibration))
        spec = instance.load(model, input_override)
        instance.set_threads(len(os.sched_getaffinity(0)))  # it runs alone, before any worker starts
        chunks = [instance.run(inputs[k : k + GUARD_CHUNK]) for k in range(0, len(inputs), GUARD_CHUNK)]
        # Records of several outputs stay bytes: the daemon unpacks each output (packrat_daemon.measure.accuracy).
        outputs[served] = np.concatenate(chunks) if spec.output_records else np.concatenate(chunks).astype(np.float32)
        if served == precision:
            report = instance.has_units()
            quantization = getattr(instance, "quantization", None)
    return {
        "reference": outputs["fp32"],
        "reduced": outputs[precision],
        "runtime_has_units": report,
        "quantization": quantization,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m workers.models.precision")
    parser.add_argument("--model", required=True)
    parser.add_argument("--input")
    parser.add_argument("--runtime", required=True)
    parser.add_argument("--precision", required=True)
    parser.add_argument("--inputs", required=True, help=".npy file of the inputs to run")
    parser.add_argument("--calibration", help="int8: the .npy file it is quantized on (else sample inputs)")
    parser.add_argument("--out", required=True, help="folder for reference.npy, reduced.npy and report.json")
    args = parser.parse_args(argv)
    out = Path(args.out)
    try:
        ran = run_both(args.model, args.input, args.runtime, args.precision, np.load(args.inputs), args.calibration)
    except Exception as exc:  # the daemon turns this into a typed error for the user
        (out / "report.json").write_text(json.dumps({"error": f"{type(exc).__name__}: {exc}"}))
        return 1
    np.save(out / "reference.npy", ran["reference"])
    np.save(out / "reduced.npy", ran["reduced"])
    report = {"runtime_has_units": ran["runtime_has_units"], "quantization": ran["quantization"]}
    (out / "report.json").write_text(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
