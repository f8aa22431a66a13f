"""deploy/kserve: the ServingRuntime and the InferenceServices, validated offline, consistent with each other
and with the daemon's own flags (the model folder, both ports, the state volume), and the runtime's command
starting a daemon that serves the one model of a folder, whatever its name, and whose probes answer.

kubernetes-validate has no schema for KServe's resources, so their own fields are checked against the
fields of KServe's API reference (ServingRuntimeSpec, InferenceService's PredictorSpec and ModelSpec) and
every part that is a Kubernetes type (the containers, the model's container fields) strictly against the
Kubernetes schemas, as tests/deploy/test_kubernetes.py does for deploy/k8s.
"""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from packrat_daemon.cli import build_parser
from packrat_daemon.commands.options import typed_settings
from packrat_daemon.config import ServeConfig, load_config
from tests.helpers.daemons import daemon_env, pinned, stop_process
from tests.helpers.onnx_models import scores, two_outputs

kubernetes_validate = pytest.importorskip(
    "kubernetes_validate", reason="kubernetes-validate is not installed (pip install -e '.[test]')"
)
yaml = pytest.importorskip("yaml", reason="PyYAML (installed with kubernetes-validate) is missing")

KSERVE = Path(__file__).resolve().parents[2] / "deploy" / "kserve"
VERSIONS = ["1.28.0", kubernetes_validate.latest_version()]
# KServe's API reference: the fields of serving.kserve.io/v1alpha1 ServingRuntimeSpec, of a supported model
# format, of v1beta1 PredictorSpec (besides a PodSpec's) and of ModelSpec (besides a Container's).
RUNTIME_SPEC = {
    "supportedModelFormats", "protocolVersions", "multiModel", "grpcEndpoint", "grpcDataEndpoint",
    "httpDataEndpoint", "replicas", "storageHelper", "builtInAdapter", "disabled", "containers", "volumes",
    "nodeSelector", "affinity", "tolerations", "labels", "annotations", "imagePullSecrets", "workerSpec", "hostIPC",
}  # fmt: skip
MODEL_FORMAT = {"name", "version", "autoSelect", "priority"}
PROTOCOLS = {"v1", "v2", "grpc-v1", "grpc-v2"}
PREDICTOR_EXTENSION = {
    "minReplicas", "maxReplicas", "scaleTarget", "scaleMetric", "scaleMetricType", "containerConcurrency",
    "timeout", "canaryTrafficPercent", "logger", "batcher", "labels", "annotations", "deploymentStrategy",
    "model", "workerSpec",
}  # fmt: skip
MODEL_SPEC = {"modelFormat", "runtime", "protocolVersion", "storageUri", "storage"}
KSERVE_GRACE_S = 30  # a predictor pod's default terminationGracePeriodSeconds
# What Packrat serves, by KServe's format names: an exported program or TorchScript file, an ONNX file, a folder.
FORMATS = {"pytorch", "onnx", "huggingface"}


def load(name: str) -> dict[str, Any]:
    return yaml.safe_load((KSERVE / name).read_text())


def runtime() -> dict[str, Any]:
    return load("servingruntime.yaml")


def services() -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all((KSERVE / "inferenceservice.yaml").read_text()) if doc]


def service() -> dict[str, Any]:
    return services()[0]


def as_pod(containers: list[dict[str, Any]], volumes: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": containers, **({"volumes": volumes} if volumes else {})}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "check"}, "spec": spec}


def served_config(name: str | None = None) -> tuple[ServeConfig, list[str]]:
    """The runtime's container as the daemon reads it: its flags, {{.Name}} as KServe fills it in."""
    container = runtime()["spec"]["containers"][0]
    assert container["command"][:2] == ["packrat", "serve"]
    name = name or service()["metadata"]["name"]
    args = [arg.replace("{{.Name}}", name) for arg in container["args"]]
    parsed = build_parser().parse_args(["serve", *args])
    return load_config(typed_settings(parsed), None), args


@pytest.mark.parametrize("version", VERSIONS)
def test_the_kubernetes_parts_are_valid_against_the_schemas(version: str) -> None:
    spec = runtime()["spec"]
    kubernetes_validate.validate(as_pod(spec["containers"], spec["volumes"]), version, strict=True)
    for isvc in services():
        model = isvc["spec"]["predictor"]["model"]
        container = {"name": "kserve-container", **{k: v for k, v in model.items() if k not in MODEL_SPEC}}
        kubernetes_validate.validate(as_pod([container]), version, strict=True)


def test_a_misspelled_container_field_is_caught() -> None:
    container = dict(runtime()["spec"]["containers"][0])
    container["readinesProbe"] = container.pop("readinessProbe")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(as_pod([container]), VERSIONS[-1], strict=True)


def test_the_kserve_fields_are_kserves() -> None:
    resource = runtime()
    assert (resource["apiVersion"], resource["kind"]) == ("serving.kserve.io/v1alpha1", "ServingRuntime")
    spec = resource["spec"]
    assert set(spec) <= RUNTIME_SPEC, set(spec) - RUNTIME_SPEC
    assert all(set(fmt) <= MODEL_FORMAT for fmt in spec["supportedModelFormats"])
    assert spec["protocolVersions"] == ["v2", "grpc-v2"] and set(spec["protocolVersions"]) <= PROTOCOLS
    assert [c["name"] for c in spec["containers"]] == ["kserve-container"]
    for isvc in services():
        assert (isvc["apiVersion"], isvc["kind"]) == ("serving.kserve.io/v1beta1", "InferenceService")
        predictor = isvc["spec"]["predictor"]
        assert set(predictor) <= PREDICTOR_EXTENSION, set(predictor) - PREDICTOR_EXTENSION
        model = predictor["model"]
        assert set(model) - {"resources"} <= MODEL_SPEC, set(model) - MODEL_SPEC
        assert model["runtime"] == resource["metadata"]["name"]
        assert model["modelFormat"]["name"] in {fmt["name"] for fmt in spec["supportedModelFormats"]}
        assert model["protocolVersion"] in spec["protocolVersions"]


def test_the_runtime_takes_each_format_packrat_serves_and_an_example_serves_each() -> None:
    formats = runtime()["spec"]["supportedModelFormats"]
    assert {fmt["name"] for fmt in formats} == FORMATS
    assert not any(fmt["autoSelect"] for fmt in formats), "chosen by name, never instead of another runtime"
    assert {isvc["spec"]["predictor"]["model"]["modelFormat"]["name"] for isvc in services()} == FORMATS
    names = [isvc["metadata"]["name"] for isvc in services()]
    assert len(set(names)) == len(names)


def test_the_runtime_serves_the_model_folder_as_the_services_name() -> None:
    """/mnt/models itself, never a file name in it: the storage initializer keeps the storageUri's names."""
    config, _ = served_config()
    assert config.model == "/mnt/models"
    assert config.oip_model_name == service()["metadata"]["name"]
    assert config.http_port and config.grpc_port


def test_the_state_directory_is_on_a_volume_of_the_pod() -> None:
    config, _ = served_config()
    spec = runtime()["spec"]
    container = spec["containers"][0]
    mounts = {mount["mountPath"]: mount["name"] for mount in container["volumeMounts"]}
    assert config.state_dir in mounts, "the measured profile outlives a container restart"
    volume = {volume["name"]: volume for volume in spec["volumes"]}[mounts[config.state_dir]]
    assert "emptyDir" in volume or "persistentVolumeClaim" in volume
    env = {item["name"]: item["value"] for item in container["env"]}
    assert env["PACKRAT_CACHE_DIR"].startswith(config.state_dir + "/"), "the runtimes' conversions kept with it"


def test_probes_ports_and_annotations_name_the_daemons_own() -> None:
    config, _ = served_config()
    spec = runtime()["spec"]
    container = spec["containers"][0]
    # KServe tells the protocols apart by the port names: http1 for REST, h2c (HTTP/2 cleartext) for gRPC.
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    assert ports == {"http1": config.http_port, "h2c": config.grpc_port}
    assert container["readinessProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": config.http_port}
    assert container["livenessProbe"]["httpGet"] == {"path": "/v2/health/live", "port": config.http_port}
    assert spec["annotations"]["prometheus.kserve.io/port"] == str(config.metrics_port)
    assert spec["annotations"]["prometheus.kserve.io/path"] == "/metrics"
    # The kubelet and KServe's router reach the pod's address: bound beyond loopback, by choice or with TLS.
    assert config.oip_address == "0.0.0.0" and config.metrics_address == "0.0.0.0"
    assert config.insecure_public or config.oip_tls_cert
    assert config.drain_timeout_s < KSERVE_GRACE_S


def test_guaranteed_qos_with_whole_cpus() -> None:
    for resources in (
        runtime()["spec"]["containers"][0]["resources"],
        *(isvc["spec"]["predictor"]["model"]["resources"] for isvc in services()),
    ):
        assert resources["requests"] == resources["limits"]
        assert str(resources["limits"]["cpu"]).isdigit()


def _status(url: str) -> int:
    try:
        return urllib.request.urlopen(url, timeout=5).status
    except urllib.error.HTTPError as error:
        return error.code
    except (urllib.error.URLError, ConnectionError):
        return 0


@pytest.mark.slow
def test_the_runtimes_command_serves_the_folders_model_and_its_probes_answer(tmp_path: Path) -> None:
    """The runtime's flags, with a folder in place of /mnt/models (an ONNX file of no set name, with its external
    data), free ports and a state folder of its own, start a real daemon: the gateway is live at once, ready once
    the daemon serves, and the model answers under the InferenceService's name what it computes."""
    import tritonclient.grpc as grpcclient

    from tests.packrat_daemon.protocol.test_tritonclient import free_port

    _, args = served_config()
    models = tmp_path / "mnt-models"
    models.mkdir()
    two_outputs(models / "classifier-2024-06.onnx", external_data=True)
    http, grpc, metrics = free_port(), free_port(), free_port()
    replaced = {"--model": models, "--http-port": http, "--grpc-port": grpc, "--metrics-port": metrics,
                "--state-dir": tmp_path / "state"}  # fmt: skip
    args = [arg for arg in args if not arg.startswith(tuple(replaced))]
    args += [f"{flag}={value}" for flag, value in replaced.items()]
    profile = tmp_path / "profile.csv"
    profile.write_text("threads,batch,latency_ms\n1,1,0.2\n1,4,0.4\n")
    small = ["--runtime", "onnxruntime", "--precision", "fp32", "--max-batch", "4", "--policy", "fixed"]
    small += ["--plan", "1*1x4", "--profile", str(profile), "--endpoint", f"ipc://{tmp_path}/front.ipc"]
    command = [sys.executable, "-m", "packrat_daemon", "serve", *args, *small, *pinned([*args, *small])]
    name = service()["metadata"]["name"]
    with open(tmp_path / "daemon.log", "wb") as log:
        process = subprocess.Popen(command, env=daemon_env(), stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + 180
        while _status(f"http://127.0.0.1:{http}/v2/health/ready") != 200:
            assert process.poll() is None and time.monotonic() < deadline, (tmp_path / "daemon.log").read_text()
            time.sleep(0.3)
        assert _status(f"http://127.0.0.1:{http}/v2/health/live") == 200
        assert _status(f"http://127.0.0.1:{http}/v2/models/{name}/ready") == 200
        assert _status(f"http://127.0.0.1:{metrics}/metrics") == 200
        sample = np.random.default_rng(0).standard_normal((3, 16)).astype(np.float32)
        rpc = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc}")
        try:
            assert rpc.is_server_ready()
            tensor = grpcclient.InferInput("x", list(sample.shape), "FP32")
            tensor.set_data_from_numpy(sample)
            answer = rpc.infer(name, [tensor]).as_numpy("scores")
        finally:
            rpc.close()
        np.testing.assert_allclose(answer, scores(sample), rtol=1e-5, atol=1e-5)
    finally:
        stop_process(process, 30)
    assert process.returncode == 0, (tmp_path / "daemon.log").read_text()
    assert f"loading {models / 'classifier-2024-06.onnx'}" in (tmp_path / "daemon.log").read_text()
