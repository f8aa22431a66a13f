#!/usr/bin/env bash
# Triton's perf_analyzer against Packrat's Open Inference Protocol frontend: a concurrency sweep over HTTP and
# over gRPC on built-in ResNet-50, each CSV kept in bench/results/ (docs/oip.md, bench/README.md).
#
#   bash bench/oip_perf_analyzer.sh     # BATCH=16 CONCURRENCY=1:4 REQUESTS=6 STABILITY=10 (INTERVAL_MS=5000)
#
# REQUESTS=N measures windows of N requests (perf_analyzer's count_windows mode); REQUESTS=0 measures time windows
# of INTERVAL_MS instead, perf_analyzer's default, which cannot settle at batch 16 on a few cores: a 5 s window
# holds one ~4 s request or two, so its throughput doubles from one window to the next (docs/oip.md).
#
# perf_analyzer is installed by bench/peers/install_perf_analyzer.sh into an environment of its own. The daemon
# serves a fixed plan (one instance on every core, batch BATCH) so that the sweep measures serving, not
# re-planning; STABILITY is perf_analyzer's --stability-percentage (raise it on a busy machine, and say so).
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
cd "$repo"
batch="${BATCH:-16}"
concurrency="${CONCURRENCY:-1:4}"
interval="${INTERVAL_MS:-5000}"
stability="${STABILITY:-10}"
requests="${REQUESTS:-6}"
if [ "$requests" -gt 0 ]; then
    window=(--measurement-mode count_windows --measurement-request-count "$requests")
else
    window=(--measurement-interval "$interval")
fi
analyzer="bench/peers/.perf_analyzer/perf_analyzer"
[ -x "$analyzer" ] || bash bench/peers/install_perf_analyzer.sh
python=".venv/bin/python"
port() { "$python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
http_port="$(port)"
grpc_port="$(port)"
run="$(mktemp -d)"
cores="$("$python" -c 'import os; print(len(os.sched_getaffinity(0)))')"
"$python" -m packrat_daemon serve --model builtin:resnet50 --endpoint "ipc://$run/front.ipc" \
    --policy fixed --plan "1*${cores}x${batch}" --max-batch "$batch" --no-adapt \
    --http-port "$http_port" --grpc-port "$grpc_port" >"$run/daemon.log" 2>&1 &
daemon=$!
trap 'kill "$daemon" 2>/dev/null; wait "$daemon" 2>/dev/null; rm -rf "$run"' EXIT
for _ in $(seq 900); do
    curl -sf -o /dev/null "http://127.0.0.1:$http_port/v2/health/ready" && break
    kill -0 "$daemon" 2>/dev/null || { cat "$run/daemon.log"; exit 1; }
    sleep 1
done
for protocol in http grpc; do
    [ "$protocol" = http ] && url="127.0.0.1:$http_port" || url="127.0.0.1:$grpc_port"
    out="bench/results/oip-perf-analyzer-$protocol.csv"
    "$analyzer" -m resnet50 -i "$protocol" -u "$url" -b "$batch" --concurrency-range "$concurrency" \
        "${window[@]}" --stability-percentage "$stability" -f "$out" | tee "bench/results/oip-perf-analyzer-$protocol.txt"
    echo "perf_analyzer over $protocol: $out"
done
echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
