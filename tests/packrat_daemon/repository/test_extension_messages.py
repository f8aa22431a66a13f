"""The repository extension's gRPC messages: the committed module is what grpcio-tools generates from
repository.proto, and each message has Triton's own fields and numbers (tritonclient's service_pb2), so that
Triton's clients speak to it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from packrat_daemon.repository import repository_pb2
from tests.helpers.daemons import REPO

HERE = REPO / "packrat_daemon" / "repository"
MESSAGES = ("ModelRepositoryParameter", "RepositoryIndexRequest", "RepositoryIndexResponse",
            "RepositoryModelLoadRequest", "RepositoryModelLoadResponse", "RepositoryModelUnloadRequest",
            "RepositoryModelUnloadResponse")  # fmt: skip


def test_the_committed_messages_are_generated_from_the_proto(tmp_path: Path) -> None:
    pytest.importorskip("grpc_tools", reason="grpcio-tools is not installed (pip install -e '.[test]')")
    target = tmp_path / "packrat_daemon" / "repository"
    target.mkdir(parents=True)
    (target / "repository.proto").write_bytes((HERE / "repository.proto").read_bytes())
    command = [sys.executable, "-m", "grpc_tools.protoc", "-I.", "--python_out=.", "--pyi_out=."]
    subprocess.run([*command, "packrat_daemon/repository/repository.proto"], cwd=tmp_path, check=True)
    for name in ("repository_pb2.py", "repository_pb2.pyi"):
        assert (target / name).read_text() == (HERE / name).read_text(), f"{name} is stale: regenerate it"


def fields(descriptor: object) -> list[tuple[str, int, int]]:
    found = [(f.name, f.number, f.type) for f in descriptor.fields]  # type: ignore[attr-defined]
    for nested in descriptor.nested_types:  # type: ignore[attr-defined]
        found += [(f"{nested.name}.{name}", number, kind) for name, number, kind in fields(nested)]
    return found


@pytest.mark.parametrize("name", MESSAGES)
def test_each_message_is_tritons(name: str) -> None:
    """Field by field (the wire carries numbers and types, not the package); both imported in one process."""
    service_pb2 = pytest.importorskip("tritonclient.grpc.service_pb2")
    ours, theirs = getattr(repository_pb2, name).DESCRIPTOR, getattr(service_pb2, name).DESCRIPTOR
    assert ours.name == theirs.name and fields(ours) == fields(theirs)
