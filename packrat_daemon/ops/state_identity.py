"""What a saved profile holds for: everything that changes a measurement (docs/state.md, "What is read back").

A profile, a runtime choice and a plan are measured for one model, fed one input, computed by one version
of each library, on one set of CPUs. Each of those is a key of the identity, and a saved entry whose
identity differs in any key is not served again (`mismatch` says which key, for the log line): two daemons
of one model at two input shapes, or one daemon moved to other cores, measure their own.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
from collections.abc import Callable
from typing import Any

from packrat_daemon.config import ServeConfig
from policies.planning.topology import Topology, format_cpulist
from workers.models.spec import EMULATED, HF_PREFIX
from workers.runtimes.registry import RECORDS

# The libraries whose version changes what a runtime measures, named in its record (workers.runtimes.registry).
LIBRARIES: dict[str, tuple[str, ...]] = {record.name: record.libraries for record in RECORDS}

# The keys compared one by one, in the order a mismatch is reported; "versions" is compared per library after.
KEYS = ("model", "model_sha256", "input", "profile_sha256", "runtime", "precision", "usable_cores", "cpus")
_CHANGED = {
    "model_sha256": "the model file changed",
    "profile_sha256": "the --profile file changed",
    "input": "--input",
    "cpus": "the CPU set",
}


def identity(
    config: ServeConfig,
    runtime: str,
    precision: str,
    topology: Topology,
    digest: Callable[[str], str] | None = None,
) -> dict[str, Any]:
    """What a saved profile must match to be served again. `digest`: a file's or folder's SHA-256 (a cache of
    `content_sha256`: a start hashes the model once, not once per candidate)."""
    digest = digest or content_sha256
    model = config.model.removeprefix(HF_PREFIX)
    # A file, or a Hugging Face folder: its content, wherever it was named from. A builtin or a function is
    # its spec (and the library versions below).
    model_content = digest(model) if os.path.isfile(model) or os.path.isdir(model) else None
    # A --profile file's cells are the offline half of what was learned: another file, another start.
    profile_file = digest(config.profile) if config.profile else None
    versions = {name: _version(name) for name in LIBRARIES[runtime]}  # KeyError: a runtime not registered
    if runtime == EMULATED and config.profile:
        # An emulation's "library" is the table its workers wait and the interference they add.
        versions = {
            "emulated profile": profile_file,
            "interference": config.emulate_interference or "default",
        }
    return {
        "model": config.model,
        "model_sha256": model_content,
        # As given: None is the model's own declaration (its content, or a builtin's spec, says what it is).
        "input": config.input,
        "profile_sha256": profile_file,
        "runtime": runtime,
        "precision": precision,
        "versions": versions,
        "usable_cores": topology.usable_cores,
        # Which CPUs, not only how many: another socket, other SMT siblings, another cache measure otherwise.
        "cpus": format_cpulist(topology.cpu_ids),
    }


def mismatch(saved: dict[str, Any], current: dict[str, Any]) -> str | None:
    """Why a profile saved for `saved` cannot serve `current`, or None."""
    for key in KEYS:
        if saved.get(key) != current.get(key):
            said = _CHANGED.get(key, key)
            if key.endswith("sha256"):
                return said
            return f"{said} {saved.get(key)!r} → {current.get(key)!r}"
    old = saved.get("versions")
    old = old if isinstance(old, dict) else {}
    for name, version in (current.get("versions") or {}).items():
        if old.get(name) != version:
            return f"{name} {old.get(name)} → {version}"
    return None


def content_sha256(path: str) -> str:
    """The SHA-256 of a file's bytes; of a folder, of each file's path inside it and bytes, in name order
    (a Hugging Face folder: its weights, config and tokenizer)."""
    if not os.path.isdir(path):
        return _file_sha256(path)
    digest = hashlib.sha256()
    for root, folders, files in os.walk(path):
        folders.sort()
        for name in sorted(files):
            full = os.path.join(root, name)
            if os.path.isfile(full):  # a link to a file (the Hugging Face cache's blobs) counts as its file
                digest.update(f"{os.path.relpath(full, path)}\0{_file_sha256(full)}\0".encode())
    return digest.hexdigest()


def _file_sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None
