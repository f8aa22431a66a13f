#!/usr/bin/env bash
# infinity-emb (Michael Feil's embedding server: a queue sorted by length, dynamic batching) for bench/peers only, in
# its own environment (never the README's install): torch installed first and pinned to the CPU build on this machine's
# disk through a constraints file, so nothing the server needs can pull another (CUDA) torch.
#
# infinity-emb 0.0.78 is the last release; its torch backend needs sentence-transformers < 4, which needs
# transformers < 5, so this environment holds transformers 4.57 while Packrat's .venv holds 5.x: the model folder
# (a `save_pretrained` BERT, bench/peers/infinity.py) loads in both.
#
#   bash bench/peers/install_infinity.sh          # → bench/peers/.venv-infinity
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
venv="$here/.venv-infinity"
python3 -m venv "$venv"
constraints="$(mktemp)"
trap 'rm -f "$constraints"' EXIT
echo "torch==2.13.0" >"$constraints"
"$venv/bin/pip" install --quiet "torch==2.13.0"
"$venv/bin/pip" install --quiet -c "$constraints" "infinity-emb[server,torch]==0.0.78" "transformers>=4.47,<5"
"$venv/bin/python" -c 'import importlib.metadata as m
for name in ("infinity-emb", "torch", "transformers", "sentence-transformers", "tokenizers", "fastapi"):
    print(name, m.version(name))'
"$venv/bin/infinity_emb" v2 --help >/dev/null
echo "infinity-emb: $venv"
