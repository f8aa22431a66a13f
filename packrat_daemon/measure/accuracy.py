"""The accuracy guard: a reduced precision is served only when its outputs stay close to fp32's.

Before a bf16 or int8 candidate is prepared, the same runtime runs the same inputs at fp32 and at the
reduced precision (in a subprocess, `workers.models.precision`), and the outputs are compared here (every
output of a model of several, the worst deciding):

- relative error: per input, the largest absolute difference between the two outputs over the largest
  absolute fp32 output of that input; the guard keeps the worst input's. Scaled per input rather than
  per element, so an output near zero cannot make a harmless difference look huge.
- top-1 agreement, for classifiers: the share of inputs whose highest-scoring class is the same at both
  precisions. A classifier must agree on every input. `--accuracy-top1` says whether the output is class
  scores: `on`, `off`, or `auto` (`is_class_scores`): a 2-D output (one row per input) of probabilities,
  or of scores not all within [-1, 1]. Embedding heads end in tanh or a normalisation, so their
  features stay within [-1, 1], and their largest feature is no decision a reduced precision must keep.

The inputs are the model's sample inputs (seeded, as the measurements use) and, with `--calibration
FILE.npy`, the user's own. A candidate that fails is never served: `--precision bf16` stops with an
error that says what was measured, and `--precision auto` leaves it out and says why in the log.
"""

from __future__ import annotations

import json
import logging
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from packrat_daemon.settings_served import DEFAULT_MAX_REL_ERROR, TOP1_CHOICES
from packrat_daemon.wire.codec import unpack_records
from packrat_daemon.wire.errors import ConfigError, PackratError
from workers.models.calibration import read_calibration
from workers.models.spec import InputSpec, sample_input
from workers.models.subprocesses import run_module

log = logging.getLogger("packrat.daemon")

MIN_TOP1_AGREEMENT = 1.0  # every input's top-1 class must survive the reduced precision
SAMPLE_INPUTS = 8
GUARD_TIMEOUT_S = 900.0


class AccuracyError(PackratError):
    """A reduced precision failed the accuracy guard, or the guard could not measure it."""


@dataclass(frozen=True)
class GuardResult:
    """What the guard measured for one (runtime, precision) and whether that precision may be served."""

    runtime: str
    precision: str
    inputs: int  # how many inputs were compared
    max_rel_error: float
    top1_agreement: float | None  # None: not a classifier (outputs are not 2-D)
    tolerance: float
    runtime_has_units: bool | None  # the runtime's own report (None: it does not say)
    quantization: dict[str, Any] | None = None  # int8: how it was quantized (scheme, calibration inputs)

    @property
    def passed(self) -> bool:
        within = self.max_rel_error <= self.tolerance
        agrees = self.top1_agreement is None or self.top1_agreement >= MIN_TOP1_AGREEMENT
        return within and agrees and self.runtime_has_units is not False

    def describe(self) -> str:
        top1 = "" if self.top1_agreement is None else f", top-1 agreement {self.top1_agreement:.2f}"
        verdict = "passed" if self.passed else "failed"
        units = " (the runtime reports no native units for it)" if self.runtime_has_units is False else ""
        calibrated = "" if not self.quantization else f", quantized on {self.quantization.get('calibration')},"
        return (
            f"{self.runtime} {self.precision}{calibrated} against fp32 on {self.inputs} inputs: max relative "
            f"error {self.max_rel_error:.2e} (tolerance {self.tolerance:g}){top1}{units}: {verdict}"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "runtime": self.runtime,
            "precision": self.precision,
            "inputs": self.inputs,
            "max_rel_error": self.max_rel_error,
            "top1_agreement": self.top1_agreement,
            "tolerance": self.tolerance,
            "runtime_has_units": self.runtime_has_units,
            "quantization": self.quantization,
            "passed": self.passed,
        }


def is_class_scores(reference: np.ndarray) -> bool:
    """`--accuracy-top1 auto`: whether the fp32 output reads as class scores (logits or probabilities).

    2-D with more than one column, and either every row a probability distribution or some value outside
    [-1, 1]. An embedding (BERT's tanh-pooled output, a normalised vector) stays within [-1, 1]; logits
    almost never do. An unbounded embedding still reads as scores: `--accuracy-top1 off` is for it.
    """
    if reference.ndim != 2 or reference.shape[1] < 2 or len(reference) == 0:
        return False
    values = reference.astype(np.float64)
    probabilities = bool((values >= 0).all()) and np.allclose(values.sum(axis=1), 1.0, atol=1e-3)
    return probabilities or float(np.abs(values).max()) > 1.0


def compare(reference: np.ndarray, reduced: np.ndarray, top1: str = "auto") -> tuple[float, float | None]:
    """(max relative error, top-1 agreement or None) of `reduced` against the fp32 `reference`; `top1`:
    whether the output is held to top-1 agreement (`on`, `off`, or `auto`: when `is_class_scores`)."""
    if top1 not in TOP1_CHOICES:
        raise ConfigError(f"unknown --accuracy-top1 {top1!r}; choose one of {', '.join(TOP1_CHOICES)}")
    if reference.shape != reduced.shape:
        raise AccuracyError(f"the reduced precision's output has shape {reduced.shape}, fp32's {reference.shape}")
    ref = reference.reshape(len(reference), -1).astype(np.float64)
    low = reduced.reshape(len(reduced), -1).astype(np.float64)
    scale = np.maximum(np.abs(ref).max(axis=1), np.finfo(np.float32).tiny)
    per_input = np.abs(low - ref).max(axis=1) / scale
    rel = float(per_input.max()) if np.isfinite(per_input).all() else float("inf")
    scores = top1 == "on" or (top1 == "auto" and is_class_scores(reference))
    if not scores:
        return rel, None
    if reference.ndim < 2 or reference.shape[-1] < 2:
        raise ConfigError(
            f"--accuracy-top1 on needs one row of class scores per input; the output has shape "
            f"{list(reference.shape[1:])} per input: use --accuracy-top1 off or auto"
        )
    return rel, float(np.mean(reference.argmax(axis=-1) == reduced.argmax(axis=-1)))


def compare_outputs(
    spec: InputSpec, reference: np.ndarray, reduced: np.ndarray, top1: str = "auto"
) -> tuple[float, float | None]:
    """`compare` for every output of the model: the worst relative error of any output, and the lowest top-1
    agreement of those held to it (`--accuracy-top1 on` holds the first output to it; `auto` each that reads as
    class scores). A model of several outputs answers records of them, unpacked here by the spec's layout."""
    if not spec.output_records:
        return compare(reference, reduced, top1)
    layout = [(tensor.dtype, tensor.shape) for tensor in spec.outputs]
    pairs = zip(unpack_records(reference, layout), unpack_records(reduced, layout), strict=True)
    worst, agreements = 0.0, []
    for k, (ref, low) in enumerate(pairs):
        rel, agreement = compare(
            ref.astype(np.float32), low.astype(np.float32), top1 if k == 0 or top1 == "auto" else "off"
        )
        worst = max(worst, rel)
        if agreement is not None:
            agreements.append(agreement)
    return worst, min(agreements) if agreements else None


def guard_inputs(spec: InputSpec, calibration: str | None) -> np.ndarray:
    """The sample inputs, then the user's calibration inputs (checked against the model's input)."""
    samples = sample_input(spec, SAMPLE_INPUTS, seed=SAMPLE_INPUTS)
    if not calibration:
        return samples
    return np.concatenate([samples, read_calibration(calibration, spec)])


def check(
    model: str,
    input_spec: InputSpec,
    runtime: str,
    precision: str,
    *,
    input_override: str | None = None,
    calibration: str | None = None,
    tolerance: float = DEFAULT_MAX_REL_ERROR,
    top1: str = "auto",
) -> GuardResult:
    """Run the guard for `runtime` at `precision`; the result says whether it passed. int8 is quantized on
    `calibration` (else on sample inputs, and the log says so)."""
    if precision == "int8" and not calibration:
        log.warning(
            "int8: no --calibration given, so it is quantized on random sample inputs, which say nothing "
            "of your data's range; give your own inputs with --calibration FILE.npy"
        )
    inputs = guard_inputs(input_spec, calibration)
    with tempfile.TemporaryDirectory(prefix="packrat-guard-") as folder:
        out = Path(folder)
        np.save(out / "inputs.npy", inputs)
        args = ["--model", model, "--runtime", runtime, "--precision", precision,
                "--inputs", str(out / "inputs.npy"), "--out", folder]  # fmt: skip
        if input_override:
            args += ["--input", input_override]
        if calibration:
            args += ["--calibration", calibration]
        try:
            done = run_module("workers.models.precision", args, GUARD_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise AccuracyError(
                f"the accuracy guard for {runtime} {precision} took over {GUARD_TIMEOUT_S:.0f} s"
            ) from None
        report_path = out / "report.json"
        report = json.loads(report_path.read_text()) if report_path.exists() else {}
        if done.returncode != 0 or "error" in report:
            why = report.get("error") or done.stderr.strip()[-2000:]
            raise AccuracyError(f"the accuracy guard could not run {model} on {runtime} at {precision}: {why}")
        reference, reduced = np.load(out / "reference.npy"), np.load(out / "reduced.npy")
    rel, agreement = compare_outputs(input_spec, reference, reduced, top1)
    has_units, quantization = report.get("runtime_has_units"), report.get("quantization")
    return GuardResult(runtime, precision, len(inputs), rel, agreement, tolerance, has_units, quantization)


def refused(result: GuardResult) -> AccuracyError:
    """The error for a pinned reduced precision that failed the guard: what was measured, what to do."""
    scores = "" if result.top1_agreement is None else "; if the output is not class scores, --accuracy-top1 off"
    return AccuracyError(
        f"accuracy guard: {result.describe()}; serve --precision fp32, or allow more error with "
        f"--max-rel-error (at your own risk){scores}"
    )
