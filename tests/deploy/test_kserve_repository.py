"""deploy/kserve/repository.yaml: the repository-mode ServingRuntime and its InferenceService, validated offline
as deploy/kserve's one-model manifests are (the Kubernetes parts against the schemas, KServe's fields against
its API reference), and the runtime's flags read as `packrat serve --repository` reads them: one gateway on both
ports of the container, each model's state below the state volume, nothing each model needs its own of given to
all of them."""

from __future__ import annotations

from typing import Any

import pytest

from packrat_daemon.cli import build_parser
from packrat_daemon.commands.options import typed_settings
from packrat_daemon.config import load_config
from packrat_daemon.repository.layout import OWN_ONLY, check_shared
from packrat_daemon.repository.server import gateway_options
from tests.deploy.test_kserve import (
    KSERVE,
    MODEL_FORMAT,
    MODEL_SPEC,
    PREDICTOR_EXTENSION,
    PROTOCOLS,
    RUNTIME_SPEC,
    VERSIONS,
    as_pod,
    kubernetes_validate,
    yaml,
)


def documents() -> tuple[dict[str, Any], dict[str, Any]]:
    runtime, service = [doc for doc in yaml.safe_load_all((KSERVE / "repository.yaml").read_text()) if doc]
    return runtime, service


@pytest.mark.parametrize("version", VERSIONS)
def test_the_kubernetes_parts_are_valid_against_the_schemas(version: str) -> None:
    runtime, service = documents()
    spec = runtime["spec"]
    kubernetes_validate.validate(as_pod(spec["containers"], spec["volumes"]), version, strict=True)
    model = service["spec"]["predictor"]["model"]
    container = {"name": "kserve-container", **{k: v for k, v in model.items() if k not in MODEL_SPEC}}
    kubernetes_validate.validate(as_pod([container]), version, strict=True)


def test_the_kserve_fields_are_kserves_and_the_service_names_the_runtime() -> None:
    runtime, service = documents()
    assert (runtime["apiVersion"], runtime["kind"]) == ("serving.kserve.io/v1alpha1", "ServingRuntime")
    spec = runtime["spec"]
    assert set(spec) <= RUNTIME_SPEC and all(set(fmt) <= MODEL_FORMAT for fmt in spec["supportedModelFormats"])
    assert spec["protocolVersions"] == ["v2", "grpc-v2"] and set(spec["protocolVersions"]) <= PROTOCOLS
    assert not any(fmt["autoSelect"] for fmt in spec["supportedModelFormats"])
    assert (service["apiVersion"], service["kind"]) == ("serving.kserve.io/v1beta1", "InferenceService")
    predictor = service["spec"]["predictor"]
    assert set(predictor) <= PREDICTOR_EXTENSION
    model = predictor["model"]
    assert set(model) - {"resources"} <= MODEL_SPEC
    assert model["runtime"] == runtime["metadata"]["name"] == "packrat-repository"
    assert model["modelFormat"]["name"] in {fmt["name"] for fmt in spec["supportedModelFormats"]}


def test_the_runtimes_flags_serve_the_repository_on_the_containers_ports_and_state_volume() -> None:
    runtime, _ = documents()
    container = runtime["spec"]["containers"][0]
    assert container["command"] == ["packrat", "serve"]
    flags = typed_settings(build_parser().parse_args(["serve", *container["args"]]))
    config = load_config(flags, None)
    assert config.repository == "/mnt/models"
    options = gateway_options(config)  # checked as the repository checks it at start
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    assert (options.http_port, options.grpc_port) == (ports["http1"], ports["h2c"])
    assert str(options.metrics_port) == runtime["spec"]["annotations"]["prometheus.kserve.io/port"]
    check_shared(flags, "the runtime's flags")
    assert not set(flags) & set(OWN_ONLY)
    mounts = {mount["mountPath"] for mount in container["volumeMounts"]}
    assert config.state_dir in mounts  # each model's state in STATE_DIR/NAME on the volume
    probes = (container["readinessProbe"]["httpGet"], container["livenessProbe"]["httpGet"])
    assert [(p["path"], p["port"]) for p in probes] == [("/v2/health/ready", 8080), ("/v2/health/live", 8080)]
