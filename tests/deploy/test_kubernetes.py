"""deploy/k8s: valid against the Kubernetes schemas (offline), Guaranteed QoS with whole CPUs, and consistent
with the daemon's own settings (the TOML loads; the probes, annotations and Service name its ports)."""

from __future__ import annotations

import os
import socket
import time
import tomllib
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest

from packrat_daemon.config import load_config
from tests.helpers.daemons import running_daemon

kubernetes_validate = pytest.importorskip(
    "kubernetes_validate", reason="kubernetes-validate is not installed (pip install -e '.[test]')"
)
yaml = pytest.importorskip("yaml", reason="PyYAML (installed with kubernetes-validate) is missing")

K8S = Path(__file__).resolve().parents[2] / "deploy" / "k8s"
# The oldest Kubernetes release the manifests are meant for, and the newest the validator knows.
VERSIONS = ["1.28.0", kubernetes_validate.latest_version()]


def manifests() -> dict[str, dict[str, Any]]:
    """Each resource by kind (one of each)."""
    resources = [doc for path in sorted(K8S.glob("*.yaml")) for doc in yaml.safe_load_all(path.read_text()) if doc]
    by_kind = {resource["kind"]: resource for resource in resources}
    assert len(by_kind) == len(resources), "one resource of each kind"
    return by_kind


@pytest.mark.parametrize("version", VERSIONS)
def test_every_manifest_is_valid_against_the_schemas(version: str) -> None:
    resources = manifests()
    assert set(resources) == {"ConfigMap", "Deployment", "Service", "NetworkPolicy"}
    for resource in resources.values():
        kubernetes_validate.validate(resource, version, strict=True)  # raises on an unknown or mistyped field


def test_a_misspelled_field_is_caught() -> None:
    """The validation above is not vacuous: strict mode rejects what a cluster would silently drop."""
    deployment = manifests()["Deployment"]
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    container["resource"] = container.pop("resources")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, VERSIONS[-1], strict=True)


def test_guaranteed_qos_with_whole_cpus_for_the_static_cpu_manager() -> None:
    pod = manifests()["Deployment"]["spec"]["template"]["spec"]
    for container in pod.get("initContainers", []) + pod["containers"]:
        resources = container["resources"]
        assert resources["requests"] == resources["limits"], container["name"]
        assert set(resources["limits"]) >= {"cpu", "memory"}, container["name"]
        cpu = str(resources["limits"]["cpu"])
        assert cpu.isdigit() and int(cpu) >= 1, f"{container['name']}: {cpu!r} is not a whole number of CPUs"


def served_config(tmp_path: Path) -> tuple[Any, dict[str, Any]]:
    """The ConfigMap's TOML as the daemon loads it, and the raw table."""
    text = manifests()["ConfigMap"]["data"]["packrat.toml"]
    path = tmp_path / "packrat.toml"
    path.write_text(text)
    return load_config({}, str(path)), tomllib.loads(text)


def test_the_config_map_is_a_config_the_daemon_loads(tmp_path: Path) -> None:
    config, _ = served_config(tmp_path)  # raises ConfigError on an unknown key or a bad value
    pod = manifests()["Deployment"]["spec"]["template"]["spec"]
    container = pod["containers"][0]
    mounts = {mount["name"]: mount["mountPath"] for mount in container["volumeMounts"]}
    assert container["command"][-1] == f"{mounts['config']}/packrat.toml"
    assert config.state_dir == mounts["state"], "the learned profile is kept on the state volume"
    assert pod["terminationGracePeriodSeconds"] > config.drain_timeout_s


def test_probes_annotations_and_service_name_the_daemons_ports(tmp_path: Path) -> None:
    config, _ = served_config(tmp_path)
    resources = manifests()
    template = resources["Deployment"]["spec"]["template"]
    container = template["spec"]["containers"][0]
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    assert ports["metrics"] == config.metrics_port and config.metrics_address == "0.0.0.0"
    assert ports["packrat"] == urlparse(config.endpoint).port
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    annotations = template["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert int(annotations["prometheus.io/port"]) == config.metrics_port
    service = resources["Service"]["spec"]
    assert service["clusterIP"] == "None", "headless: one DNS record per pod, for the multi-endpoint client"
    assert {port["targetPort"] for port in service["ports"]} == set(ports)
    labels = template["metadata"]["labels"]
    assert service["selector"].items() <= labels.items()
    assert resources["NetworkPolicy"]["spec"]["podSelector"]["matchLabels"].items() <= labels.items()


@pytest.mark.slow
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs for the daemon's plan")
def test_the_config_map_starts_a_daemon_on_every_address_with_the_probes_answering(tmp_path: Path) -> None:
    """The pod's settings, less the model, ports and state folder, start a real daemon: the plaintext bind
    on every address is allowed (insecure_public), and the probes' paths answer on the metrics address."""
    config_path = tmp_path / "packrat.toml"
    config_path.write_text(manifests()["ConfigMap"]["data"]["packrat.toml"])
    port, metrics = free_port(), free_port()
    small = ["--model", "builtin:tiny-mlp", "--max-batch", "4", "--batches", "1,4", "--split-check-rounds", "0"]
    args = ["--config", str(config_path), *small, "--metrics-port", str(metrics), "--state-dir", str(tmp_path)]
    with running_daemon(tmp_path, *args, bind=f"tcp://0.0.0.0:{port}", endpoint=f"tcp://127.0.0.1:{port}"):
        for path in ("/healthz", "/readyz"):
            deadline = time.monotonic() + 30
            while (status := probe(metrics, path)) != 200 and time.monotonic() < deadline:
                time.sleep(0.2)  # /readyz answers 503 until the planned workers serve
            assert status == 200, path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def probe(port: int, path: str) -> int:
    try:
        return urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5).status
    except urllib.error.HTTPError as error:
        return error.code
