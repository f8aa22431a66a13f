#!/usr/bin/env bash
# TorchServe 0.12 for bench/peers only, in its own environment (never the README's install): torch pinned to the
# CPU build, the same transformers as Packrat's .venv (its handler builds Packrat's own models), and a Java runtime.
#
#   bash bench/peers/install_torchserve.sh        # → bench/peers/.venv-torchserve
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
venv="$here/.venv-torchserve"
transformers="$("$here/../../.venv/bin/python" -c 'import transformers; print(transformers.__version__)' 2>/dev/null || echo 5.24.0)"
if ! command -v java >/dev/null 2>&1; then
    apt-get update -qq && apt-get install -y -qq openjdk-17-jre-headless >/dev/null
fi
python3 -m venv "$venv"
# pyzmq: the handler loads the model through workers.models.loading, which imports the wire codec (pyzmq).
"$venv/bin/pip" install --quiet "torch==2.13.0" "torchserve==0.12.0" "torch-model-archiver==0.12.0" \
    "transformers==$transformers" numpy pyzmq
"$venv/bin/torchserve" --version 2>/dev/null | tail -1 || true
echo "TorchServe: $venv"
