#!/usr/bin/env bash
# MLPerf Inference LoadGen (mlcommons-loadgen 6.0, Python bindings) for bench/peers only, in its own environment
# (never the README's install); numpy and pyzmq for its SUTs (Packrat's ZeroMQ client imports only those).
#
#   bash bench/peers/install_loadgen.sh           # → bench/peers/.venv-loadgen
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
venv="$here/.venv-loadgen"
python3 -m venv "$venv"
"$venv/bin/pip" install --quiet "mlcommons-loadgen==6.0.17" numpy pyzmq
"$venv/bin/python" -c 'import mlperf_loadgen; print("mlcommons-loadgen", __import__("importlib.metadata").metadata.version("mlcommons-loadgen"))'
echo "LoadGen: $venv"
