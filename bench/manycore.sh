#!/usr/bin/env bash
# The real ResNet-50 end to end on a machine with at least 16 cores, in under 10 minutes:
# daemons under the packrat, single and torchserve policies, at fp32 and at the fastest precision
# (`--precision auto` chooses it for packrat; single and torchserve then serve that same precision),
# each driven by `packrat load --concurrency 1` at batch sizes 1, 4 and 16. One daemon runs at a time.
#
#   bench/manycore.sh             # writes bench/results/manycore-HOST-DATE.json
#   bench/manycore.sh --dry-run   # the same commands at tiny scale (builtin:tiny-mlp, 2 s per batch size,
#                                 # any core count), written under a temporary folder: proves they work
#
# Its JSON is there to check the emulated and simulated 16-core numbers (docs/evaluation.md) against a
# real machine: record it beside them. Environment: PYTHON (default .venv/bin/python).
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-.venv/bin/python}
if [[ ${1:-} == "--dry-run" ]]; then
  DRY=1; MODEL=builtin:tiny-mlp; BATCHES=(1 2); DURATION=2; WARMUP=0.5; MIN_CORES=1
elif [[ $# -eq 0 ]]; then
  DRY=0; MODEL=builtin:resnet50; BATCHES=(1 4 16); DURATION=15; WARMUP=2; MIN_CORES=16
else
  echo "usage: bench/manycore.sh [--dry-run]" >&2; exit 2
fi
STARTUP_TIMEOUT_S=240  # one daemon's start-up, profiling included (packrat at auto measures two precisions)

cores=$("$PY" -c 'from policies.planning.topology import Topology; print(Topology.detect().usable_cores)')
if (( cores < MIN_CORES )); then
  echo "bench/manycore.sh: this machine has $cores usable cores; the run needs at least $MIN_CORES to say" \
       "anything about many cores. Run it on a 16-core (or larger) machine, or use --dry-run here." >&2
  exit 2
fi

work=$(mktemp -d /tmp/packrat-manycore.XXXXXX)
daemon_pid=""
stop_daemon() {
  if [[ -n $daemon_pid ]] && kill -0 "$daemon_pid" 2>/dev/null; then
    kill -TERM "$daemon_pid"; wait "$daemon_pid" || true
  fi
  daemon_pid=""
}
trap 'stop_daemon' EXIT
if (( DRY )); then out="$work/manycore-dry-run.json"; else out="bench/results/manycore-$(hostname -s)-$(date -u +%Y%m%d).json"; fi
max_batch=${BATCHES[-1]}
plan_batches=$(IFS=,; echo "${BATCHES[*]}")

# run NAME POLICY PRECISION [serve args…]: start a daemon, wait until it answers info, load it per batch size.
run() {
  local name=$1 policy=$2 precision=$3; shift 3
  local endpoint="ipc://$work/$name.ipc"
  echo "== $name: starting (policy $policy, precision $precision)" >&2
  "$PY" -m packrat_daemon serve --model "$MODEL" --policy "$policy" --precision "$precision" \
      --max-batch "$max_batch" --batches "$plan_batches" --max-delay-ms 0 --run-dir "$work/run-$name" \
      --endpoint "$endpoint" "$@" >"$work/$name.log" 2>&1 &
  daemon_pid=$!
  "$PY" - "$endpoint" "$STARTUP_TIMEOUT_S" "$daemon_pid" >"$work/$name.info.json" <<'PYEOF' || { tail -20 "$work/$name.log" >&2; exit 1; }
import json, os, sys, time
from packrat_daemon.client import Client
from packrat_daemon.wire.client import ClientTimeout
endpoint, deadline, pid = sys.argv[1], time.monotonic() + float(sys.argv[2]), int(sys.argv[3])
with Client(endpoint, timeout=2.0) as client:
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            sys.exit("the daemon exited during start-up")
        try:
            print(json.dumps(client.info(timeout=2.0)))
            sys.exit(0)
        except ClientTimeout:
            continue
sys.exit("the daemon did not answer within the start-up timeout")
PYEOF
  for b in "${BATCHES[@]}"; do
    "$PY" -m packrat_daemon load --endpoint "$endpoint" --batch "$b" --concurrency 1 --duration "$DURATION" \
        --warmup "$WARMUP" --quiet --json >"$work/$name.b$b.json"
    echo "   batch $b: $("$PY" -c 'import json,sys; r=json.load(open(sys.argv[1])); print("p50", r["latency_ms"]["p50"], "ms, ok", r["ok"], "errors", r["errors"])' "$work/$name.b$b.json")" >&2
  done
  stop_daemon
}

started=$(date +%s)
run packrat-fp32 packrat fp32 --save-profile "$work/profile-fp32.csv"
run single-fp32 single fp32
run torchserve-fp32 torchserve fp32
run packrat-auto packrat auto
fastest=$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1])).get("precision", "fp32"))' "$work/packrat-auto.info.json")
if [[ $fastest != fp32 ]]; then
  run "single-$fastest" single "$fastest"
  run "torchserve-$fastest" torchserve "$fastest"
fi

"$PY" - "$work" "$out" "$MODEL" "$cores" "$fastest" "$(( $(date +%s) - started ))" "${BATCHES[@]}" <<'PYEOF'
import json, platform, sys
from pathlib import Path
work, out, model, cores, fastest, seconds, *batches = sys.argv[1:]
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), platform.processor())
runs = {}
for info_path in sorted(Path(work).glob("*.info.json")):
    name = info_path.name.removesuffix(".info.json")
    info = json.loads(info_path.read_text())
    runs[name] = {
        "runtime": info.get("runtime"), "precision": info.get("precision"), "plan": info.get("plan"),
        "by_batch": {b: json.loads((Path(work) / f"{name}.b{b}.json").read_text()) for b in batches},
    }
report = {
    "kind": "real run: packrat serve + packrat load --concurrency 1, one daemon at a time",
    "model": model, "cores": int(cores), "cpu": cpu, "fastest_precision": fastest,
    "wall_seconds": int(seconds), "runs": runs,
}
Path(out).write_text(json.dumps(report, indent=1) + "\n")
print(f"wrote {out} ({len(runs)} daemons, {seconds} s)", file=sys.stderr)
PYEOF
if (( DRY )); then echo "dry run: the JSON is in $work (not kept under bench/results)" >&2; else rm -rf "$work"; fi
