"""deploy/colocation: one pod, a container per model plus the coordinator, valid against the Kubernetes schemas
(offline) and consistent with the daemons' and the coordinator's own settings: every model's TOML loads, its run
dir lies on the run volume the coordinator mounts, the coordinator's --daemon flags name exactly those run dirs,
the first shares are the coordinator's own division, one user runs every container, and no CPU limit throttles a
model the coordinator grows."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from packrat_daemon.cli import build_parser
from packrat_daemon.commands.coordinate import parse_daemons
from packrat_daemon.config import load_config
from packrat_daemon.coordinate.shares import cores_of, divide, even_split
from policies.planning.topology import Topology, format_cpulist

kubernetes_validate = pytest.importorskip(
    "kubernetes_validate", reason="kubernetes-validate is not installed (pip install -e '.[test]')"
)
yaml = pytest.importorskip("yaml", reason="PyYAML (installed with kubernetes-validate) is missing")

FOLDER = Path(__file__).resolve().parents[2] / "deploy" / "colocation"
VERSIONS = ["1.28.0", kubernetes_validate.latest_version()]


def manifests() -> dict[str, dict[str, Any]]:
    resources = [doc for path in sorted(FOLDER.glob("*.yaml")) for doc in yaml.safe_load_all(path.read_text()) if doc]
    by_kind = {resource["kind"]: resource for resource in resources}
    assert len(by_kind) == len(resources), "one resource of each kind"
    return by_kind


def pod() -> dict[str, Any]:
    return dict(manifests()["Deployment"]["spec"]["template"]["spec"])


def containers() -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """The model containers by name, and the coordinator's."""
    every = {container["name"]: container for container in pod()["containers"]}
    return {name: c for name, c in every.items() if c["command"][1] == "serve"}, every["coordinator"]


@pytest.mark.parametrize("version", VERSIONS)
def test_every_manifest_is_valid_against_the_schemas(version: str) -> None:
    resources = manifests()
    assert set(resources) == {"ConfigMap", "Deployment"}
    for resource in resources.values():
        kubernetes_validate.validate(resource, version, strict=True)


def test_a_misspelled_field_is_caught() -> None:
    deployment = manifests()["Deployment"]
    deployment["spec"]["template"]["spec"]["containers"][2]["volumeMount"] = []
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, VERSIONS[-1], strict=True)


def test_each_model_is_a_daemon_the_coordinator_reaches(tmp_path: Path) -> None:
    models, coordinator = containers()
    assert len(models) >= 2
    data = manifests()["ConfigMap"]["data"]
    coordinator_mounts = {m["name"]: m["mountPath"] for m in coordinator["volumeMounts"]}
    run_dirs: dict[str, str] = {}
    firsts: dict[str, str] = {}
    for name, container in models.items():
        mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
        config_file = container["command"][-1]
        assert config_file == f"{mounts['config']}/{name}.toml"
        path = tmp_path / f"{name}.toml"
        path.write_text(data[f"{name}.toml"])
        config = load_config({}, str(path))  # raises ConfigError on an unknown key or a bad value
        assert config.run_dir is not None and config.cpus is not None
        assert mounts["run"] == coordinator_mounts["run"] and config.run_dir.startswith(mounts["run"] + "/")
        run_dirs[name], firsts[name] = config.run_dir, config.cpus
        probes = {container["readinessProbe"]["httpGet"]["port"], container["livenessProbe"]["httpGet"]["port"]}
        ports = {port["name"]: port["containerPort"] for port in container["ports"]}
        assert {ports[probe] for probe in probes} == {config.metrics_port}
    assert len(set(run_dirs.values())) == len(run_dirs), "each daemon its own run dir"
    args = build_parser().parse_args(coordinator["command"][1:])
    daemons = parse_daemons(args.daemon)
    assert daemons == [(name, f"ipc://{run_dirs[name]}/control.ipc") for name in models]
    # The first shares are what the coordinator divides its --cpus into (a node without SMT numbers its cores
    # 0..N-1), so its first look moves nothing.
    machine = Topology.synthetic(16).share(args.cpus)
    shares = divide(cores_of(machine), even_split(machine.usable_cores, len(daemons)))
    assert {name: format_cpulist(share) for (name, _), share in zip(daemons, shares, strict=True)} == firsts


def test_one_user_and_no_cpu_limit() -> None:
    spec = pod()
    assert spec["securityContext"]["runAsUser"] and spec["securityContext"]["runAsNonRoot"]
    for container in spec["containers"]:
        assert "runAsUser" not in container.get("securityContext", {}), container["name"]
        assert "cpu" not in container["resources"].get("limits", {}), container["name"]
        assert "cpu" in container["resources"]["requests"], container["name"]
