#!/usr/bin/env bash
# Build Packrat's image with no image registry, then run it and check it (docs/deploy.md, "The image").
#
#   deploy/image/build.sh [all|base|image|check]      (as root; default: all three, in that order)
#
# base:  Debian bookworm made by debootstrap from Debian's archive, imported into podman as $BASE_IMAGE.
# image: deploy/image/Containerfile on that base, from the committed checkout ($SOURCE_REF), the CPU torch wheel
#        found on this machine (or $TORCH_WHEEL, or PyTorch's CPU index) and the rest from the package index.
# check: runs the image under a CPU limit and checks, with tritonclient from a venv of its own: ready, an
#        inference over REST and gRPC (an ONNX file of an arbitrary name in /mnt/models, answers compared with
#        numpy's), the state volume read back by a second start, SIGTERM under load (no request lost), and the
#        KServe runtime's own command and flags serving the same folder.
#
# Heavy (a few GB downloaded, minutes of CPU): run by hand, never in CI or the README's install. Settings, from
# the environment:
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
VERSION=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$REPO/pyproject.toml")
IMAGE=${PACKRAT_IMAGE:-registry.example.com/packrat:$VERSION}  # what deploy/k8s, colocation and kserve name
BASE_IMAGE=${PACKRAT_BASE_IMAGE:-localhost/packrat-base:bookworm}
WORK=${PACKRAT_IMAGE_WORK:-/var/tmp/packrat-image}  # rootfs, build context, client venv, check results
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
SOURCE_REF=${PACKRAT_SOURCE_REF:-HEAD}
TORCH_WHEEL=${TORCH_WHEEL:-}
BUILD_CA=${PACKRAT_BUILD_CA:-/etc/ssl/certs/ca-certificates.crt}  # what pip trusts while building
CHECK_CPUS=${PACKRAT_CHECK_CPUS:-2}
CHECK_PORT=${PACKRAT_CHECK_PORT:-18080}  # REST; gRPC, metrics and ZeroMQ on the next three ports
set -euo pipefail

TORCH=2.13.0
PYTHON_TAG=cp311  # Debian bookworm's python3 is 3.11
say() { printf '\n== %s\n' "$*" >&2; }

need() {  # need COMMAND DEBIAN-PACKAGE: install the package when the command is missing
    command -v "$1" >/dev/null && return
    say "installing $2"
    apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$2"
}

podman_args() {
    # Two things of some hosts (containers in a VM, CI runners) that stop a container from starting; each is
    # met only where it is found, so a plain host runs podman as it is.
    RUNTIME=()
    LIMITS=()
    # crun refuses cgroup v1 with controllers left on the v2 hierarchy ("cgroups in hybrid mode not supported,
    # drop all controllers from cgroupv2"); runc supports that layout.
    if [[ -n $(cat /sys/fs/cgroup/unified/cgroup.controllers 2>/dev/null) ]]; then  # (its size reads 0)
        need runc runc
        RUNTIME=(--runtime "$(command -v runc)")  # a path: `podman build` takes no runtime by name
    fi
    # Without CAP_SYS_RESOURCE, root cannot raise a hard limit, and podman asks for 1048576 open files (and
    # lowers its own process limit to 32768 first): crun/runc fail with "setrlimit RLIMIT_NOFILE: Operation not
    # permitted". Ask for what this shell already has instead.
    local caps
    caps=$((16#$(awk '/^CapEff/ {print $2}' /proc/self/status)))
    if (((caps >> 24 & 1) == 0)); then
        local nproc
        nproc=$(ulimit -Hu)
        [[ $nproc == unlimited || $nproc -gt 32768 ]] && nproc=32768
        LIMITS=(--ulimit "nofile=$(ulimit -Hn):$(ulimit -Hn)" --ulimit "nproc=$nproc:$nproc")
    fi
}

build_base() {
    need debootstrap debootstrap
    need podman podman
    local rootfs=$WORK/rootfs
    say "debootstrap bookworm (minbase) from $MIRROR into $rootfs"
    rm -rf "$rootfs"
    mkdir -p "$WORK"
    debootstrap --variant=minbase bookworm "$rootfs" "$MIRROR"
    cat >"$rootfs/etc/apt/sources.list" <<EOF
deb $MIRROR bookworm main
deb $MIRROR bookworm-updates main
deb http://security.debian.org/debian-security bookworm-security main
EOF
    rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
    say "importing it as $BASE_IMAGE"
    tar -C "$rootfs" --numeric-owner -c . |
        podman import --change 'CMD ["/bin/bash"]' --message "debootstrap --variant=minbase bookworm $MIRROR" \
            - "$BASE_IMAGE"
    rm -rf "$rootfs"
}

find_torch_wheel() {  # prints the path of the CPU torch wheel for Python 3.11, downloading it when none is found
    local name="torch-$TORCH+cpu-$PYTHON_TAG-$PYTHON_TAG-manylinux_2_28_x86_64.whl"
    if [[ -n $TORCH_WHEEL ]]; then
        echo "$TORCH_WHEEL"
        return
    fi
    local found
    found=$(find /opt/wheels "${PIP_FIND_LINKS:-/opt/wheels}" "$HOME/.cache/pip" -name "$name" 2>/dev/null |
        head -1 || true)
    if [[ -z $found ]]; then
        say "no $name on this machine: from PyTorch's CPU index"
        mkdir -p "$WORK/download"
        pip download --no-deps --only-binary=:all: --python-version 3.11 --platform manylinux_2_28_x86_64 \
            --index-url https://download.pytorch.org/whl/cpu -d "$WORK/download" "torch==$TORCH+cpu" >&2
        found=$WORK/download/$name
    fi
    echo "$found"
}

build_image() {
    need podman podman
    podman_args
    local context=$WORK/context commit wheel
    commit=$(git -C "$REPO" rev-parse "$SOURCE_REF")
    say "build context in $context: $SOURCE_REF ($commit; uncommitted changes are not in the image)"
    rm -rf "$context"
    mkdir -p "$context/src" "$context/wheels"
    git -C "$REPO" archive "$commit" | tar -x -C "$context/src"
    cp "$context/src/deploy/image/Containerfile" "$context/src/deploy/image/packrat.toml" "$context/"
    wheel=$(find_torch_wheel)
    cp "$wheel" "$context/wheels/"
    cp "$BUILD_CA" "$context/build-ca.crt"
    say "building $IMAGE on $BASE_IMAGE"
    # The host's network for the build's downloads (Debian's archive, the package index) only.
    podman build "${RUNTIME[@]}" "${LIMITS[@]}" --network host --build-arg "BASE=$BASE_IMAGE" \
        --label "org.opencontainers.image.version=$VERSION" --label "org.opencontainers.image.revision=$commit" \
        --tag "$IMAGE" "$context"
    podman image inspect --format '{{.Size}}' "$IMAGE" | awk -v image="$IMAGE" \
        '{printf "%s: %.0f MB (%.2f GiB) uncompressed\n", image, $1 / 1e6, $1 / 2^30}' | tee "$WORK/size.txt"
}

check_image() {
    need podman podman
    podman_args
    local venv=$WORK/client-venv models=$WORK/models/classifier state=packrat-check-state
    local http=$CHECK_PORT grpc=$((CHECK_PORT + 1)) metrics=$((CHECK_PORT + 2)) zmq=$((CHECK_PORT + 3))
    if [[ ! -x $venv/bin/python ]]; then
        say "tritonclient in a venv of its own: $venv"
        python3 -m venv "$venv"
        "$venv/bin/pip" install -q "tritonclient[http,grpc]" numpy onnx
    fi
    local check=("$venv/bin/python" "$REPO/deploy/image/check.py")
    export PYTHONPATH=$REPO  # check.py uses tests/helpers' ONNX model and closed-loop clients
    rm -rf "$models"
    mkdir -p "$models"
    "${check[@]}" model "$models"
    chmod -R a+rX "$models"  # onnx writes external data 0600: the image's user (10001) must read the model
    podman rm -f packrat-check >/dev/null 2>&1 || true
    podman volume rm -f "$state" >/dev/null 2>&1 || true
    run() {  # run PODMAN-OPTION... -- SERVE-FLAG...: detached, under the CPU limit, its ports on loopback
        local options=()
        while [[ $1 != -- ]]; do
            options+=("$1")
            shift
        done
        shift
        podman run "${RUNTIME[@]}" -d --name packrat-check --cpus "$CHECK_CPUS" "${LIMITS[@]}" \
            -p "127.0.0.1:$http:8080" -p "127.0.0.1:$grpc:8081" -p "127.0.0.1:$metrics:9464" \
            -p "127.0.0.1:$zmq:5555" -v "$state:/var/lib/packrat" "${options[@]}" "$IMAGE" "$@"
    }
    local onnx=(--oip-model-name classifier --max-batch 8)
    say "1. the ONNX file in /mnt/models, over REST and gRPC, with --cpus $CHECK_CPUS"
    run -v "$models:/mnt/models:ro" -- "${onnx[@]}" >/dev/null
    "${check[@]}" infer --container packrat-check --http "127.0.0.1:$http" --grpc "127.0.0.1:$grpc" \
        --model classifier --wait-log 'candidate \S+: served' --out "$WORK/check-infer.json"
    podman stop --time 30 packrat-check >/dev/null
    podman logs packrat-check >"$WORK/check-1.log" 2>&1
    podman rm packrat-check >/dev/null
    say "2. a second start on the same state volume"
    run -v "$models:/mnt/models:ro" -- "${onnx[@]}" >/dev/null
    "${check[@]}" restart --container packrat-check --http "127.0.0.1:$http" --model classifier \
        --expect-log 'restored from the state file' --out "$WORK/check-restart.json"
    podman stop --time 30 packrat-check >/dev/null
    podman logs packrat-check >"$WORK/check-2.log" 2>&1
    podman rm packrat-check >/dev/null
    say "3. SIGTERM under REST and gRPC load (builtin:tiny-mlp on torch)"
    run -- --model builtin:tiny-mlp --runtime torch --precision fp32 --oip-model-name tiny-mlp >/dev/null
    "${check[@]}" drain --container packrat-check --http "127.0.0.1:$http" --grpc "127.0.0.1:$grpc" \
        --model tiny-mlp --out "$WORK/check-drain.json"
    podman logs packrat-check >"$WORK/check-3.log" 2>&1
    podman rm packrat-check >/dev/null
    podman volume rm "$state" >/dev/null
    say "4. the KServe runtime's own command and flags (deploy/kserve/servingruntime.yaml), on a fresh volume"
    local kserve
    mapfile -t kserve < <(sed -n 's/^ *- \(--.*\)$/\1/p' "$REPO/deploy/kserve/servingruntime.yaml")
    run -v "$models:/mnt/models:ro" --entrypoint packrat -- serve "${kserve[@]//\{\{.Name\}\}/classifier}" >/dev/null
    "${check[@]}" infer --container packrat-check --http "127.0.0.1:$http" --grpc "127.0.0.1:$grpc" \
        --model classifier --wait-log 'candidate \S+: served' --out "$WORK/check-kserve.json"
    podman stop --time 30 packrat-check >/dev/null
    podman logs packrat-check >"$WORK/check-4.log" 2>&1
    podman rm packrat-check >/dev/null
    podman volume rm "$state" >/dev/null
    say "passed; results and logs in $WORK (check-*.json, check-*.log)"
}

case "${1:-all}" in
all) build_base && build_image && check_image ;;
base) build_base ;;
image) build_image ;;
check) check_image ;;
*)
    echo "usage: $0 [all|base|image|check]" >&2
    exit 2
    ;;
esac
