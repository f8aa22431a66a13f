"""The committed gRPC stubs are what grpcio-tools generates from inference.proto today, and the service is
wire-compatible with Triton's: every method and field number tritonclient uses is the same.

Generated code is committed rather than built at install time: the package then needs no protoc and no build
step, and what runs is what was reviewed. Both checks run in a subprocess: tritonclient's generated messages
and Packrat's share the `inference.` names, and one process's protobuf pool cannot hold both.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.daemons import REPO

STUBS = REPO / "packrat_daemon" / "protocol" / "grpc"
GENERATED = ("inference_pb2.py", "inference_pb2.pyi", "inference_pb2_grpc.py")


def test_the_committed_stubs_are_generated_from_the_proto(tmp_path: Path) -> None:
    pytest.importorskip("grpc_tools", reason="grpcio-tools is not installed (pip install -e '.[test]')")
    target = tmp_path / "packrat_daemon" / "protocol" / "grpc"
    target.mkdir(parents=True)
    (target / "inference.proto").write_bytes((STUBS / "inference.proto").read_bytes())
    command = [sys.executable, "-m", "grpc_tools.protoc", "-I.", "--python_out=.", "--pyi_out=.", "--grpc_python_out=."]
    subprocess.run([*command, "packrat_daemon/protocol/grpc/inference.proto"], cwd=tmp_path, check=True)
    for name in GENERATED:
        assert (target / name).read_text() == (STUBS / name).read_text(), (
            f"{name} is stale: regenerate it as inference.proto's header says"
        )


DESCRIBE = """
import json, sys
if sys.argv[1] == "triton":
    from tritonclient.grpc import service_pb2 as module
else:
    from packrat_daemon.protocol.grpc import inference_pb2 as module
def fields(message, seen):
    if message.full_name in seen:
        return
    seen[message.full_name] = {f.name: [f.number, f.type, f.label] for f in message.fields}
    for f in message.fields:
        if f.message_type is not None:
            fields(f.message_type, seen)
service = module.DESCRIPTOR.services_by_name["GRPCInferenceService"]
seen = {}
for method in service.methods:
    fields(method.input_type, seen)
    fields(method.output_type, seen)
print(json.dumps({"methods": [m.name for m in service.methods], "messages": seen}))
"""


def _describe(which: str) -> dict:
    import json

    done = subprocess.run([sys.executable, "-c", DESCRIBE, which], cwd=REPO, capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def test_every_method_and_field_matches_tritons() -> None:
    pytest.importorskip("tritonclient.grpc", reason="tritonclient is not installed (pip install -e '.[test]')")
    ours, triton = _describe("packrat"), _describe("triton")
    assert set(ours["methods"]) <= set(triton["methods"])
    for name, fields in ours["messages"].items():
        theirs = triton["messages"].get(name)
        assert theirs is not None, f"{name} is not Triton's"
        for field, numbers in fields.items():
            assert theirs.get(field) == numbers, f"{name}.{field}: ours {numbers}, Triton's {theirs.get(field)}"
