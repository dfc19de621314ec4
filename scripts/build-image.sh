#!/usr/bin/env bash
# Builds the container image of the Dockerfile with Debian's buildah, offline: the image is FROM
# scratch, so nothing is pulled. The binary is built outside (cargo) and staged here with what it
# needs at run time: the dynamic loader and the libraries `ldd` names (none for a static binary).
# Nothing else: the kubelet's probes are HTTP GETs on the metrics port, so the image needs no shell
# and no gRPC client.
#
# Usage: scripts/build-image.sh [--binary PATH] [--tag NAME] [--storage DIR]
#   --binary PATH  the cri-imaged to put in the image (default: `cargo build --release` first, then
#                  the release binary)
#   --tag NAME     the image's name (default: localhost/cri-imaged:VERSION, as the DaemonSet names it)
#   --storage DIR  buildah's image store (default: buildah's own, /var/lib/containers/storage)
# Needs root (buildah with chroot isolation and vfs storage needs no user namespaces or overlay
# mounts, so it works inside a container too). To load the image into a node's containerd:
#   buildah push --storage-driver vfs localhost/cri-imaged:0.1.0 \
#       oci-archive:cri-imaged.tar:localhost/cri-imaged:0.1.0
#   ctr -n k8s.io images import cri-imaged.tar
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

binary=""
tag=""
storage=()
while [ $# -gt 0 ]; do
    case "$1" in
        --binary) binary="$2"; shift 2 ;;
        --tag) tag="$2"; shift 2 ;;
        --storage) storage=(--root "$2/root" --runroot "$2/runroot"); shift 2 ;;
        *) echo "build-image: unknown argument $1 (see the usage at the top of $0)" >&2; exit 2 ;;
    esac
done

die() { echo "build-image: $*" >&2; exit 1; }
command -v buildah >/dev/null || die "buildah is not installed (scripts/install-deps.sh installs it)"
command -v python3 >/dev/null || die "python3 is not installed"

if [ -z "$binary" ]; then
    target_dir=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
    binary="$target_dir/release/cri-imaged"
    echo "build-image: cargo build --release --locked --bin cri-imaged" >&2
    cargo build --release --locked --bin cri-imaged
fi
[ -x "$binary" ] || die "$binary is not an executable"
version=$("$binary" --version | awk '{print $2}')
tag=${tag:-localhost/cri-imaged:$version}

# Copies the program $1 to $2 in the build context, with its loader and libraries.
stage_program() {
    install -D -m 0755 "$1" "$context/rootfs$2"
    # `ldd` prints "name => /path (addr)" for each library and "/path (addr)" for the loader;
    # a static program has neither.
    { ldd "$1" 2>/dev/null || true; } | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}' |
        while read -r lib; do
            [ -e "$context/rootfs$lib" ] || install -D -m 0755 "$(readlink -f "$lib")" "$context/rootfs$lib"
        done
}

context=$(mktemp -d)
trap 'rm -rf "$context"' EXIT
cp Dockerfile "$context/"
stage_program "$binary" /usr/local/bin/cri-imaged

echo "build-image: building $tag from $binary" >&2
buildah "${storage[@]}" --storage-driver vfs bud --isolation chroot --pull-never \
    --tag "$tag" --file "$context/Dockerfile" "$context"
