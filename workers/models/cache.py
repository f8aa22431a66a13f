"""A disk cache of models converted for ONNX Runtime and OpenVINO, so a model is converted once per version.

A conversion runs `python -m workers.models.convert` in a subprocess (`workers.models.onnx_files` for an ONNX
file): exporting a model runs it (tracing, constant folding, the converter's own check against PyTorch), and
the template process that asks for it must never start a thread pool before it forks. The result lands in

    $PACKRAT_CACHE_DIR (default ~/.cache/packrat) / RUNTIME-KEY /  model.onnx | model.xml + model.bin,
                                                                   meta.json (the model's input, the check)

where KEY is the sha256 of everything the converted file depends on (see `cache_key`). A conversion is
written to a private temporary folder and renamed into place in one step, so a reader never sees half
a model; a lock file makes a second process wait for the first one's conversion instead of repeating it.

Both runtimes are converted from the same ONNX export of a PyTorch model, which is the slowest step (the
dynamo exporter traces and optimises the graph), so it is made once for both, by whichever conversion
comes first, and kept in its own entry, `onnx-export-KEY/` (model.onnx, the weights beside it in
model.onnx.data, meta.json), KEY covering the model, the exporters' versions and opsets (`export_key`).
ONNX Runtime's entry holds those files themselves (hard links where the file system allows them, else
copies: an entry never changes once in place); OpenVINO's IR is converted from them. Each runtime's KEY
covers the export's, so a new exporter version gives new entries for both. An ONNX file (`--model m.onnx`)
is not exported: its conversions start from the file.

int8 (`ensure_quantized`) is one more step on the OpenVINO conversion: NNCF quantizes it on calibration
inputs in `python -m workers.models.quantize`, into `openvino-int8-KEY/`, KEY covering the OpenVINO entry, the
calibration inputs' bytes and NNCF's version, so other calibration data gives another entry.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import fcntl
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from packrat_daemon.wire.errors import ConfigError, ModelSpecError, PackratError
from workers.models.calibration import read_calibration
from workers.models.spec import (
    BUILTIN,
    FUNCTION,
    HUGGING_FACE,
    ONNX_FILE,
    RUNTIME_REQUIREMENTS,
    InputSpec,
    hf_folder,
    installed,
    model_kind,
    sample_input,
)
from workers.models.subprocesses import run_module
from workers.runtimes.registry import RECORDS

# Bump when the converter changes what it writes, so old cache entries are no longer used.
CACHE_FORMAT = 1
# The file each converted runtime opens, named in its record (workers.runtimes.registry).
ARTIFACTS = {record.name: record.artifact for record in RECORDS if record.artifact is not None}
# The ONNX export both runtimes are converted from (`ensure_exported`): its entry's prefix and file, what
# it depends on besides the model (torch's dynamo exporter builds the graph with onnxscript and onnx-ir),
# and the opset each exporter is asked for (dynamo's is its own default in torch 2.13; the TorchScript
# exporter, the fallback, stays at the opset it was checked at).
EXPORT = "onnx-export"
EXPORT_ARTIFACT = "model.onnx"
EXPORT_PACKAGES = ("torch", "onnx", "onnxscript", "onnx-ir")
EXPORT_OPSETS = {"dynamo": 20, "torchscript": 18}
CONVERT_TIMEOUT_S = 1800.0
# A converted model's agreement with its source (PyTorch, or an ONNX file on ONNX Runtime), relative to the
# output's scale: max|out - reference| <= ATOL + RTOL * max|reference|. Measured: ResNet-50 7.6e-5 on logits
# of magnitude ~106 (7e-7 relative), BERT-base 1.6e-6 on ~0.96.
RTOL = 1e-4
ATOL = 1e-5
CHECK_BATCHES = (1, 3)  # neither is the export's example batch (2): proves the batch axis is dynamic
# The converters end a refusal (a PackratError) with this line, so that its message reaches the user whole,
# without the child's other output or the name of an internal command.
REFUSAL_MARK = "packrat-refusal: "
# Without --calibration, int8 is calibrated on this many seeded sample inputs (NNCF's default is 300; random
# inputs say nothing about the real data's range, so more of them would cost time and gain nothing).
QUANTIZE_SAMPLES = 32


class ConversionError(ModelSpecError):
    """A model could not be converted for a runtime, or the converted model disagrees with PyTorch."""


@dataclass(frozen=True)
class Converted:
    path: Path  # the file the runtime opens (model.onnx or model.xml)
    input: InputSpec
    meta: dict


def cache_dir() -> Path:
    return Path(os.environ.get("PACKRAT_CACHE_DIR") or Path.home() / ".cache" / "packrat")


def cache_key(spec: str, input_override: str | None, runtime: str) -> str:
    """sha256 of what the converted model depends on: the spec, the input override, the model's source
    file (size and mtime, for file and module:function specs) and the versions of torch, the exporter
    and the runtime. A new runtime version or a rewritten model file gives a new key, never a stale hit.
    A runtime converted from the ONNX export also covers the export's key (`export_key`)."""
    parts: dict[str, Any] = {
        "format": CACHE_FORMAT,
        "spec": spec,
        "input": input_override,
        "source": _source_fingerprint(spec),
        "runtime": runtime,
        # torch exports the model; the runtime's own packages convert and run it.
        "versions": {name: _version(name) for name in ("torch", *RUNTIME_REQUIREMENTS[runtime].packages)},
    }
    if runtime in ARTIFACTS:
        parts["export"] = export_key(spec, input_override)
    return _digest(parts)


def export_key(spec: str, input_override: str | None) -> str:
    """sha256 of what a model's ONNX export depends on: the model (as in `cache_key`), the opsets asked for
    and the versions of the packages that export it. No runtime: both runtimes are converted from it."""
    parts = {
        "format": CACHE_FORMAT,
        "step": EXPORT,
        "spec": spec,
        "input": input_override,
        "source": _source_fingerprint(spec),
        "opsets": EXPORT_OPSETS,
        "versions": {name: _version(name) for name in EXPORT_PACKAGES},
    }
    return _digest(parts)


def _digest(parts: dict) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def entry_dir(spec: str, input_override: str | None, runtime: str) -> Path:
    return cache_dir() / f"{runtime}-{cache_key(spec, input_override, runtime)[:32]}"


def export_dir(spec: str, input_override: str | None) -> Path:
    return cache_dir() / f"{EXPORT}-{export_key(spec, input_override)[:32]}"


def ensure_converted(spec: str, input_override: str | None, runtime: str) -> Converted:
    """The cached conversion of `spec` for `runtime`, converting it first (in a subprocess) if needed."""
    if runtime not in ARTIFACTS:
        raise ConversionError(f"no converter for runtime {runtime!r}; convertible: {', '.join(ARTIFACTS)}")
    entry = entry_dir(spec, input_override, runtime)

    def convert(staging: Path) -> None:
        run_converter(spec, input_override, runtime, staging / ARTIFACTS[runtime])

    return _cached(entry, ARTIFACTS[runtime], convert, f"the conversion of {spec} for {runtime}")


def ensure_exported(spec: str, input_override: str | None, export: Callable[[Path], dict[str, Any]]) -> Converted:
    """The cached ONNX export of `spec` that ONNX Runtime and OpenVINO are both converted from; made first, if
    needed, by `export(path)`, which writes model.onnx at `path` and returns the entry's meta (its `input`
    at least). Called in a converter's process, which has the PyTorch model loaded: exporting runs it."""
    entry = export_dir(spec, input_override)

    def make(staging: Path) -> None:
        meta = export(staging / EXPORT_ARTIFACT)
        (staging / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")

    return _cached(entry, EXPORT_ARTIFACT, make, f"the ONNX export of {spec}")


def calibration_inputs(spec: InputSpec, calibration: str | None) -> tuple[np.ndarray, str]:
    """int8's calibration inputs: the user's file, else seeded samples; and where they came from, in words."""
    if calibration:
        inputs = read_calibration(calibration, spec)
        return inputs, f"{len(inputs)} inputs of --calibration {calibration}"
    inputs = sample_input(spec, QUANTIZE_SAMPLES, seed=QUANTIZE_SAMPLES)
    return inputs, f"{QUANTIZE_SAMPLES} random sample inputs (no --calibration given)"


def ensure_quantized(spec: str, input_override: str | None, calibration: str | None) -> Converted:
    """The OpenVINO model quantized to int8 by NNCF on `calibration`'s inputs (else samples), cached."""
    if not installed("nncf"):
        raise ConfigError("int8 needs NNCF to quantize the model: pip install -e '.[openvino]' (or pip install nncf)")
    source = ensure_converted(spec, input_override, "openvino")
    if source.input.records:  # NNCF would be fed their records as one tensor: refused, not guessed at
        names = ", ".join(tensor.name for tensor in source.input.inputs)
        raise ConfigError(
            f"int8 quantizes models of one input; {spec} takes several ({names}): serve --precision fp32 or bf16"
        )
    inputs, origin = calibration_inputs(source.input, calibration)
    parts = {
        "format": CACHE_FORMAT,
        "source": source.path.parent.name,  # the OpenVINO entry's name covers the model and the versions
        "inputs": hashlib.sha256(np.ascontiguousarray(inputs).tobytes()).hexdigest(),
        "shape": list(inputs.shape),
        "nncf": _version("nncf"),
    }
    entry = cache_dir() / f"openvino-int8-{_digest(parts)[:32]}"

    def quantize(staging: Path) -> None:
        np.save(staging / "calibration.npy", inputs)
        args = ["--source", str(source.path), "--inputs", str(staging / "calibration.npy"),
                "--out", str(staging / ARTIFACTS["openvino"]), "--report", str(staging / "report.json")]  # fmt: skip
        run_step("workers.models.quantize", args, f"quantizing {spec} to int8 with NNCF")
        (staging / "calibration.npy").unlink()
        report = json.loads((staging / "report.json").read_text())
        quantization = {**report, "calibration": origin, "inputs": len(inputs)}
        meta = {**source.meta, "precision": "int8", "quantization": quantization}
        (staging / "meta.json").write_text(json.dumps(meta))

    made = _cached(entry, ARTIFACTS["openvino"], quantize, f"the int8 quantization of {spec}")
    # The entry is found by the inputs' bytes: say where this caller's came from, not the first caller's file.
    return dataclasses.replace(
        made, meta={**made.meta, "quantization": {**made.meta["quantization"], "calibration": origin}}
    )


def _cached(entry: Path, artifact: str, make: Callable[[Path], None], what: str) -> Converted:
    """The entry if it is there; else `make` it (under the lock, once) in a staging folder renamed into place.
    `artifact`: the file a runtime opens, named in ARTIFACTS (or the export's)."""
    cached = read_entry(entry, artifact)
    if cached is not None:
        return cached
    entry.parent.mkdir(parents=True, exist_ok=True)
    with _locked(entry.with_name(entry.name + ".lock")):
        cached = read_entry(entry, artifact)  # another process may have made it while we waited
        if cached is not None:
            return cached
        _make_into(entry, make, what)
    made = read_entry(entry, artifact)
    if made is None:
        raise ConversionError(f"{what} left no usable files in {entry}")
    return made


def read_entry(entry: Path, artifact: str) -> Converted | None:
    """The entry's `artifact` (model.onnx, model.xml) and input if it is complete; None if it is absent (a
    renamed-in entry is whole)."""
    try:
        meta = json.loads((entry / "meta.json").read_text())
    except (FileNotFoundError, NotADirectoryError):
        return None
    except (OSError, ValueError) as exc:
        raise ConversionError(f"cache entry {entry} is unreadable ({exc}); delete it to convert again") from exc
    path = entry / artifact
    if not path.is_file():
        raise ConversionError(f"cache entry {entry} has no {path.name}; delete it to convert again")
    return Converted(path, InputSpec.from_json(meta["input"]), meta)


def run_converter(spec: str, input_override: str | None, runtime: str, out: Path) -> None:
    """Run `python -m workers.models.convert`, or `workers.models.onnx_files` for an ONNX file (a separate
    process: conversion runs the model)."""
    args = ["--model", spec, "--runtime", runtime, "--out", str(out)]
    if input_override:
        args += ["--input", input_override]
    if model_kind(spec) == ONNX_FILE:
        run_step("workers.models.onnx_files", args, f"preparing {spec} for {runtime}")
    else:
        run_step("workers.models.convert", args, f"converting {spec} for {runtime}")


def refuse(message: str) -> None:
    """In a converter's process: say why the model is refused, for `run_step` to raise it whole."""
    print(REFUSAL_MARK + json.dumps(message), file=sys.stderr)


Converter = Callable[[str, str | None, str, Path], dict[str, Any]]  # (spec, input override, runtime, out) → meta


def converter_main(
    argv: Sequence[str] | None, module: str, doc: str, make: Converter, model_help: str, input_help: str
) -> int:
    """A converter subprocess's command line (`python -m MODULE`): make the artefact and its meta.json, or
    refuse the model so that `run_step` raises the reason whole."""
    parser = argparse.ArgumentParser(prog=f"python -m {module}", description=doc.splitlines()[0])
    parser.add_argument("--model", required=True, help=model_help)
    parser.add_argument("--runtime", required=True, choices=sorted(ARTIFACTS))
    parser.add_argument("--out", required=True, type=Path, help="the file to write (model.onnx or model.xml)")
    parser.add_argument("--input", help=input_help)
    args = parser.parse_args(argv)
    try:
        meta = make(args.model, args.input, args.runtime, args.out)
    except PackratError as exc:
        refuse(str(exc))
        return 2
    (args.out.parent / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    return 0


def run_step(module: str, args: list[str], what: str) -> None:
    """Run `python -m module args` (conversion and quantization run the model: never in the daemon's process);
    a ConversionError names `what` and ends with the child's last lines when it fails or overruns."""
    try:
        done = run_module(module, args, CONVERT_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise ConversionError(f"{what} took over {CONVERT_TIMEOUT_S:.0f} s") from None
    if done.returncode != 0:
        lines = (done.stderr or done.stdout).strip().splitlines()
        refusals = [line.removeprefix(REFUSAL_MARK) for line in lines if line.startswith(REFUSAL_MARK)]
        if refusals:
            raise ConversionError(f"{what}: {json.loads(refusals[-1])}")
        tail = "\n".join(lines[-15:])
        raise ConversionError(f"{what} failed:\n{tail}")


def _make_into(entry: Path, make: Callable[[Path], None], what: str) -> None:
    staging = Path(tempfile.mkdtemp(prefix=f".{entry.name}.tmp-", dir=entry.parent))
    try:
        make(staging)
        if not (staging / "meta.json").is_file():
            raise ConversionError(f"{what} wrote no meta.json")
        try:
            os.rename(staging, entry)  # atomic: readers see no entry or a whole one
        except OSError:
            if not entry.is_dir():  # a process that ignored the lock may have won the race; its copy is whole
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    # The lock file stays: deleting it would let a third process lock a new file while a second holds the old.
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _source_fingerprint(spec: str) -> list | None:
    """Size and mtime of the file behind a file or module:function spec, of every file in a Hugging Face
    folder (builtins have none)."""
    kind = model_kind(spec)
    if kind == BUILTIN:
        return None
    if kind == HUGGING_FACE:
        folder = hf_folder(spec)
        files = sorted(path for path in folder.rglob("*") if path.is_file()) if folder.is_dir() else []
        stats = [(path, path.stat()) for path in files]
        return [str(folder.resolve()), *([str(p.relative_to(folder)), s.st_size, s.st_mtime_ns] for p, s in stats)]
    path: str | None = spec
    if kind == FUNCTION:
        module = spec.partition(":")[0]
        try:
            found = importlib.util.find_spec(module)
        except (ImportError, ValueError):
            found = None
        path = found.origin if found is not None else None
    if path is None or not Path(path).is_file():
        return None
    stat = Path(path).stat()
    return [str(Path(path).resolve()), stat.st_size, stat.st_mtime_ns]


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None
