#!/usr/bin/env bash
# local-stack.sh - throwaway, loopback-only test stack for cri-imaged:
#   * a distribution v2 registry (docker-registry) on 127.0.0.1:<free port>, plain HTTP, no auth
#     (or HTTP Basic auth against an htpasswd file: start --htpasswd FILE, see "Authenticated registry")
#   * a private containerd (runs as root) whose CRI plugin (runtime.v1) pulls from that registry and runs
#     pods and containers with runc (see "Containers")
#
# Usage:
#   local-stack.sh start [--htpasswd FILE] [--image-fs-mib N] DIR
#                                             start both daemons in the background, write DIR/stack.env;
#                                             with --htpasswd the registry demands HTTP Basic auth (see below);
#                                             with --image-fs-mib containerd's root is a tmpfs of N MiB (below)
#   local-stack.sh stop  DIR                  remove pods, stop the daemons (TERM, then KILL), kill what is left
#                                             in the stack's cgroup, unmount leftovers; idempotent
#   local-stack.sh restart-containerd DIR     start the stack's containerd again after it died (chaos tests kill
#                                             it), same config and log; wait for its CRI; print its pid
#   [REGISTRY_CREDS=USER:PASS] local-stack.sh seed [--user USER] DIR NAME:TAG [TEXT]
#                                             build a 1-layer OCI image (config User = USER), push it, print its
#                                             manifest digest
#   [REGISTRY_CREDS=USER:PASS] local-stack.sh seed-sized DIR NAME:TAG BYTES
#                                             push a 1-layer image of BYTES random bytes (/data) and a static
#                                             program that sleeps until killed (/sleep-forever, its entrypoint);
#                                             print its manifest digest. A new image on every call.
#
# DIR must consist of [A-Za-z0-9._/+-] only (it is pasted into TOML/YAML/skopeo refs unquoted) and must be
# short enough that DIR/containerd.sock.ttrpc fits in a unix socket path (< 108 bytes).
# State persists in DIR across stop/start (registry blobs, containerd images/content); use a fresh DIR for a
# clean slate. start reuses the previous run's registry port when it is still free, so image names stay valid.
#
# Files in DIR:
#   stack.env              REGISTRY, CONTAINERD_SOCK, REGISTRY_LOG, REGISTRY_PID, CONTAINERD_PID, CONTAINERD_LOG,
#                          CONTAINERD_ROOT, CGROUP_PARENT, STACK_DIR, SANDBOX_IMAGE, SANDBOX_DIGEST,
#                          IMAGE_FS, IMAGE_FS_MIB (the last four only when they apply), ... (KEY=VALUE)
#   registry.yml           generated registry config;  registry-data/  its storage
#   registry.log           registry stdout+stderr (access log + logrus lines), truncated on every start
#   containerd.toml        generated containerd config; containerd-root/ containerd-state/ opt/ cni/
#   image-fs/              with --image-fs-mib: the tmpfs; containerd's root is image-fs/root (lost on stop)
#   runc/                  runc's state (--root) for this containerd's containers
#   bin/sleep-forever      the static sleeping program of the sandbox and seed-sized images (and its source)
#   containerd.sock(.ttrpc) containerd gRPC / ttrpc sockets; containerd.log its log
#   certs.d/127.0.0.1:PORT/hosts.toml   CRI registry host config (plain http, pull+resolve)
#   run/*.pid              pids written by the launch wrapper;  *.log.prev  logs of the previous run
#
# Registry access log: distribution v2.8 wraps its handler in gorilla's CombinedLoggingHandler writing to
# *stdout* (Apache "combined" format); the logrus application log goes to stderr. Both are redirected into
# registry.log. An access-log line looks like:
#   127.0.0.1 - - [22/Nov/2026:10:07:12 +0000] "HEAD /v2/demo/hello/manifests/v1 HTTP/1.1" 200 528 "" "containerd/1.6.20~ds1"
#   <client> - <user> [<time>] "<METHOD> <request-uri> <proto>" <status> <bytes> "<referer>" "<user-agent>"
# Count manifest resolutions/fetches of one repository (access-log lines only; the logrus lines quote the
# uri differently and do not match):
#   grep -cE '"(GET|HEAD) /v2/demo/hello/manifests/[^ ]+ HTTP/[0-9.]+"' "$REGISTRY_LOG"
# (by tag only: .../manifests/v1 HTTP; by digest only: .../manifests/sha256:...; append
# '.*"containerd/' to ignore skopeo/curl). A cold CRI pull of a tag = HEAD manifests/<tag> + GET
# manifests/sha256:<digest>; if containerd already has the manifest content, only the HEAD.
#
# Authenticated registry (start --htpasswd FILE):
#   FILE holds "user:hash" lines (blank lines and lines starting with # are skipped); every hash must be bcrypt
#   ($2y$/$2a$/$2b$ - distribution 2.8 verifies nothing else), e.g. with htpasswd(1) from Debian's apache2-utils:
#     htpasswd -Bbn alice s3cret >users.htpasswd;  htpasswd -Bb users.htpasswd bob hunter2
#   start copies FILE to DIR/registry.htpasswd (the registry reads it once, at start) and adds to registry.yml
#     auth: {htpasswd: {realm: cri-imaged-local, path: DIR/registry.htpasswd}}
#   Every /v2/ request without valid Basic credentials then gets 401 + WWW-Authenticate: Basic
#   realm="cri-imaged-local"; the readiness probe expects that 401. stack.env gains
#   REGISTRY_HTPASSWD=DIR/registry.htpasswd and REGISTRY_REALM=cri-imaged-local (absent without --htpasswd).
#   A later start without --htpasswd runs the registry open again (and removes DIR/registry.htpasswd).
#   seed and seed-sized push with env REGISTRY_CREDS=USER:PASS (required for such a stack), handed to skopeo
#   in a 0600 auth file inside DIR/seed.*, not on its command line.
#   containerd 1.6 needs no extra config: the AuthConfig of CRI PullImage (PullImageRequest.auth: username,
#   password) answers the Basic challenge. A credentialed pull sends each first request of a resolve and of a
#   fetch without credentials (401), then repeats it with them; bad credentials are retried 5 times (6 x 401).
#   Log level is debug in this mode (the registry's env override REGISTRY_LOG_LEVEL=info turns it down),
#   because the access log's <user> field stays "-" and no info line names the user of a *successful*
#   request; at debug each authenticated manifest request logs "msg=GetImageManifest auth.user.name=USER".
#   A rejected login logs (level=error) "error authenticating user \"USER\": authentication failure" - the
#   same for a wrong password and an unknown user. Credentials used by containerd's pulls, in order:
#     grep -E 'useragent="?containerd/' "$REGISTRY_LOG" | sed -nE \
#       -e 's/.*msg="error authenticating user \\"([^"\\]*)\\": authentication failure".*/fail \1/p' \
#       -e 's/.* msg=GetImageManifest auth\.user\.name=("?)([^" ]*)\1 .*/ok \2/p' | uniq
#   A pull without credentials leaves only a 401 line and a warning "... invalid authorization credential"
#   (as does the first request of every credentialed pull). Passwords appear in neither log.
#
# Containers: every start (except with --htpasswd) can run pods through CRI with runc (cgroupfs driver, runc
# state in DIR/runc). While containerd starts, start builds DIR/bin/sleep-forever (gcc; no libc on x86_64 and
# arm64: a pause(2) loop, 4 KiB) and pushes REGISTRY/pause:3.9, a 1-layer image of it alone (CRI size 905
# bytes), which containerd.toml names as sandbox_image; containerd 1.6 pulls it on the first RunPodSandbox and
# does not mark it pinned (CRI Status with verbose = true shows it as sandboxImage in info's "config"). Clients
# must ask for
#   * host networking (PodSandboxConfig linux.security_context.namespace_options.network = NODE): no CNI;
#   * linux.cgroup_parent = CGROUP_PARENT of stack.env, a cgroup of this DIR that stop empties and removes.
# restrict_oom_score_adj = true, as root here may lack CAP_SYS_RESOURCE. sleep-forever, as any PID 1 without a
# handler, ignores SIGTERM: stop containers with timeout 0 (SIGKILL). Any CRI client will do, for example the
# tests' grpcio runner (tests/clients/cri_calls.py: a JSON array of calls on stdin, one JSON answer a line on
# stdout; see its docstring), from the repository's root:
#   pod='{"metadata": {"name": "p", "uid": "p-1", "namespace": "default"}, "log_directory": "DIR/logs/p",
#     "linux": {"cgroup_parent": "CGROUP_PARENT", "security_context": {"namespace_options": {"network": "NODE"}}}}'
#   echo "[{\"method\": \"runtime.v1.RuntimeService/RunPodSandbox\", \"request\": {\"config\": $pod}}]" |
#       python3 tests/clients/cri_calls.py DIR/containerd.sock proto     # {"ok":{"pod_sandbox_id":"ID"}}
# then ImageService/PullImage of the container's image (CreateContainer does not pull), RuntimeService/
# CreateContainer {"pod_sandbox_id": ID, "config": {"metadata": {"name": "c"}, "image": {"image": IMAGE},
# "log_path": "c.log"}, "sandbox_config": POD}, StartContainer {"container_id": ...}.
# stop removes every pod through CRI first (with that runner, when python3 can import grpc and grpc_tools), then
# deletes any task left with ctr.
# Outside DIR, a shim still makes /run/containerd/s/ (containerd 1.6 puts shim sockets there, unconfigurable).
#
# Small image filesystem (start --image-fs-mib N): a tmpfs of N MiB is mounted on DIR/image-fs and
# containerd's whole root (content store, snapshots, metadata) is DIR/image-fs/root, so CRI ImageFsInfo names
# DIR/image-fs/root/io.containerd.snapshotter.v1.native, whose statfs gives N MiB of capacity. stop unmounts
# it (its images are gone with it). What it costs, measured with containerd 1.6.20 and the native snapshotter:
#   empty containerd                   24 KiB
#   pull of a seed-sized BYTES image   2 x BYTES + 56..152 KiB: compressed blob + unpacked snapshot + metadata
#                                      (its CRI size, ListImages: BYTES + ~1.4..1.8 KiB)
#   pull of the sandbox image          56 KiB;  RunPodSandbox 24 KiB
#   CreateContainer                    the image's unpacked size again (native copies the rootfs)
#   CRI RemoveImage / RemovePodSandbox gives it back at once (containerd 1.6 deletes synchronously)
# ImageFsInfo's used_bytes counts snapshots only and is refreshed every 10 s (stats_collect_period).
#
# Environment knobs: START_TIMEOUT (s, default 30), STOP_TIMEOUT (s, default 10), GRPCURL (default grpcurl),
# CONTAINERD_BIN (default containerd), REGISTRY_BIN (default docker-registry). A CONTAINERD_BIN outside PATH
# (one extracted from another Debian suite by install-deps.sh) brings its shim and ctr beside it; a
# containerd 2.x gets a config of version 3 (its CRI plugin split into io.containerd.cri.v1.images and
# .runtime, and the transfer service told to unpack for this platform, without which every pull fails with
# "no unpack platforms defined").

set -euo pipefail

PROG=${0##*/}
START_TIMEOUT=${START_TIMEOUT:-30}
STOP_TIMEOUT=${STOP_TIMEOUT:-10}
GRPCURL=${GRPCURL:-grpcurl}
CONTAINERD_BIN=${CONTAINERD_BIN:-containerd}
REGISTRY_BIN=${REGISTRY_BIN:-docker-registry}
CONTAINERD_DIR=$(dirname "$(command -v "$CONTAINERD_BIN" || echo "$CONTAINERD_BIN")")
CTR=$CONTAINERD_DIR/ctr
[[ -x $CTR ]] || CTR=ctr
PATH=$CONTAINERD_DIR:$PATH

die() {
    printf '%s: error: %s\n' "$PROG" "$*" >&2
    exit 1
}

note() {
    printf '%s: %s\n' "$PROG" "$*" >&2
}

usage() {
    cat >&2 <<EOF
usage: $PROG start [--htpasswd FILE] [--image-fs-mib N] DIR
                                           start registry + containerd (CRI, runc) in the background
                                           (--htpasswd: registry demands Basic auth, bcrypt entries;
                                           --image-fs-mib: containerd's root on a tmpfs of N MiB)
       $PROG stop  DIR                     remove pods, stop them; idempotent
       $PROG restart-containerd DIR        start containerd again after it died; print its pid
       $PROG seed  [--user USER] DIR NAME:TAG [CONTENT]
                                           push a 1-layer OCI image, print its manifest digest
       $PROG seed-sized DIR NAME:TAG BYTES push an image of BYTES random bytes that runs /sleep-forever
       (seed/seed-sized push with env REGISTRY_CREDS=USER:PASS if set; required for an --htpasswd stack)
EOF
    exit 2
}

need_cmd() {
    local c
    for c in "$@"; do
        command -v "$c" >/dev/null 2>&1 || die "required command not found: $c"
    done
}

need_root() {
    [[ $EUID -eq 0 ]] || die "must run as root (containerd needs it)"
}

# Canonicalise DIR (creating it when asked) and validate it.
resolve_dir() {
    local raw=$1 create=$2
    [[ -n $raw ]] || die "DIR must not be empty"
    # validate the would-be path first so that a bad DIR is not created, then the real one
    check_dir "$(realpath -m -- "$raw")"
    if [[ $create == yes ]]; then
        mkdir -p -- "$raw"
    fi
    [[ -d $raw ]] || die "no such directory: $raw"
    DIR=$(cd -- "$raw" && pwd -P)
    check_dir "$DIR"
}

check_dir() {
    local d=$1
    [[ $d =~ ^/[A-Za-z0-9._/+-]*$ ]] || die "DIR may only contain [A-Za-z0-9._/+-]: $d"
    [[ $d != / ]] || die "refusing to use / as DIR"
    local longest="$d/containerd.sock.ttrpc"
    ((${#longest} < 108)) || die "DIR too long for unix sockets (${#longest} >= 108 bytes): $longest"
}

# ---------------------------------------------------------------------------------------------------------
# process helpers

# alive PID: true if the process exists and is not a zombie.
alive() {
    local pid=$1 stat
    [[ $pid =~ ^[0-9]+$ ]] || return 1
    { read -r stat <"/proc/$pid/stat"; } 2>/dev/null || return 1
    stat=${stat##*) }
    [[ ${stat%% *} != Z ]]
}

# is_ours PID KIND: PID is a live process of KIND belonging to this DIR.
#   registry   : argv0 basename contains "registry"      and an argument == DIR/registry.yml
#   containerd : argv0 basename == containerd            and an argument == DIR/containerd.toml
#   shim       : argv0 basename starts with containerd-shim and an argument == DIR/containerd.sock
is_ours() {
    local pid=$1 kind=$2 argv0 want a found=1
    alive "$pid" || return 1
    local -a args=()
    { mapfile -d '' -t args <"/proc/$pid/cmdline"; } 2>/dev/null || return 1
    ((${#args[@]} > 0)) || return 1
    argv0=${args[0]##*/}
    case $kind in
        registry)
            [[ $argv0 == *registry* ]] || return 1
            want="$DIR/registry.yml"
            ;;
        containerd)
            [[ $argv0 == containerd ]] || return 1
            want="$DIR/containerd.toml"
            ;;
        shim)
            [[ $argv0 == containerd-shim* ]] || return 1
            want="$DIR/containerd.sock"
            ;;
        *) return 1 ;;
    esac
    for a in "${args[@]:1}"; do
        if [[ $a == "$want" ]]; then
            found=0
            break
        fi
    done
    return "$found"
}

# find_ours KIND: print pids of KIND for this DIR (pid file first, then a scan of /proc by exact argument).
find_ours() {
    local kind=$1 pid f
    local -A seen=()
    if [[ -f $DIR/run/$kind.pid ]]; then
        pid=$(<"$DIR/run/$kind.pid")
        if is_ours "$pid" "$kind"; then
            seen[$pid]=1
            echo "$pid"
        fi
    fi
    for f in /proc/[0-9]*; do
        pid=${f#/proc/}
        [[ -n ${seen[$pid]:-} || $pid == "$$" ]] && continue
        if is_ours "$pid" "$kind"; then
            seen[$pid]=1
            echo "$pid"
        fi
    done
}

# terminate PID...: TERM, wait up to STOP_TIMEOUT, then KILL and wait up to 5 s more.
terminate() {
    (($# > 0)) || return 0
    local pid deadline
    local -a left=()
    kill -TERM "$@" 2>/dev/null || true
    deadline=$((SECONDS + STOP_TIMEOUT))
    while :; do
        left=()
        for pid in "$@"; do alive "$pid" && left+=("$pid"); done
        ((${#left[@]} == 0)) && return 0
        ((SECONDS >= deadline)) && break
        sleep 0.2
    done
    note "still alive after ${STOP_TIMEOUT}s, sending KILL: ${left[*]}"
    kill -KILL "${left[@]}" 2>/dev/null || true
    deadline=$((SECONDS + 5))
    while ((SECONDS < deadline)); do
        local any=0
        for pid in "${left[@]}"; do alive "$pid" && any=1; done
        ((any == 0)) && return 0
        sleep 0.2
    done
    die "processes survived KILL: ${left[*]}"
}

# launch NAME LOG CMD...: start CMD in a new session, stdin from /dev/null, stdout+stderr appended to LOG.
# The wrapper shell writes its own pid to DIR/run/NAME.pid and then execs CMD, so the pid is CMD's pid even
# if setsid(1) has to fork.
launch() {
    local name=$1 log=$2
    shift 2
    rm -f -- "$DIR/run/$name.pid"
    # shellcheck disable=SC2016 # $$ / $0 / $@ are expanded by the inner shell on purpose
    setsid bash -c 'echo "$$" >"$0" && exec "$@"' "$DIR/run/$name.pid" "$@" </dev/null >>"$log" 2>&1 &
    local deadline=$((SECONDS + 5))
    until [[ -s $DIR/run/$name.pid ]]; do
        ((SECONDS < deadline)) || die "$name: launcher did not write its pid file"
        sleep 0.05
    done
    cat -- "$DIR/run/$name.pid"
}

# unmount everything mounted strictly below DIR, deepest first.
unmount_below() {
    local -a mps=()
    local mp
    # mountinfo field 5 is the mount point, with space/tab/newline/backslash octal-escaped
    while IFS= read -r mp; do
        mp=$(printf '%b' "$mp")
        [[ $mp == "$DIR"/* ]] && mps+=("$mp")
    done < <(awk '{print $5}' /proc/self/mountinfo)
    ((${#mps[@]} > 0)) || return 0
    while IFS= read -r mp; do
        note "unmounting $mp"
        umount -- "$mp" 2>/dev/null || umount -l -- "$mp" || note "warning: could not unmount $mp"
    done < <(printf '%s\n' "${mps[@]}" | awk '{print length($0) "\t" $0}' | sort -rn | cut -f2-)
}

# pick_port [PREFERRED]: print PREFERRED if it can be bound on 127.0.0.1 right now, else a kernel-chosen
# free port. (Reusing the previous run's port keeps image names stable across restarts of one DIR.)
pick_port() {
    python3 -c 'import socket, sys
pref = int(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1].isdigit() else 0
for port in ([pref] if pref else []) + [0]:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # like Go listeners: TIME_WAIT is no obstacle
    try:
        s.bind(("127.0.0.1", port))
    except OSError:
        s.close()
        continue
    print(s.getsockname()[1])
    s.close()
    break' "$@"
}

log_tail() {
    local f=$1
    printf '%s\n' "----- last lines of $f -----" >&2
    tail -n 25 -- "$f" >&2 2>/dev/null || true
    printf '%s\n' "-----" >&2
}

# ---------------------------------------------------------------------------------------------------------
# containers and the image filesystem

SLEEPER=sleep-forever # /sleep-forever: the entrypoint of the sandbox image and of seed-sized images
SANDBOX_REF=pause:3.9 # start pushes REGISTRY/pause:3.9, containerd's sandbox_image

# stack_cgroup: the cgroup (path below each hierarchy's root) this stack's pods go under: clients pass it as
# PodSandboxConfig.linux.cgroup_parent (stack.env CGROUP_PARENT); stop kills what is left in it, removes it.
stack_cgroup() {
    local h
    h=$(printf '%s' "$DIR" | sha256sum)
    echo "/cri-imaged-${h:0:12}"
}

# build_sleeper: DIR/bin/sleep-forever, a static program that sleeps until killed. As a container's PID 1 it
# has no signal handler, so SIGTERM is ignored and only SIGKILL ends it (CRI StopContainer with timeout 0
# sends SIGKILL at once). No libc on x86_64 and arm64 (a pause(2) / ppoll(2) loop, 4 KiB); elsewhere
# glibc's pause(), linked -static (~700 KiB).
build_sleeper() {
    need_cmd gcc
    local out=$DIR/bin/$SLEEPER src
    mkdir -p -- "$DIR/bin"
    case $(gcc -dumpmachine) in
        x86_64-*)
            src=$out.S
            cat >"$src" <<'EOF'
        .text
        .globl _start
_start:
        mov $34, %eax           # pause()
        syscall
        jmp _start
EOF
            ;;
        aarch64-*)
            src=$out.S
            cat >"$src" <<'EOF'
        .text
        .globl _start
_start:
        mov x0, #0              // ppoll(NULL, 0, NULL, NULL): no pause() on arm64
        mov x1, #0
        mov x2, #0
        mov x3, #0
        mov x8, #73
        svc #0
        b _start
EOF
            ;;
        *)
            src=$out.c
            printf '#include <unistd.h>\nint main(void) { for (;;) pause(); }\n' >"$src"
            ;;
    esac
    local -a nolibc=()
    [[ $src == *.S ]] && nolibc=(-nostdlib)
    # a private name, then rename: seed-sized may run beside another build
    gcc -static -s -Os "${nolibc[@]}" -Wl,--build-id=none -o "$out.$$" "$src" || die "gcc could not build $src"
    mv -f -- "$out.$$" "$out"
}

# cri_tasks: print the ids of containerd's tasks in the CRI namespace (k8s.io).
cri_tasks() {
    timeout 10 "$CTR" --address "$DIR/containerd.sock" --namespace k8s.io tasks ls --quiet 2>/dev/null || true
}

# cri_calls SECONDS: make the calls of stdin (a JSON array) on this stack's containerd with the tests' grpcio
# runner (tests/clients/cri_calls.py and proto/ of the clone this script is in), killed after SECONDS; print
# its answers, one JSON line a call.
cri_calls() {
    local root
    root="$(dirname -- "$(realpath -- "${BASH_SOURCE[0]}")")/.."
    timeout "$1" python3 "$root/tests/clients/cri_calls.py" "$DIR/containerd.sock" "$root/proto"
}

# remove_pods_through_cri: ListPodSandbox, then StopPodSandbox (it kills the pod's containers with SIGKILL) and
# RemovePodSandbox for each pod; fails when a call does.
remove_pods_through_cri() {
    local listed planned answers answer failed=0
    listed=$(echo '[{"method": "runtime.v1.RuntimeService/ListPodSandbox", "request": {}, "timeout_ms": 10000}]' |
        cri_calls 30) || return 1
    # the pods' ids on a line, then their calls (one JSON array)
    planned=$(python3 -c 'import json, sys
answer = json.loads(sys.stdin.read())
if "ok" not in answer:
    sys.exit(f"ListPodSandbox: {answer}")
ids = [pod["id"] for pod in answer["ok"].get("items", [])]
print(" ".join(ids))
methods = ("runtime.v1.RuntimeService/StopPodSandbox", "runtime.v1.RuntimeService/RemovePodSandbox")
calls = [{"method": m, "request": {"pod_sandbox_id": i}, "timeout_ms": 20000} for i in ids for m in methods]
print(json.dumps(calls))' <<<"$listed") || return 1
    [[ -n ${planned%%$'\n'*} ]] || return 0
    note "removing pods through CRI: ${planned%%$'\n'*}"
    answers=$(cri_calls 90 <<<"${planned#*$'\n'}") || return 1
    while IFS= read -r answer; do
        [[ $answer == '{"ok":'* ]] || {
            note "warning: ${answer:0:300}"
            failed=1
        }
    done <<<"$answers"
    return "$failed"
}

# remove_pods: while containerd runs, remove every pod through CRI when python3 has grpcio (the tests' runner,
# see cri_calls), then kill and delete any task left in namespace k8s.io with ctr (all of them when CRI could
# not be used). The shims exit once their tasks are deleted; runc's state (DIR/runc) goes with them.
remove_pods() {
    local sock=$DIR/containerd.sock
    if ! timeout 30 python3 -c 'import grpc, grpc_tools' 2>/dev/null; then
        note "warning: python3 cannot import grpc and grpc_tools: no pods removed through CRI (tasks are, below)"
    elif ! remove_pods_through_cri; then
        note "warning: removing pods through CRI failed (their tasks are deleted below)"
    fi
    local -a tasks=()
    local t
    mapfile -t tasks < <(cri_tasks)
    ((${#tasks[@]} > 0)) || return 0
    note "deleting tasks left: ${tasks[*]}"
    # (one may vanish meanwhile: the CRI plugin deletes a task whose process exited)
    for t in "${tasks[@]}"; do
        timeout 10 "$CTR" --address "$sock" --namespace k8s.io tasks delete --force "$t" >/dev/null 2>&1 || true
    done
    mapfile -t tasks < <(cri_tasks)
    ((${#tasks[@]} == 0)) || note "warning: could not delete tasks ${tasks[*]}"
}

# cgroup_cleanup: SIGKILL whatever is left in the stack's cgroup (say, containers whose shim died) and remove
# the cgroup in every hierarchy (cgroup v1: one per controller; v2: /sys/fs/cgroup itself).
cgroup_cleanup() {
    local cg hier d
    cg=$(stack_cgroup)
    local -a dirs=() pids=()
    for hier in /sys/fs/cgroup /sys/fs/cgroup/*/; do
        d=${hier%/}$cg
        [[ -d $d ]] && dirs+=("$d")
    done
    ((${#dirs[@]} > 0)) || return 0
    mapfile -t pids < <(find "${dirs[@]}" -name cgroup.procs -exec cat -- {} + 2>/dev/null | sort -un)
    if ((${#pids[@]} > 0)); then
        note "killing processes left in cgroup $cg: ${pids[*]}"
        kill -KILL "${pids[@]}" 2>/dev/null || true
        local pid deadline=$((SECONDS + 5)) any=1
        while ((any == 1 && SECONDS < deadline)); do
            any=0
            for pid in "${pids[@]}"; do alive "$pid" && any=1; done
            ((any == 0)) || sleep 0.1
        done
    fi
    # deepest first; rmdir of a cgroup ignores its control files
    find "${dirs[@]}" -depth -type d -exec rmdir -- {} + 2>/dev/null || note "warning: could not remove cgroup $cg"
}

# mount_image_fs MIB: a fresh tmpfs of MIB MiB on DIR/image-fs (containerd's root goes there).
mount_image_fs() {
    local mib=$1 mp=$DIR/image-fs
    mkdir -p -- "$mp"
    if mountpoint -q -- "$mp"; then
        note "unmounting the previous image filesystem $mp"
        umount -- "$mp" || die "could not unmount $mp"
    fi
    mount -t tmpfs -o "size=${mib}m,mode=0711" cri-imaged-image-fs "$mp" || die "could not mount a tmpfs on $mp"
}

# ---------------------------------------------------------------------------------------------------------
# config writers

write_registry_config() {
    local port=$1
    {
    cat <<EOF
# generated by $PROG - do not edit
version: 0.1
log:
  level: $REG_LOG_LEVEL
  formatter: text
  accesslog:
    disabled: false      # Apache combined format on stdout -> registry.log
  fields:
    service: registry
storage:
  filesystem:
    rootdirectory: $DIR/registry-data
  delete:
    enabled: true
  cache:
    blobdescriptor: inmemory
http:
  addr: 127.0.0.1:$port
  headers:
    X-Content-Type-Options: [nosniff]
EOF
    if [[ $REG_AUTH == htpasswd ]]; then
        cat <<EOF
auth:
  htpasswd:
    realm: $REG_REALM
    path: $DIR/registry.htpasswd
EOF
    fi
    } >"$DIR/registry.yml"
}

# check_htpasswd FILE: every entry is user:bcrypt-hash (distribution 2.8 only verifies bcrypt; anything
# else would make every login with that user fail, which is hard to tell from a wrong password).
check_htpasswd() {
    local f=$1 line n=0 entries=0 user hash
    [[ -f $f && -r $f ]] || die "htpasswd file not readable: $f"
    while IFS= read -r line || [[ -n $line ]]; do
        n=$((n + 1))
        line=${line%$'\r'}
        # distribution trims whitespace, skips empty lines and lines starting with #
        [[ $line =~ ^[[:space:]]*$ || $line =~ ^[[:space:]]*# ]] && continue
        [[ $line == *:* ]] || die "$f:$n: not a user:hash entry"
        user=${line%%:*}
        hash=${line#*:}
        hash=${hash%"${hash##*[![:space:]]}"}
        user=${user#"${user%%[![:space:]]*}"}
        [[ -n $user ]] || die "$f:$n: empty user name"
        [[ $hash =~ ^\$2[aby]\$[0-9][0-9]\$[./A-Za-z0-9]{53}$ ]] ||
            die "$f:$n: hash of user '$user' is not bcrypt (the registry only accepts bcrypt; use htpasswd -B)"
        entries=$((entries + 1))
    done <"$f"
    ((entries > 0)) || die "$f: no user:hash entries"
}

# Only `server`: containerd 1.6 counts a [host] entry for the same URL as a second endpoint and would
# try a failed resolution twice, which would blur the registry's count of manifest resolutions.
write_certs_d() {
    local port=$1 host="127.0.0.1:$1"
    rm -rf -- "$DIR/certs.d"
    mkdir -p -- "$DIR/certs.d/$host"
    cat >"$DIR/certs.d/$host/hosts.toml" <<EOF
# generated by $PROG
server = "http://$host"
EOF
}

# write_containerd_config: DIR/containerd.toml for CONTAINERD_ROOT and SANDBOX_IMAGE (empty: containerd's
# default, which cannot be pulled here, so no pod can run).
write_containerd_config() {
    if "$CONTAINERD_BIN" --version | grep -q ' v\?2\.'; then
        write_containerd_config_v3
        return
    fi
    local sandbox_line=""
    [[ -z $SANDBOX_IMAGE ]] || sandbox_line="sandbox_image = \"$SANDBOX_IMAGE\""
    {
        containerd_config_common 2 aufs
        cat <<EOF

  [plugins."io.containerd.grpc.v1.cri"]
    disable_tcp_service = true
    stream_server_address = "127.0.0.1"
    stream_server_port = "0"
    # pushed by start (see "Containers"); not pinned by containerd 1.6
    $sandbox_line
    # root without CAP_SYS_RESOURCE cannot lower oom_score_adj: keep containers at containerd's own or above
    restrict_oom_score_adj = true
    # No CNI: pods must use the host's network namespace. The CRI plugin still creates/watches conf_dir
    # (default /etc/cni/net.d) and logs "no network config found" - harmless; point it into DIR so the host
    # is left untouched.
    [plugins."io.containerd.grpc.v1.cri".cni]
      bin_dir = "$DIR/cni/bin"
      conf_dir = "$DIR/cni/net.d"

    [plugins."io.containerd.grpc.v1.cri".containerd]
      snapshotter = "native"
      default_runtime_name = "runc"

      # runc with the cgroupfs driver (no systemd here); its state under DIR instead of /run/containerd/runc
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"
        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
          SystemdCgroup = false
          Root = "$DIR/runc"

    [plugins."io.containerd.grpc.v1.cri".registry]
      config_path = "$DIR/certs.d"
EOF
    } >"$DIR/containerd.toml"
}

# write_containerd_config_v3: the same for containerd 2.x (config version 3).
write_containerd_config_v3() {
    local sandbox_line=""
    [[ -z $SANDBOX_IMAGE ]] || sandbox_line="sandbox = \"$SANDBOX_IMAGE\""
    {
        containerd_config_common 3 erofs
        cat <<EOF

  [plugins."io.containerd.cri.v1.images"]
    snapshotter = "native"
    [plugins."io.containerd.cri.v1.images".pinned_images]
      $sandbox_line
    [plugins."io.containerd.cri.v1.images".registry]
      config_path = "$DIR/certs.d"

  [plugins."io.containerd.cri.v1.runtime"]
    restrict_oom_score_adj = true
    [plugins."io.containerd.cri.v1.runtime".cni]
      bin_dirs = ["$DIR/cni/bin"]
      conf_dir = "$DIR/cni/net.d"
    [plugins."io.containerd.cri.v1.runtime".containerd]
      default_runtime_name = "runc"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"
        snapshotter = "native"
        [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
          SystemdCgroup = false
          Root = "$DIR/runc"

  [plugins."io.containerd.grpc.v1.cri"]
    disable_tcp_service = true
    stream_server_address = "127.0.0.1"
    stream_server_port = "0"

  [plugins."io.containerd.transfer.v1.local"]
    [[plugins."io.containerd.transfer.v1.local".unpack_config]]
      platform = "linux/amd64"
      snapshotter = "native"

  # On by default in 2.x, on one socket for the whole machine: two stacks at once would collide.
  [plugins."io.containerd.nri.v1.nri"]
    socket_path = "$DIR/nri.sock"
EOF
    } >"$DIR/containerd.toml"
}

# containerd_config_common VERSION SNAPSHOTTER: a config's head for either version (its root and state, the
# snapshotters that cannot work here, SNAPSHOTTER the one only that version has), the sockets, the log level
# and the opt plugin's directory.
containerd_config_common() {
    cat <<EOF
# generated by $PROG - private containerd (config version $1): the CRI image service, and pods/containers with runc
version = $1
root = "$CONTAINERD_ROOT"
state = "$DIR/containerd-state"
# Snapshotters that cannot work here (no aufs module / not btrfs / not zfs / no devmapper pool / no erofs);
# disabling them only removes log noise. Everything else, in particular the CRI plugins, stays enabled.
disabled_plugins = [
  "io.containerd.snapshotter.v1.$2",
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper",
]

[grpc]
  address = "$DIR/containerd.sock"

[ttrpc]
  address = "$DIR/containerd.sock.ttrpc"

[debug]
  level = "info"

[plugins]
  # default is /opt/containerd (created on start) - keep everything under DIR
  [plugins."io.containerd.internal.v1.opt"]
    path = "$DIR/opt"
EOF
}

# minimal CRI proto used only for the readiness probe (unknown response fields are ignored by grpcurl)
write_probe_proto() {
    cat >"$DIR/cri-probe.proto" <<'EOF'
// generated by local-stack.sh: just enough of runtime.v1 to call ImageService/ListImages
syntax = "proto3";
package runtime.v1;
message ListImagesRequest {}
message ListImagesResponse {}
service ImageService {
  rpc ListImages(ListImagesRequest) returns (ListImagesResponse) {}
}
EOF
}

# ---------------------------------------------------------------------------------------------------------
# readiness probes

registry_ready() {
    if [[ $REG_AUTH == htpasswd ]]; then
        # no credentials here: an authenticating registry answers GET /v2/ with 401 + a Basic challenge
        local code
        code=$(curl -sS --noproxy '*' --max-time 2 -o /dev/null -w '%{http_code}' "http://127.0.0.1:$1/v2/" 2>/dev/null) || return 1
        [[ $code == 401 ]]
        return
    fi
    curl -fsS --noproxy '*' --max-time 2 -o /dev/null "http://127.0.0.1:$1/v2/" 2>/dev/null
}

cri_ready() {
    [[ -S $DIR/containerd.sock ]] || return 1
    if [[ $HAVE_GRPCURL == yes ]]; then
        "$GRPCURL" -plaintext -max-time 3 -unix -import-path "$DIR" -proto cri-probe.proto \
            "$DIR/containerd.sock" runtime.v1.ImageService/ListImages >/dev/null 2>&1
    else
        "$CTR" --address "$DIR/containerd.sock" plugins ls 2>/dev/null |
            awk '$1 == "io.containerd.grpc.v1" && $2 == "cri" && $NF == "ok" {f = 1} END {exit !f}'
    fi
}

# wait_for_cri PID DEADLINE WHEN: wait until containerd (PID) serves its CRI, dying with its log's tail if
# it exits or DEADLINE (in $SECONDS) passes first; WHEN says during what ("startup").
wait_for_cri() {
    local pid=$1 deadline=$2 when=$3
    until cri_ready; do
        if ! alive "$pid"; then
            log_tail "$DIR/containerd.log"
            die "containerd exited during $when"
        fi
        if ((SECONDS >= deadline)); then
            log_tail "$DIR/containerd.log"
            die "containerd CRI did not become ready on $DIR/containerd.sock during $when (${START_TIMEOUT}s)"
        fi
        sleep 0.1
    done
}

# ---------------------------------------------------------------------------------------------------------
# subcommands

REG_AUTH=none               # none | htpasswd (start --htpasswd FILE)
REG_REALM=cri-imaged-local  # Basic realm of the authenticated registry
REG_LOG_LEVEL=info          # debug with --htpasswd: only debug lines name the user of a successful request
STARTED_PIDS=() # pids returned by launch
LAUNCHED=()     # names whose launch has begun (a signal can arrive before launch returns the pid)
START_OK=no
IMAGE_FS_MIB=""   # start --image-fs-mib N: containerd's root on a tmpfs of N MiB at DIR/image-fs
SANDBOX_IMAGE=""  # REGISTRY/pause:3.9 once start has pushed it (not with --htpasswd)
CONTAINERD_ROOT=""
SEED_WORK=""

# EXIT trap of start: on failure/interruption stop everything this start launched.
start_cleanup() {
    [[ $START_OK != yes ]] || return 0
    [[ -z $SEED_WORK ]] || rm -rf -- "$SEED_WORK"
    local -a pids=("${STARTED_PIDS[@]}")
    local name pid deadline
    for name in "${LAUNCHED[@]}"; do
        deadline=$((SECONDS + 2))
        while [[ ! -s $DIR/run/$name.pid ]] && ((SECONDS < deadline)); do sleep 0.1; done
        if [[ -s $DIR/run/$name.pid ]]; then
            pid=$(<"$DIR/run/$name.pid")
            if alive "$pid"; then pids+=("$pid"); fi
        fi
    done
    mapfile -t -O "${#pids[@]}" pids < <(find_ours containerd; find_ours registry)
    if ((${#pids[@]} > 0)); then
        mapfile -t pids < <(printf '%s\n' "${pids[@]}" | sort -un)
        note "start failed; stopping what was started (${pids[*]})"
        STOP_TIMEOUT=5 terminate "${pids[@]}" || true
    fi
    if [[ -n $IMAGE_FS_MIB ]] && mountpoint -q -- "$DIR/image-fs"; then
        umount -- "$DIR/image-fs" || umount -l -- "$DIR/image-fs" || note "warning: could not unmount $DIR/image-fs"
    fi
}

cmd_start() {
    local htpasswd_src=""
    while (($# > 1)); do
        case $1 in
            --htpasswd)
                htpasswd_src=$2
                shift 2
                [[ -n $htpasswd_src ]] || die "--htpasswd needs a file"
                check_htpasswd "$htpasswd_src"
                REG_AUTH=htpasswd
                REG_LOG_LEVEL=debug
                ;;
            --image-fs-mib)
                [[ $2 =~ ^[0-9]{1,7}$ ]] && ((10#$2 >= 4)) || die "--image-fs-mib needs a size in MiB (at least 4): $2"
                IMAGE_FS_MIB=$((10#$2))
                shift 2
                ;;
            *) usage ;;
        esac
    done
    (($# == 1)) && [[ $1 != --* ]] || usage
    need_root
    need_cmd "$CONTAINERD_BIN" "$REGISTRY_BIN" setsid python3 curl awk sha256sum
    [[ $REG_AUTH == htpasswd ]] || need_cmd gcc runc containerd-shim-runc-v2 skopeo tar gzip
    [[ -z $IMAGE_FS_MIB ]] || need_cmd mount umount mountpoint
    resolve_dir "$1" yes
    local t0 t1
    t0=$(date +%s.%N)

    HAVE_GRPCURL=yes
    if ! command -v "$GRPCURL" >/dev/null 2>&1; then
        HAVE_GRPCURL=no
        note "warning: $GRPCURL not found; CRI readiness is checked via 'ctr plugins ls' instead"
        need_cmd ctr
    fi

    local running
    running=$(find_ours registry; find_ours containerd)
    [[ -z $running ]] || die "stack in $DIR already running (pids: $(echo "$running" | tr '\n' ' ')); run '$PROG stop $DIR' first"

    mkdir -p -- "$DIR/run" "$DIR/registry-data" "$DIR/cni/net.d" "$DIR/cni/bin"
    rm -f -- "$DIR/stack.env"
    local f
    for f in registry.log containerd.log; do
        if [[ -s $DIR/$f ]]; then mv -f -- "$DIR/$f" "$DIR/$f.prev"; fi
        : >"$DIR/$f"
    done
    write_probe_proto
    if [[ $REG_AUTH == htpasswd ]]; then
        # a private copy: FILE may live anywhere (its path is not pasted into YAML) and may change later
        if [[ $(realpath -- "$htpasswd_src") != "$DIR/registry.htpasswd" ]]; then
            (umask 077 && cp -f -- "$htpasswd_src" "$DIR/registry.htpasswd.tmp")
            mv -f -- "$DIR/registry.htpasswd.tmp" "$DIR/registry.htpasswd"
        fi
    else
        rm -f -- "$DIR/registry.htpasswd"
    fi

    trap start_cleanup EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
    local deadline=$((SECONDS + START_TIMEOUT))

    CONTAINERD_ROOT=$DIR/containerd-root
    if [[ -n $IMAGE_FS_MIB ]]; then
        mount_image_fs "$IMAGE_FS_MIB"
        CONTAINERD_ROOT=$DIR/image-fs/root
    fi

    # registry: retry with another port if the one we picked got taken in the meantime
    local port reg_pid attempt prev_port=""
    if [[ -f $DIR/registry.yml ]]; then
        prev_port=$(sed -n 's/^  addr: 127\.0\.0\.1:\([0-9][0-9]*\)$/\1/p' "$DIR/registry.yml")
    fi
    for attempt in 1 2 3; do
        if ((attempt == 1)); then port=$(pick_port "$prev_port"); else port=$(pick_port); fi
        [[ -n $port ]] || die "could not find a free port on 127.0.0.1"
        write_registry_config "$port"
        LAUNCHED+=(registry)
        reg_pid=$(launch registry "$DIR/registry.log" "$REGISTRY_BIN" serve "$DIR/registry.yml")
        STARTED_PIDS+=("$reg_pid")
        until registry_ready "$port"; do
            if ! alive "$reg_pid"; then
                if grep -q 'address already in use' "$DIR/registry.log" && ((attempt < 3)); then
                    note "port $port was taken, retrying"
                    continue 2
                fi
                log_tail "$DIR/registry.log"
                die "registry exited during startup"
            fi
            if ((SECONDS >= deadline)); then
                log_tail "$DIR/registry.log"
                die "registry did not answer GET http://127.0.0.1:$port/v2/ within ${START_TIMEOUT}s"
            fi
            sleep 0.1
        done
        break
    done
    write_certs_d "$port"
    # the sandbox image is pushed below, while containerd starts; an authenticating registry would need
    # credentials for that push and for containerd's pull of it, so such a stack runs no pods
    [[ $REG_AUTH == htpasswd ]] || SANDBOX_IMAGE=127.0.0.1:$port/$SANDBOX_REF
    write_containerd_config

    local ctd_pid
    LAUNCHED+=(containerd)
    ctd_pid=$(launch containerd "$DIR/containerd.log" "$CONTAINERD_BIN" --config "$DIR/containerd.toml")
    STARTED_PIDS+=("$ctd_pid")
    if [[ -n $SANDBOX_IMAGE ]]; then
        build_sleeper
        seed_init "127.0.0.1:$port"
        local sandbox_digest
        sandbox_digest=$(sleeper_image "$SANDBOX_REF" 0)
        rm -rf -- "$SEED_WORK"
        SEED_WORK=""
    fi
    wait_for_cri "$ctd_pid" "$deadline" "startup"
    alive "$reg_pid" || {
        log_tail "$DIR/registry.log"
        die "registry died during startup"
    }

    {
        echo "REGISTRY=127.0.0.1:$port"
        echo "CONTAINERD_SOCK=$DIR/containerd.sock"
        echo "REGISTRY_LOG=$DIR/registry.log"
        echo "REGISTRY_PID=$reg_pid"
        echo "CONTAINERD_PID=$ctd_pid"
        echo "CONTAINERD_LOG=$DIR/containerd.log"
        echo "CONTAINERD_ROOT=$CONTAINERD_ROOT"
        echo "CGROUP_PARENT=$(stack_cgroup)"
        echo "STACK_DIR=$DIR"
        if [[ -n $SANDBOX_IMAGE ]]; then
            echo "SANDBOX_IMAGE=$SANDBOX_IMAGE"
            echo "SANDBOX_DIGEST=$sandbox_digest"
        fi
        if [[ -n $IMAGE_FS_MIB ]]; then
            echo "IMAGE_FS=$DIR/image-fs"
            echo "IMAGE_FS_MIB=$IMAGE_FS_MIB"
        fi
        # (no REGISTRY_AUTH key: docker-registry reads REGISTRY_AUTH* from its environment as config overrides)
        if [[ $REG_AUTH == htpasswd ]]; then
            echo "REGISTRY_HTPASSWD=$DIR/registry.htpasswd"
            echo "REGISTRY_REALM=$REG_REALM"
        fi
    } >"$DIR/stack.env.tmp"
    mv -f -- "$DIR/stack.env.tmp" "$DIR/stack.env"
    START_OK=yes
    trap - EXIT INT TERM
    cat -- "$DIR/stack.env"
    t1=$(date +%s.%N)
    note "stack up in $(awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.2f", b - a}')s"
}

cmd_stop() {
    (($# == 1)) || usage
    need_root
    [[ -d $1 ]] || {
        note "no such directory: $1 (nothing to stop)"
        return 0
    }
    resolve_dir "$1" no
    local -a pids=()
    # pods first, through containerd: shims only exist if containers were run through this containerd
    mapfile -t pids < <(find_ours shim)
    if ((${#pids[@]} > 0)) && [[ -n $(find_ours containerd) ]]; then
        remove_pods
    fi
    mapfile -t pids < <(find_ours containerd; find_ours registry)
    if ((${#pids[@]} > 0)); then
        note "stopping pids ${pids[*]}"
        terminate "${pids[@]}"
    fi
    mapfile -t pids < <(find_ours shim)
    if ((${#pids[@]} > 0)); then
        note "stopping leftover shims ${pids[*]}"
        terminate "${pids[@]}"
    fi
    cgroup_cleanup
    unmount_below
    note "stopped ($DIR)"
}

cmd_restart_containerd() {
    (($# == 1)) || usage
    need_root
    resolve_dir "$1" no
    [[ -f $DIR/containerd.toml ]] || die "no stack in $DIR (run '$PROG start $DIR' first)"
    [[ -z $(find_ours containerd) ]] || die "the containerd of $DIR is still running"
    HAVE_GRPCURL=yes
    if ! command -v "$GRPCURL" >/dev/null 2>&1; then
        HAVE_GRPCURL=no
        need_cmd ctr
    fi
    local pid
    pid=$(launch containerd "$DIR/containerd.log" "$CONTAINERD_BIN" --config "$DIR/containerd.toml")
    wait_for_cri "$pid" $((SECONDS + START_TIMEOUT)) "its restart"
    echo "$pid"
}

go_arch() {
    local a
    if command -v dpkg >/dev/null 2>&1; then
        a=$(dpkg --print-architecture)
    else
        a=$(uname -m)
    fi
    case $a in
        amd64 | x86_64) echo "amd64 " ;;
        arm64 | aarch64) echo "arm64 " ;;
        armhf | armv7l) echo "arm v7" ;;
        armel | armv6l) echo "arm v6" ;;
        i386 | i686) echo "386 " ;;
        ppc64el | ppc64le) echo "ppc64le " ;;
        s390x) echo "s390x " ;;
        riscv64) echo "riscv64 " ;;
        mips64el) echo "mips64le " ;;
        *) die "unknown architecture: $a" ;;
    esac
}

sha256_of() {
    local h
    h=$(sha256sum -- "$1")
    echo "${h%% *}"
}

# seed_prepare DIR: set SEED_REGISTRY / SEED_ARCH / SEED_VARIANT and a scratch dir SEED_WORK (removed on exit).
seed_prepare() {
    resolve_dir "$1" no
    [[ -f $DIR/stack.env ]] || die "$DIR/stack.env missing - run '$PROG start $DIR' first"
    local registry
    registry=$(sed -n 's/^REGISTRY=//p' "$DIR/stack.env")
    [[ -n $registry ]] || die "REGISTRY not set in $DIR/stack.env"
    if [[ -z ${REGISTRY_CREDS:-} ]] && grep -q '^REGISTRY_HTPASSWD=' "$DIR/stack.env"; then
        die "the registry in $DIR demands authentication (htpasswd): set REGISTRY_CREDS=USER:PASS"
    fi
    seed_init "$registry"
    # shellcheck disable=SC2064 # expand $SEED_WORK now
    trap "rm -rf -- '$SEED_WORK'" EXIT
}

# seed_init REGISTRY: as seed_prepare, for a registry already known, without the EXIT trap (the caller
# removes SEED_WORK).
seed_init() {
    need_cmd tar gzip sha256sum skopeo stat
    SEED_REGISTRY=$1
    read -r SEED_ARCH SEED_VARIANT <<<"$(go_arch)"
    [[ -n $SEED_ARCH ]] || die "could not determine the image architecture"
    if [[ -n ${REGISTRY_CREDS:-} ]]; then
        [[ $REGISTRY_CREDS == ?*:* ]] || die "REGISTRY_CREDS must be USER:PASS"
    fi
    SEED_WORK=$(mktemp -d "$DIR/seed.XXXXXX")
    printf '{"default":[{"type":"insecureAcceptAnything"}]}\n' >"$SEED_WORK/policy.json"
    SEED_AUTH=()
    if [[ -n ${REGISTRY_CREDS:-} ]]; then
        # containers-auth.json: {"auths": {"HOST:PORT": {"auth": base64(USER:PASS)}}}, readable by root only
        (umask 077 && printf '{"auths":{"%s":{"auth":"%s"}}}\n' "$SEED_REGISTRY" \
            "$(printf '%s' "$REGISTRY_CREDS" | base64 -w0)" >"$SEED_WORK/auth.json")
        SEED_AUTH=(--dest-authfile "$SEED_WORK/auth.json")
    fi
}

# check_ref NAME:TAG: a repository name and tag as the registry takes them.
check_ref() {
    local ref=$1
    [[ $ref == *:* ]] || die "NAME:TAG expected, got: $ref"
    local name=${ref%:*} tag=${ref##*:}
    [[ $name =~ ^[a-z0-9]+([._-][a-z0-9]+)*(/[a-z0-9]+([._-][a-z0-9]+)*)*$ ]] || die "bad repository name: $name"
    [[ $tag =~ ^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$ ]] || die "bad tag: $tag"
}

# seed_image NAME:TAG CONTENT USER: build a reproducible 1-layer OCI image (hello.txt = CONTENT; config User =
# USER unless empty), push it to SEED_REGISTRY, print the pushed manifest digest. Equal inputs give equal
# digests, so pushing the same CONTENT/USER under several tags yields one image with several tags.
seed_image() {
    local ref=$1 content=$2 user=$3
    check_ref "$ref"
    # USER is pasted into JSON: [user|uid][:group|gid] with a conservative character set
    [[ -z $user || $user =~ ^[A-Za-z0-9_.-]+(:[A-Za-z0-9_.-]+)?$ ]] || die "bad user: $user"

    local work
    work=$(mktemp -d "$SEED_WORK/image.XXXXXX")
    mkdir -p -- "$work/rootfs"
    printf '%s\n' "$content" >"$work/rootfs/hello.txt"

    # reproducible layer: fixed order, mtime, ownership and mode; ustar => no pax atime/ctime records
    tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner --mode=u=rw,go=r --format=ustar \
        -C "$work/rootfs" -cf "$work/layer.tar" hello.txt
    local user_json=""
    [[ -z $user ]] || user_json=$(printf '"User":"%s"' "$user")
    push_image "$ref" "$work" "$user_json" 9
}

# push_image NAME:TAG WORK CONFIG LEVEL: push the 1-layer image whose layer is WORK/layer.tar (compressed
# with gzip -LEVEL -n: no name/timestamp in the gzip header) and whose image config's "config" object holds
# CONFIG (JSON members, may be empty) to SEED_REGISTRY; print the pushed manifest digest; remove WORK.
push_image() {
    local ref=$1 work=$2 config=$3 level=$4
    local name=${ref%:*} tag=${ref##*:}
    local blobs="$work/layout/blobs/sha256"
    mkdir -p -- "$blobs"

    gzip "-$level" -n -c "$work/layer.tar" >"$work/layer.tar.gz"
    local diff_id layer_digest layer_size
    diff_id=$(sha256_of "$work/layer.tar")
    layer_digest=$(sha256_of "$work/layer.tar.gz")
    layer_size=$(stat -c %s "$work/layer.tar.gz")
    rm -f -- "$work/layer.tar"
    mv -- "$work/layer.tar.gz" "$blobs/$layer_digest"

    local variant_json=""
    [[ -z $SEED_VARIANT ]] || variant_json=$(printf ',"variant":"%s"' "$SEED_VARIANT")
    printf '{"architecture":"%s"%s,"os":"linux","config":{%s},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]}}' \
        "$SEED_ARCH" "$variant_json" "$config" "$diff_id" >"$work/config.json"
    local config_digest config_size
    config_digest=$(sha256_of "$work/config.json")
    config_size=$(stat -c %s "$work/config.json")
    mv -- "$work/config.json" "$blobs/$config_digest"

    printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:%s","size":%s},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar+gzip","digest":"sha256:%s","size":%s}]}' \
        "$config_digest" "$config_size" "$layer_digest" "$layer_size" >"$work/manifest.json"
    local manifest_digest manifest_size
    manifest_digest=$(sha256_of "$work/manifest.json")
    manifest_size=$(stat -c %s "$work/manifest.json")
    mv -- "$work/manifest.json" "$blobs/$manifest_digest"

    printf '{"schemaVersion":2,"manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:%s","size":%s,"annotations":{"org.opencontainers.image.ref.name":"%s"}}]}' \
        "$manifest_digest" "$manifest_size" "$tag" >"$work/layout/index.json"
    printf '{"imageLayoutVersion":"1.0.0"}' >"$work/layout/oci-layout"

    skopeo --policy "$SEED_WORK/policy.json" copy --quiet --dest-tls-verify=false "${SEED_AUTH[@]}" \
        --digestfile "$work/pushed.digest" \
        "oci:$work/layout:$tag" "docker://$SEED_REGISTRY/$name:$tag" >&2 ||
        die "skopeo copy to $SEED_REGISTRY/$name:$tag failed"
    local pushed
    pushed=$(<"$work/pushed.digest")
    if [[ $pushed != "sha256:$manifest_digest" ]]; then
        note "warning: registry digest $pushed differs from the built manifest sha256:$manifest_digest"
    fi
    rm -rf -- "$work"
    echo "$pushed"
}

# sleeper_image NAME:TAG BYTES: push a 1-layer image whose entrypoint is /sleep-forever (DIR/bin, see
# build_sleeper) and, for BYTES > 0, whose /data holds BYTES random (incompressible) bytes; print its digest.
# A fresh random /data on every call: every call pushes a distinct image.
sleeper_image() {
    local ref=$1 bytes=$2
    check_ref "$ref"
    [[ -x $DIR/bin/$SLEEPER ]] || build_sleeper
    local work
    work=$(mktemp -d "$SEED_WORK/image.XXXXXX")
    mkdir -p -- "$work/rootfs"
    cp -- "$DIR/bin/$SLEEPER" "$work/rootfs/$SLEEPER"
    chmod 0755 -- "$work/rootfs/$SLEEPER"
    local -a files=("$SLEEPER")
    if ((bytes > 0)); then
        head -c "$bytes" /dev/urandom >"$work/rootfs/data"
        chmod 0644 -- "$work/rootfs/data"
        files+=(data)
    fi
    tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner --format=ustar \
        -C "$work/rootfs" -cf "$work/layer.tar" "${files[@]}"
    rm -rf -- "$work/rootfs"
    # random data does not compress: gzip -1 is as small as -9 and faster
    push_image "$ref" "$work" "$(printf '"Entrypoint":["/%s"]' "$SLEEPER")" 1
}

cmd_seed() {
    local user=""
    if [[ ${1-} == --user ]]; then
        (($# >= 2)) || usage
        user=$2
        shift 2
    fi
    (($# == 2 || $# == 3)) || usage
    seed_prepare "$1"
    seed_image "$2" "${3-hello from cri-imaged}" "$user"
}

cmd_seed_sized() {
    (($# == 3)) || usage
    [[ $3 =~ ^[0-9]{1,12}$ ]] && ((10#$3 <= 1 << 34)) || die "BYTES must be a number of bytes (at most 16 GiB): $3"
    seed_prepare "$1"
    sleeper_image "$2" "$((10#$3))"
}

main() {
    (($# >= 1)) || usage
    local cmd=$1
    shift
    case $cmd in
        start) cmd_start "$@" ;;
        stop) cmd_stop "$@" ;;
        restart-containerd) cmd_restart_containerd "$@" ;;
        seed) cmd_seed "$@" ;;
        seed-sized) cmd_seed_sized "$@" ;;
        -h | --help | help) usage ;;
        *) usage ;;
    esac
}

main "$@"
