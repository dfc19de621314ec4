#!/usr/bin/env bash
# The main job on a real local stack: containerd (CRI) + a loopback registry seeded with an image
# built here, cri-imaged in front of containerd, and grpcurl calling EnsureImageExists twice:
# the first call pulls, the second finds the image already present. Then the command line: a pull
# of a bigger image with its progress, the node's images and the daemon's status.
#
# KEEP=1 (`make demo KEEP=1`) leaves the stack and the daemon up and prints the line to export, so
# that `cri-imaged images`, `pull`, `top` and `status` can be tried by hand; it prints how to stop.
#
# The binary is the one cargo reports building, so CARGO_TARGET_DIR and cargo's build.target-dir
# are honoured. If anything fails, cri-imaged's log is printed and kept. Bold headings only on a
# terminal, and not with NO_COLOR set.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
[ "$(id -u)" -eq 0 ] || { echo "demo: containerd needs root; run: sudo make demo" >&2; exit 1; }

if [ -t 1 ] && [ -z "${NO_COLOR:-}" ]; then bold=$'\033[1m' plain=$'\033[0m'; else bold='' plain=''; fi
step() { printf '\n%s== %s%s\n' "$bold" "$*" "$plain"; }
# A command as it would be typed: words that need it in single quotes (JSON stays readable).
quote() {
    local word words=()
    for word in "$@"; do
        if [[ $word =~ ^[A-Za-z0-9_./:=@%+,-]+$ ]]; then words+=("$word"); else words+=("'${word//\'/\'\\\'\'}'"); fi
    done
    printf '%s' "${words[*]}"
}
show() { printf '$ %s\n' "$(quote "$@")"; "$@"; }

"$root/scripts/install-deps.sh"

step "Building cri-imaged (cargo build; a first build takes a few minutes)"
# cargo's progress goes to stderr as usual; the JSON on stdout names the executable it built.
artifacts=$(cargo build --manifest-path "$root/Cargo.toml" --bin cri-imaged --message-format=json-render-diagnostics)
binary=$(printf '%s\n' "$artifacts" | grep '"reason":"compiler-artifact"' | grep '"kind":\["bin"\]' |
    grep '"name":"cri-imaged"' | sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -n 1)
[ -x "$binary" ] || { echo "demo: cargo did not report a cri-imaged executable" >&2; exit 1; }
echo "built $binary"

dir=$(mktemp -d /tmp/cri-demo.XXXXXX)
# The daemon's log lives outside the stack's dir, so that it outlives a failed run.
log=$(mktemp /tmp/cri-imaged-demo.XXXXXX.log)
daemon_pid=
keep=${KEEP:-0}
cleanup() {
    local status=$?
    if [ "$status" -eq 0 ] && [ "$keep" = 1 ]; then
        return
    fi
    if [ -n "$daemon_pid" ]; then
        kill -TERM "$daemon_pid" 2>/dev/null || true
        wait "$daemon_pid" 2>/dev/null || true
    fi
    "$root/scripts/local-stack.sh" stop "$dir" >/dev/null 2>&1 || true
    rm -rf "$dir"
    if [ "$status" -eq 0 ]; then
        rm -f "$log"
    elif [ -s "$log" ]; then
        printf '\ndemo: failed; cri-imaged logged (kept in %s):\n' "$log" >&2
        cat "$log" >&2
    else
        rm -f "$log"
    fi
}
trap cleanup EXIT
fail() { echo "demo: $*" >&2; exit 1; }

step "Starting containerd (CRI) and a loopback registry in $dir"
"$root/scripts/local-stack.sh" start "$dir" >/dev/null
# shellcheck source=/dev/null
. "$dir/stack.env"
digest=$("$root/scripts/local-stack.sh" seed "$dir" demo/hello:v1 "hello from the cri-imaged demo")
image="$REGISTRY/demo/hello:v1"
echo "registry $REGISTRY holds $image ($digest)"

step "Starting cri-imaged"
socket="$dir/cri-imaged.sock"
daemon=("$binary" serve --listen "$socket" --runtime-endpoint "unix://$CONTAINERD_SOCK" --root-dir "$dir/cri-imaged")
printf '$ %s 2>%s &\n' "$(quote "${daemon[@]}")" "$log"
"${daemon[@]}" 2>"$log" &
daemon_pid=$!
ready_within=15
deadline=$((SECONDS + ready_within))
until grpcurl -plaintext -unix "$socket" grpc.health.v1.Health/Check >/dev/null 2>&1; do
    if ! kill -0 "$daemon_pid" 2>/dev/null; then
        status=0
        wait "$daemon_pid" || status=$?
        daemon_pid=
        fail "cri-imaged exited with status $status before it answered on $socket"
    fi
    [ "$SECONDS" -lt "$deadline" ] || fail "cri-imaged did not answer health checks on $socket within ${ready_within}s"
    sleep 0.1
done
echo "cri-imaged answers on $socket"
show grpcurl -plaintext -unix "$socket" list

request="{\"image\":\"$image\",\"pull_policy\":\"IF_NOT_PRESENT\",\"pod\":{\"namespace\":\"default\",\"name\":\"demo\",\"uid\":\"demo-uid\"},\"container_name\":\"hello\"}"
step "First call: the image is absent, so cri-imaged pulls it through containerd"
show grpcurl -plaintext -unix -d "$request" "$socket" imagemanager.v1.ImageManager/EnsureImageExists
step "Second call: already present"
show grpcurl -plaintext -unix -d "$request" "$socket" imagemanager.v1.ImageManager/EnsureImageExists
step "A missing image: the kubelet's reason in the error details"
missing="{\"image\":\"$REGISTRY/demo/missing:v1\",\"pull_policy\":\"IF_NOT_PRESENT\"}"
# grpcurl prints a failed call on stderr; here it is the point, so it joins the rest on stdout.
show grpcurl -plaintext -unix -d "$missing" "$socket" imagemanager.v1.ImageManager/EnsureImageExists 2>&1 || true

step "What cri-imaged logged"
grep -E 'Pulling image|Successfully pulled|already present|Failed to pull' "$log"

step "The command line: a bigger image, pulled with its progress"
# 128 MiB of random bytes: big enough for the progress bar to show even on loopback.
big_digest=$("$root/scripts/local-stack.sh" seed-sized "$dir" demo/big:v1 134217728)
big="$REGISTRY/demo/big:v1"
echo "registry $REGISTRY holds $big ($big_digest)"
export CRI_IMAGED_SOCKET=$socket
cli=$(dirname "$binary")
export PATH="$cli:$PATH"
show export CRI_IMAGED_SOCKET="$socket"
show cri-imaged pull "$big"
step "The node's images, as cri-imaged sees them"
show cri-imaged images
step "The daemon's status"
show cri-imaged status

if [ "$keep" = 1 ]; then
    step "Left running (KEEP=1)"
    cat <<EOF
cri-imaged (pid $daemon_pid) serves $socket, in front of containerd at $CONTAINERD_SOCK,
with the registry $REGISTRY. Its log: $log
Try the command line:
    export PATH="$cli:\$PATH" CRI_IMAGED_SOCKET=$socket
    cri-imaged images
    cri-imaged pull $REGISTRY/demo/hello:v1
    cri-imaged top
    cri-imaged status
When done:
    kill $daemon_pid; $root/scripts/local-stack.sh stop $dir; rm -rf $dir $log
EOF
fi
