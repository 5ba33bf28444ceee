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

failed=()
for t in "${targets[@]}"; do
    echo "fuzz-smoke: $t for ${seconds}s"
    mkdir -p "corpus/$t"
    # Committed seeds (fuzz/seeds/<target>/) start the search from real headers; new inputs
    # go to the first directory, corpus/<target>.
    seeds=()
    if [ -d "seeds/$t" ]; then seeds=("seeds/$t"); fi
    # -max_total_time bounds the run; a crash, leak or timeout makes libFuzzer exit non-zero.
    if ! cargo +nightly fuzz run "$t" "corpus/$t" "${seeds[@]}" -- \
        -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1; then
        failed+=("$t")
    fi
done

if [ "${#failed[@]}" -ne 0 ]; then
    echo "fuzz-smoke: crashes in: ${failed[*]} (inputs in fuzz/artifacts/)" >&2
    exit 1
fi
echo "fuzz-smoke: ${#targets[@]} target(s) ran ${seconds}s each without a crash"
