#!/usr/bin/env bash
# Runs the coverage-guided fuzz targets (fuzz/, cargo-fuzz and libFuzzer; see FUZZING.md) one
# after another, and prints a line of figures for each.
#
#   scripts/fuzz.sh [--smoke] [TARGET...]     every target when none is named
#
# Long run (make fuzz): each target to FUZZ_RUNS executions (default 10,000,000).
# Smoke run (make fuzz-smoke, CI): each target for FUZZ_SMOKE_SECONDS (default 15).
# A target stops at its first crash, panic, timeout or out-of-memory, its input kept under
# fuzz/artifacts/TARGET/; the others still run, and the script fails at the end. FUZZ_SANITIZER=none builds without AddressSanitizer; FUZZ_ARGS adds
# libFuzzer flags; FUZZ_TARGET_DIR moves the build (default fuzz/target, apart from the main
# build's). Grown corpora are kept in the target dir (corpus/TARGET), the seeds in fuzz/seeds/.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
fuzz_dir=$root/fuzz
target_dir=${FUZZ_TARGET_DIR:-$fuzz_dir/target}
sanitizer=${FUZZ_SANITIZER:-address}
runs=${FUZZ_RUNS:-10000000}
smoke_seconds=${FUZZ_SMOKE_SECONDS:-15}

smoke=false
if [ "${1:-}" = --smoke ]; then
    smoke=true
    shift
fi

if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "fuzz: cargo-fuzz is not installed; run scripts/install-deps.sh (make deps)" >&2
    exit 1
fi

targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
    mapfile -t targets < <(cd "$fuzz_dir/fuzz_targets" && ls -- *.rs | sed 's/\.rs$//')
fi

# cargo-fuzz asks rustc for -Zsanitizer (and more -Z flags with ASan); RUSTC_BOOTSTRAP lets the
# stable toolchain take them. Release, with debug assertions and overflow checks on.
export RUSTC_BOOTSTRAP=1
build_started=$(date +%s)
cargo fuzz build --fuzz-dir "$fuzz_dir" --target-dir "$target_dir" --sanitizer "$sanitizer" --release --debug-assertions
echo "fuzz: built in $(($(date +%s) - build_started)) s (sanitizer: $sanitizer)" >&2

host=$(rustc -vV | sed -n 's/^host: //p')
bin_dir=$target_dir/$host/release
mkdir -p "$target_dir/logs"

if $smoke; then
    limit=(-max_total_time="$smoke_seconds")
else
    limit=(-runs="$runs")
fi

failed=()
printf '%-18s %12s %8s %10s %13s %8s %8s\n' target executions seconds exec/s 'cov (seeds)' ft corpus >&2
for target in "${targets[@]}"; do
    corpus=$target_dir/corpus/$target
    artifacts=$fuzz_dir/artifacts/$target
    log=$target_dir/logs/$target.log
    mkdir -p "$corpus" "$artifacts"
    started=$(date +%s)
    # New inputs go to the first corpus directory; the seeds, and the inputs of bugs found and
    # fixed (fuzz/regressions/), are only read.
    inputs=("$corpus" "$fuzz_dir/seeds/$target")
    [ -d "$fuzz_dir/regressions/$target" ] && inputs+=("$fuzz_dir/regressions/$target")
    # shellcheck disable=SC2086 # FUZZ_ARGS is a list of flags
    if ! "$bin_dir/$target" "${inputs[@]}" "${limit[@]}" \
        -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$artifacts/" \
        ${FUZZ_ARGS:-} >"$log" 2>&1; then
        grep -E -m 1 -B 2 -A 12 "panicked at|ERROR: (AddressSanitizer|libFuzzer)" "$log" >&2 || tail -n 40 "$log" >&2
        echo "fuzz: $target FAILED after $(($(date +%s) - started)) s; the input is in $artifacts/ and the log in $log" >&2
        failed+=("$target")
        continue
    fi
    seconds=$(($(date +%s) - started))
    executions=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
    per_second=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log")
    seeded=$(sed -n 's/.*INITED cov: \([0-9]*\).*/\1/p' "$log" | head -n 1)
    last=$(grep -E '^#[0-9]+' "$log" | tail -n 1)
    cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$last")
    ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$last")
    corp=$(sed -n 's/.* corp: \([0-9]*\).*/\1/p' <<<"$last")
    printf '%-18s %12s %8s %10s %13s %8s %8s\n' "$target" "$executions" "$seconds" "$per_second" "$cov ($seeded)" "$ft" \
        "$corp" >&2
done

if [ ${#failed[@]} -gt 0 ]; then
    echo "fuzz: FAILED: ${failed[*]}" >&2
    exit 1
fi
