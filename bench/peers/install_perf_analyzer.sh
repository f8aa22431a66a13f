#!/usr/bin/env bash
# Triton's perf_analyzer for bench/ only, in its own environment (never the README's install): the wheels of
# tritonclient <= 2.51 ship the binary (newer perf-analyzer wheels need glibc 2.38). It links libcudart.so.12
# and libb64.so.0d but needs no GPU: Debian's libb64-0d and the nvidia-cuda-runtime-cu12 wheel provide them.
#
#   bash bench/peers/install_perf_analyzer.sh [PREFIX]      # default PREFIX: bench/peers/.perf_analyzer
#   PREFIX/perf_analyzer -m builtin:resnet50 -u 127.0.0.1:8000 ...   # the wrapper sets LD_LIBRARY_PATH
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
prefix="${1:-$here/.perf_analyzer}"
if ! dpkg -s libb64-0d >/dev/null 2>&1; then
    apt-get update -qq && apt-get install -y -qq libb64-0d >/dev/null
fi
python3 -m venv "$prefix/venv"
"$prefix/venv/bin/pip" install --quiet "tritonclient[http]==2.51.0" "nvidia-cuda-runtime-cu12"
site="$("$prefix/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
binary="$prefix/venv/bin/perf_analyzer"  # the wheel installs it as a script
cudart="$site/nvidia/cuda_runtime/lib"
test -x "$binary" || { echo "no perf_analyzer binary in the tritonclient wheel at $binary" >&2; exit 1; }
cat >"$prefix/perf_analyzer" <<WRAPPER
#!/usr/bin/env bash
export LD_LIBRARY_PATH="$cudart\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
exec "$binary" "\$@"
WRAPPER
chmod +x "$prefix/perf_analyzer"
"$prefix/perf_analyzer" --version 2>/dev/null | head -1 || "$prefix/perf_analyzer" --help 2>&1 | head -2
echo "perf_analyzer: $prefix/perf_analyzer"
