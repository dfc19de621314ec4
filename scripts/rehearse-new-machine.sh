#!/usr/bin/env bash
# Runs scripts/install-deps.sh as on a new machine, and fails if it does not finish in time or
# leaves a process behind (issue 56: a check that started a containerd and waited on it forever).
#
# In a private mount and PID namespace, empty tmpfs cover what a new machine lacks and what a
# daemon started by mistake would find or take: the extracted runtimes (/opt/cri-imaged-test), and
# containerd's default state and socket (/var/lib/containerd, /run/containerd), so that neither a
# runtime extracted before nor a containerd already serving the default socket hides the defect.
# Debian's packages, pip's, npm's and cargo's tools are the machine's own and stay visible: each has
# a check that runs without them (`make lint` with a CARGO_HOME of its own rehearses cargo's).
#
# Root. REHEARSAL_SECONDS bounds install-deps (900 unless set). Measured on 2 cores: 241 s on a new
# machine (Debian's packages, PyPI's, npm's, cargo-fuzz and cargo-deny built), 14 s for the three
# .debs alone once the rest is in. Nothing written under the tmpfs is kept.
set -euo pipefail

limit=${REHEARSAL_SECONDS:-900}
repo=$(cd "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd)
[ "$(id -u)" -eq 0 ] || { echo "rehearse-new-machine: needs root (mount and PID namespaces)" >&2; exit 1; }

hidden=(/opt/cri-imaged-test /var/lib/containerd /run/containerd)
# The mount points must exist; an empty directory left on the host is all this changes there.
mkdir -p "${hidden[@]}"

# Inside, this shell is PID 1 of a namespace of its own: when it exits the kernel ends whatever is
# left in it, so a stray daemon dies with the rehearsal instead of outliving it.
exec unshare --mount --pid --fork --mount-proc --propagation private \
    bash -s -- "$repo" "$limit" "${hidden[@]}" <<'INSIDE'
set -euo pipefail
repo=$1 limit=$2
shift 2
for dir in "$@"; do
    mount -t tmpfs -o mode=0755 rehearsal "$dir"
done

start=$SECONDS
rc=0
timeout --kill-after=10 "$limit" "$repo/scripts/install-deps.sh" </dev/null || rc=$?
took=$((SECONDS - start))

# Every process of the namespace but this shell, read with builtins only (a ps would list itself).
left=()
for proc in /proc/[0-9]*; do
    pid=${proc#/proc/}
    [ "$pid" = 1 ] && continue
    args=()
    mapfile -d '' args <"$proc/cmdline" 2>/dev/null || continue
    [ ${#args[@]} -gt 0 ] || continue
    left+=("pid $pid: ${args[*]}")
done

status=0
if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    echo "rehearse-new-machine: install-deps did not finish within ${limit} s" >&2
    status=1
elif [ "$rc" -ne 0 ]; then
    echo "rehearse-new-machine: install-deps failed (exit $rc) after ${took} s" >&2
    status=1
fi
if [ ${#left[@]} -gt 0 ]; then
    echo "rehearse-new-machine: install-deps left ${#left[@]} process(es) behind:" >&2
    printf '  %s\n' "${left[@]}" >&2
    status=1
fi
for dir in "$@"; do
    if [ "$dir" = /opt/cri-imaged-test ]; then
        for tool in containerd-trixie/usr/bin/containerd containerd-sid/usr/bin/containerd cosign-trixie/usr/bin/cosign; do
            [ -x "$dir/$tool" ] || { echo "rehearse-new-machine: install-deps did not extract $dir/$tool" >&2; status=1; }
        done
    elif [ -n "$(ls -A "$dir")" ]; then
        # A daemon that ran, however briefly, leaves its state or socket here.
        echo "rehearse-new-machine: something wrote into $dir: $(ls -A "$dir" | head -5 | tr '\n' ' ')" >&2
        status=1
    fi
done
[ "$status" -eq 0 ] && echo "rehearse-new-machine: install-deps finished in ${took} s (rc 0), no process left behind, nothing in /var/lib/containerd or /run/containerd"
exit "$status"
INSIDE
