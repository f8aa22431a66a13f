"""deploy/image, read statically (the build itself is heavy and runs by hand, never here): the Containerfile pins the
CPU torch of pyproject and installs the runtimes' extras, runs as the user the manifests run as, keeps its state on
a volume and exposes the ports of the config it ships (which loads as the daemon's); every manifest names the image
build.sh builds; build.sh parses."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import tomllib

from packrat_daemon.config import load_config
from tests.deploy.test_install_lines import RUNTIME_EXTRAS
from tests.helpers.daemons import REPO

IMAGE_DIR = REPO / "deploy" / "image"


def instructions() -> list[tuple[str, str]]:
    """The Containerfile's instructions, (KEYWORD, arguments), continuation lines joined and comments left out."""
    text = re.sub(r"\\\n\s*", " ", (IMAGE_DIR / "Containerfile").read_text())
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    return [(keyword.upper(), rest.strip()) for keyword, _, rest in (line.partition(" ") for line in lines)]


def final_stage() -> list[tuple[str, str]]:
    steps = instructions()
    last = max(i for i, (keyword, _) in enumerate(steps) if keyword == "FROM")
    return steps[last:]


def json_list(text: str) -> list[str]:
    return [str(item) for item in json.loads(text)]


def torch_pin() -> str:
    dependencies = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    (pin,) = [dep for dep in dependencies if dep.startswith("torch")]
    assert re.fullmatch(r"torch==[0-9.]+", pin), f"pyproject pins torch loosely: {pin}"
    return pin.removeprefix("torch==")


def default_image() -> str:
    """The name build.sh gives the image unless told otherwise, its version read from pyproject as the script does."""
    script = (IMAGE_DIR / "build.sh").read_text()
    (default,) = re.findall(r"^IMAGE=\$\{PACKRAT_IMAGE:-([^}]+)\}", script, re.MULTILINE)
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    return default.replace("$VERSION", version)


def test_the_cpu_torch_of_pyproject_is_installed_and_pinned() -> None:
    version = torch_pin()
    runs = " ".join(rest for keyword, rest in instructions() if keyword == "RUN")
    assert f"/wheels/torch-{version}+cpu-" in runs, "the CPU wheel from the build context"
    assert f"torch=={version}" in runs, "and a constraint, so no dependency pulls the package index's CUDA build"
    assert re.search(rf"^TORCH={re.escape(version)}$", (IMAGE_DIR / "build.sh").read_text(), re.MULTILINE)


def test_the_runtimes_extras_are_installed() -> None:
    runs = " ".join(rest for keyword, rest in instructions() if keyword == "RUN")
    extras = re.findall(r"pip install [^&]*?/src\[([a-z,]+)\]", runs)
    assert extras and all(set(found.split(",")) >= RUNTIME_EXTRAS for found in extras), extras


def test_the_image_runs_as_the_user_the_manifests_run_as() -> None:
    (user,) = [rest for keyword, rest in final_stage() if keyword == "USER"]
    uid = int(user.split(":")[0])
    assert uid != 0
    runs = " ".join(rest for keyword, rest in final_stage() if keyword == "RUN")
    assert f"--uid {uid}" in runs, "the user exists in the image (a name for `id`, a home for the state)"
    for manifest in (REPO / "deploy").glob("*/*.yaml"):
        for found in re.findall(r"runAsUser: (\d+)", manifest.read_text()):
            assert int(found) == uid, manifest


def test_no_build_secret_or_compiler_in_the_image() -> None:
    """The trust store pip used and the compiler stay in the build stage; the image copies only the venv."""
    final = " ".join(f"{keyword} {rest}" for keyword, rest in final_stage())
    assert "build-ca" not in final and "PIP_CERT" not in final and "gcc" not in final
    assert "COPY --from=build /opt/packrat /opt/packrat" in final


def test_the_shipped_config_loads_and_its_ports_and_state_are_the_images() -> None:
    final = final_stage()
    (entrypoint,) = [json_list(rest) for keyword, rest in final if keyword == "ENTRYPOINT"]
    assert entrypoint[:2] == ["packrat", "serve"]
    config_path = entrypoint[entrypoint.index("--config") + 1]
    copies = dict(reversed(rest.split()) for keyword, rest in final if keyword == "COPY" and "--from" not in rest)
    assert copies[config_path] == "packrat.toml"
    config = load_config({}, str(IMAGE_DIR / "packrat.toml"))  # raises ConfigError on an unknown key or bad value
    assert config.model == "/mnt/models", "the folder KServe and a `podman run -v` put the model in"
    (volume,) = [json_list(rest) for keyword, rest in final if keyword == "VOLUME"]
    assert volume == [config.state_dir]
    (exposed,) = [rest.split() for keyword, rest in final if keyword == "EXPOSE"]
    ports = {int(port.removesuffix("/tcp")) for port in exposed}
    endpoint_port = int(config.endpoint.rsplit(":", 1)[1])
    assert ports == {config.http_port, config.grpc_port, config.metrics_port, endpoint_port}
    # Reached through published ports: bound beyond the container's loopback.
    assert config.oip_address == "0.0.0.0" and config.metrics_address == "0.0.0.0" and config.insecure_public
    env = dict(part.split("=", 1) for keyword, rest in final if keyword == "ENV" for part in shlex.split(rest))
    assert env["PACKRAT_CACHE_DIR"].startswith(config.state_dir + "/")
    assert env["PATH"].startswith("/opt/packrat/bin:")
    # podman and docker stop wait 10 s before SIGKILL: the drain fits in it.
    assert config.drain_timeout_s < 10


def test_every_manifest_names_the_image_build_sh_builds() -> None:
    image = default_image()
    found = {
        manifest.relative_to(REPO): re.findall(r"^\s*image: (\S+)", manifest.read_text(), re.MULTILINE)
        for manifest in sorted((REPO / "deploy").glob("*/*.yaml"))
    }
    assert {path.parts[1] for path, images in found.items() if images} == {"k8s", "colocation", "kserve"}
    assert all(set(images) <= {image} for images in found.values()), (image, found)


def test_build_sh_parses_and_is_not_run_by_the_install_or_ci() -> None:
    subprocess.run(["bash", "-n", str(IMAGE_DIR / "build.sh")], check=True)
    for path in (REPO / "README.md", REPO / ".ci" / "run", REPO / "pyproject.toml"):
        if path.exists():
            assert "build.sh" not in path.read_text(), path


def test_the_kserve_check_runs_exactly_the_runtimes_flags() -> None:
    """build.sh's check 4 reads the ServingRuntime's flags with sed: the very args the runtime gives, no other."""
    import yaml

    runtime = REPO / "deploy" / "kserve" / "servingruntime.yaml"
    (expression,) = re.findall(r"sed -n '([^']+)' \"\$REPO/deploy/kserve/servingruntime.yaml\"", build_script())
    read = subprocess.run(["sed", "-n", expression, str(runtime)], capture_output=True, text=True, check=True)
    container = yaml.safe_load(runtime.read_text())["spec"]["containers"][0]
    assert container["command"] == ["packrat", "serve"]
    assert read.stdout.splitlines() == container["args"]


def build_script() -> str:
    return (IMAGE_DIR / "build.sh").read_text()
