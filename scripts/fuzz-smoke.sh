#!/usr/bin/env bash
# Run every cargo-fuzz target for a short while; exit non-zero if any of them crashes.
#
#   scripts/fuzz-smoke.sh [SECONDS]      (default 30 per target; or FUZZ_SECONDS)
#
# Needs a nightly toolchain and cargo-fuzz (`rustup toolchain install nightly --profile minimal`,
# `cargo install cargo-fuzz`). Crashing inputs are left in fuzz/artifacts/<target>/.
set -euo pipefail

seconds="${1:-${FUZZ_SECONDS:-30}}"
case "$seconds" in
    ''|*[!0-9]*) echo "fuzz-smoke: SECONDS must be a whole number, got '$seconds'" >&2; exit 1 ;;
esac

cd "$(dirname "$0")/../fuzz"

if ! cargo +nightly --version >/dev/null 2>&1; then
    echo "fuzz-smoke: no nightly toolchain (rustup toolchain install nightly --profile minimal)" >&2
    exit 1
fi
if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
    echo "fuzz-smoke: cargo-fuzz is not installed (cargo install cargo-fuzz)" >&2
    exit 1
fi

# A lock that lags the main crate's dependencies would send cargo to the registry index; say
# so plainly instead (update it with `cargo metadata` in fuzz/ and commit it).
if ! cargo +nightly metadata --locked --format-version 1 >/dev/null; then
    echo "fuzz-smoke: fuzz/Cargo.lock is out of date with Cargo.toml" >&2
    exit 1
fi

mapfile -t targets < <(cargo +nightly fuzz list)
if [ "${#targets[@]}" -eq 0 ]; then
    echo "fuzz-smoke: no fuzz targets found" >&2
    exit 1
fi

# Build everything first, so the time limit is spent fuzzing.
cargo +nightly fuzz build

# libFuzzer runs one thread: as many targets at once as there are cores, each logging to its
# own file (printed when it fails), so the smoke costs SECONDS x targets / cores.
jobs="$(nproc 2>/dev/null || echo 1)"
logs="$(mktemp -d)"
trap 'rm -rf "$logs"' EXIT

fuzz_one() {
    local t="$1"
    mkdir -p "corpus/$t"
    # Committed seeds (fuzz/seeds/<target>/) start the search from real headers; new inputs
    # go to the first directory, corpus/<target>.
    local seeds=()
    if [ -d "seeds/$t" ]; then seeds=("seeds/$t"); fi
    # -max_total_time bounds the run; a crash, leak or timeout makes libFuzzer exit non-zero.
    cargo +nightly fuzz run "$t" "corpus/$t" "${seeds[@]}" -- \
        -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
        >"$logs/$t.log" 2>&1
}

failed=()
declare -A running=()
# Wait for any one run to end (bash 5.1+: -p names it) and report it.
reap() {
    local pid st=0
    wait -n -p pid || st=$?
    local t="${running[$pid]}"
    unset "running[$pid]"
    if [ "$st" -eq 0 ]; then
        echo "fuzz-smoke: $t: $(grep -a -m1 'stat::number_of_executed_units' "$logs/$t.log" || echo done)"
    else
        echo "fuzz-smoke: $t FAILED (exit $st); its log:" >&2
        tail -n 60 "$logs/$t.log" >&2
        failed+=("$t")
    fi
}
for t in "${targets[@]}"; do
    while [ "${#running[@]}" -ge "$jobs" ]; do reap; done
    echo "fuzz-smoke: $t for ${seconds}s"
    fuzz_one "$t" &
    running[$!]="$t"
done
while [ "${#running[@]}" -gt 0 ]; do reap; done

if [ "${#failed[@]}" -ne 0 ]; then
    echo "fuzz-smoke: crashes in: ${failed[*]} (inputs in fuzz/artifacts/)" >&2
    exit 1
fi
echo "fuzz-smoke: ${#targets[@]} target(s) ran ${seconds}s each without a crash"
