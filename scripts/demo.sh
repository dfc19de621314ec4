#!/usr/bin/env bash
# The main job on a real local stack: containerd (CRI) + a loopback registry seeded with an image
# built here, cri-imaged in front of containerd, and grpcurl calling EnsureImageExists twice:
# the first call pulls, the second finds the image already present.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
[ "$(id -u)" -eq 0 ] || { echo "demo: containerd needs root; run: sudo make demo" >&2; exit 1; }
"$root/scripts/install-deps.sh"
cargo build --quiet --manifest-path "$root/Cargo.toml"

dir=$(mktemp -d /tmp/cri-demo.XXXXXX)
daemon_pid=
cleanup() {
    if [ -n "$daemon_pid" ]; then
        kill -TERM "$daemon_pid" 2>/dev/null || true
        wait "$daemon_pid" 2>/dev/null || true
    fi
    "$root/scripts/local-stack.sh" stop "$dir" >/dev/null 2>&1 || true
    rm -rf "$dir"
}
trap cleanup EXIT

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
show() { printf '$'; printf ' %q' "$@"; printf '\n'; "$@"; }

step "Starting containerd (CRI) and a loopback registry in $dir"
"$root/scripts/local-stack.sh" start "$dir" >/dev/null
# shellcheck source=/dev/null
. "$dir/stack.env"
digest=$("$root/scripts/local-stack.sh" seed "$dir" demo/hello:v1 "hello from the cri-imaged demo")
image="$REGISTRY/demo/hello:v1"
echo "registry $REGISTRY holds $image ($digest)"

step "Starting cri-imaged"
socket="$dir/cri-imaged.sock"
"$root/target/debug/cri-imaged" serve --listen "$socket" --runtime-endpoint "unix://$CONTAINERD_SOCK" \
    2>"$dir/cri-imaged.log" &
daemon_pid=$!
grpc() { grpcurl -plaintext -unix "$@"; }
for _ in $(seq 100); do
    grpc "$socket" grpc.health.v1.Health/Check >/dev/null 2>&1 && break
    sleep 0.05
done
show grpcurl -plaintext -unix "$socket" list

request="{\"image\":\"$image\",\"pull_policy\":\"IF_NOT_PRESENT\",\"pod\":{\"namespace\":\"default\",\"name\":\"demo\",\"uid\":\"demo-uid\"},\"container_name\":\"hello\"}"
step "First call: the image is absent, so cri-imaged pulls it through containerd"
show grpcurl -plaintext -unix -d "$request" "$socket" imagemanager.v1.ImageManager/EnsureImageExists
step "Second call: already present"
show grpcurl -plaintext -unix -d "$request" "$socket" imagemanager.v1.ImageManager/EnsureImageExists
step "A missing image: the kubelet's reason in the error details"
missing="{\"image\":\"$REGISTRY/demo/missing:v1\",\"pull_policy\":\"IF_NOT_PRESENT\"}"
show grpcurl -plaintext -unix -d "$missing" "$socket" imagemanager.v1.ImageManager/EnsureImageExists || true

step "What cri-imaged logged"
grep -E 'Pulling image|Successfully pulled|already present|Failed to pull' "$dir/cri-imaged.log" | sed 's/\x1b\[[0-9;]*m//g'
