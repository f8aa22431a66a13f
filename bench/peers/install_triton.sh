#!/usr/bin/env bash
# Triton Inference Server for bench/peers only, in its own environment (never the README's install):
# nvidia-pytriton 0.7 ships the tritonserver 2.51 binary and its Python backend, and needs numpy < 2; torch pinned to
# the CPU build and the same transformers as Packrat's .venv (the model is Packrat's own, built by its loader).
#
#   bash bench/peers/install_triton.sh            # → bench/peers/.venv-triton
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
venv="$here/.venv-triton"
transformers="$("$here/../../.venv/bin/python" -c 'import transformers; print(transformers.__version__)' 2>/dev/null || echo 5.24.0)"
python3 -m venv "$venv"
"$venv/bin/pip" install --quiet "torch==2.13.0" "nvidia-pytriton==0.7.0" "numpy<2" "transformers==$transformers"
# The Python-backend stub links libpython3.11.so.1.0; triton_peer.py points it at this environment's own Python.
"$venv/bin/python" -c 'import sysconfig, os; d = sysconfig.get_config_var("LIBDIR"); assert os.path.exists(os.path.join(d, "libpython3.11.so.1.0")), f"no shared libpython3.11 in {d}: build Python with --enable-shared"'
"$venv/bin/python" -c 'import pytriton, importlib.metadata as m; print("nvidia-pytriton", m.version("nvidia-pytriton"))'
echo "Triton: $venv"
