"""The client-only install (clients/python: `packrat-client`): the client imports nothing but numpy, pyzmq and the
modules the distribution lists, and, installed alone into a fresh venv, answers a real daemon without torch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import numpy as np
import pytest

from packrat_daemon.wire.client import Client
from tests.helpers.daemons import REPO, running_daemon

DISTRIBUTION = REPO / "clients" / "python"
# What the full install depends on besides numpy and pyzmq, and the runtimes: hidden from the import below, so a
# client that came to need one of them fails here, not on a client host.
NOT_FOR_THE_CLIENT = ("torch", "transformers", "scipy", "skopt", "psutil", "prometheus_client", "grpc", "google",
                      "uvicorn", "httptools", "onnxruntime", "onnx", "openvino", "nncf", "workers",
                      "policies")  # fmt: skip

# The modules Cython's runtime registers for pyzmq's compiled backend (no files: part of pyzmq).
CYTHON = ("_cython_", "cython_runtime")

IMPORT_THE_CLIENT = f"""
import json, sys
before = set(sys.modules)
for name in {NOT_FOR_THE_CLIENT!r}:
    sys.modules[name] = None  # `import name` now raises ImportError
import packrat_daemon.client
from packrat_daemon.client import AsyncClient, Client
loaded = sorted(name for name in set(sys.modules) - before if sys.modules[name] is not None)
print(json.dumps(loaded))
"""


def listed_modules() -> set[str]:
    """The modules packrat-client ships: its py-modules and the packages that hold them."""
    settings = tomllib.loads((DISTRIBUTION / "pyproject.toml").read_text())["tool"]["setuptools"]
    modules = set(settings["py-modules"])
    return modules | {module.rsplit(".", k)[0] for module in modules for k in range(1, module.count(".") + 1)}


def test_the_client_imports_only_numpy_pyzmq_and_the_modules_packrat_client_ships() -> None:
    result = subprocess.run([sys.executable, "-c", IMPORT_THE_CLIENT], cwd=REPO, capture_output=True, text=True,
                            timeout=60)  # fmt: skip
    assert result.returncode == 0, f"the client needs a package the client-only install lacks:\n{result.stderr}"
    loaded = set(json.loads(result.stdout))
    ours = {name for name in loaded if name.split(".")[0] == "packrat_daemon"}
    missing = ours - listed_modules()
    assert not missing, f"the client imports {sorted(missing)}: add them to clients/python/pyproject.toml's py-modules"
    third_party = {name.split(".")[0] for name in loaded} - set(sys.stdlib_module_names) - {"packrat_daemon"}
    third_party = {name for name in third_party if not name.startswith(CYTHON)}
    assert third_party <= {"numpy", "zmq"}, f"the client imports {sorted(third_party - {'numpy', 'zmq'})}"
    assert "packrat_daemon.wire.server_side" not in loaded and "packrat_daemon.client" in loaded


def test_packrat_client_ships_only_modules_that_exist() -> None:
    for module in listed_modules():
        path = REPO / Path(*module.split("."))
        assert path.with_suffix(".py").is_file() or (path / "__init__.py").is_file(), module


USE_THE_CLIENT = """
import asyncio, importlib.util, json, sys
import numpy as np
from packrat_daemon.client import AsyncClient, Client
endpoint, batch = sys.argv[1], np.array(json.loads(sys.argv[2]), np.float32)
with Client(endpoint, timeout=30) as client:
    info = client.info()
    blocking = client.infer(batch)
async def main():
    async with AsyncClient(endpoint, timeout=30) as client:
        return await asyncio.gather(*(client.infer(batch) for _ in range(3)))
answers = asyncio.run(main())
import packrat_daemon
print(json.dumps({"torch": importlib.util.find_spec("torch") is not None, "model": info["model"],
                  "blocking": blocking.tolist(), "async": [a.tolist() for a in answers],
                  "home": packrat_daemon.__file__}))
"""


@pytest.mark.slow
def test_a_fresh_venv_with_only_packrat_client_infers_against_a_real_daemon(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "VIRTUAL_ENV")}
    install = subprocess.run([str(python), "-m", "pip", "install", "--quiet", str(DISTRIBUTION)], env=env,
                             capture_output=True, text=True, timeout=600)  # fmt: skip
    assert install.returncode == 0, install.stderr
    listed = subprocess.run([str(python), "-m", "pip", "list", "--format=json"], env=env, capture_output=True,
                            text=True, check=True, timeout=60)  # fmt: skip
    installed = {package["name"].lower() for package in json.loads(listed.stdout)}
    assert {"packrat-client", "numpy", "pyzmq"} <= installed and "torch" not in installed
    assert not installed & {"packrat", "transformers", "onnxruntime", "openvino", "scipy"}

    batch = np.random.default_rng(0).standard_normal((2, 16)).astype(np.float32)
    args = ["--model", "builtin:tiny-mlp", "--policy", "single", "--max-batch", "8"]
    with running_daemon(tmp_path, *args) as (endpoint, _):
        used = subprocess.run([str(python), "-c", USE_THE_CLIENT, endpoint, json.dumps(batch.tolist())], env=env,
                              cwd=tmp_path, capture_output=True, text=True, timeout=120)  # fmt: skip
        assert used.returncode == 0, used.stderr
        with Client(endpoint, timeout=30) as client:  # the same request through the full install's client
            expected = client.infer(batch)
    report = json.loads(used.stdout)
    assert report["torch"] is False and report["model"] == "builtin:tiny-mlp"
    assert Path(report["home"]).is_relative_to(venv)  # the installed copy, not the checkout's
    np.testing.assert_allclose(report["blocking"], expected, rtol=1e-5, atol=1e-6)
    for answer in report["async"]:
        np.testing.assert_allclose(answer, expected, rtol=1e-5, atol=1e-6)
