#!/usr/bin/env bash
# The project's test command: formatting, lints, every test (release build, so the hashing-heavy
# tests are quick), then a short fuzz run of every fuzz target.
#
#   scripts/test.sh
#
# Environment:
#   CI=1              tests that need root, /dev/fuse or loop devices fail instead of skipping.
#   FUZZ_SECONDS=N    seconds per fuzz target (default 30; 0 skips the fuzz smoke).
set -euo pipefail

cd "$(dirname "$0")/.."
fuzz_seconds="${FUZZ_SECONDS:-30}"

step() {
    echo
    echo "==== $* ($(date +%T))"
}

# Waits for a build started in the background, shows its log, and stops the run if it failed.
await_background() {
    local pid=$1 log=$2 failure=$3 rc=0
    wait "$pid" || rc=$?
    cat "$log"
    if [ "$rc" != 0 ]; then
        echo "$failure (exit $rc, log above)" >&2
        exit 1
    fi
}

step "dependencies: scripts/deps.sh"
scripts/deps.sh

step "cargo fmt --check"
cargo fmt --all --check

# The fuzz targets (nightly, sanitizers: minutes of CPU) build in the background at the lowest
# priority, on the cycles the lints and tests leave idle; the smoke at the end waits for them.
prepare_log=$(mktemp)
if [ "$fuzz_seconds" != 0 ]; then
    step "in the background: scripts/fuzz-prepare.sh (nightly, cargo-fuzz, the fuzz targets' build)"
    nice -n 19 scripts/fuzz-prepare.sh >"$prepare_log" 2>&1 &
    prepare_pid=$!
    # A step failing before the smoke ends the run: take the build down with it.
    trap 'kill "$prepare_pid" 2>/dev/null || true' EXIT
fi

# The S3-compatible server of tests/remote_s3.rs (s3s-fs, built from crates.io once into
# target/tools) builds the same way; that test runs after the lanes, once it is there.
s3s_log=$(mktemp)
step "in the background: scripts/s3s-fs.sh (the S3 tests' server, built once into target/tools)"
nice -n 19 scripts/s3s-fs.sh >"$s3s_log" 2>&1 &
s3s_pid=$!
trap 'kill "${prepare_pid:-}" "$s3s_pid" 2>/dev/null || true' EXIT

step "cargo clippy --all-targets -- -D warnings"
cargo clippy --all-targets -- -D warnings

step "the library without the CLI: cargo clippy --lib --no-default-features, no clap"
# clippy type-checks the library as a build would (a library is not linked), in a third of
# the time.
cargo clippy --lib --no-default-features -- -D warnings
if cargo tree --no-default-features -e normal --prefix none | grep -i clap; then
    echo "the library without the cli feature still depends on clap (above)" >&2
    exit 1
fi

step "cargo doc (broken or private links in the docs are errors)"
RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --quiet

step "cargo test --release --no-run (build every test binary once)"
cargo test --release --no-run

# Two lanes at once: the QEMU guests (one core each, mostly waiting on the emulated kernel) and
# cryptsetup's own suite beside everything else; run one after the other they were two thirds of
# CI's time. cargo takes its build lock only while it builds, so both lanes run their binaries
# concurrently. The guests' lane logs to a file, shown whole when both lanes have ended.
mapfile -t slow < <(cd tests && ls kernel*.rs cryptsetup_suite.rs | sed 's/\.rs$//')
# The tests with an S3 case (tests/remote_s3.rs, tests/remote_image.rs) wait for their server's
# build (above) and run after the lanes.
late=(remote_s3 remote_image)
mapfile -t rest < <(cd tests && ls *.rs | sed 's/\.rs$//' | grep -vxF -f <(printf '%s\n' "${slow[@]}" "${late[@]}"))
lane_args() { for t in "$@"; do printf -- '--test\n%s\n' "$t"; done; }
mapfile -t slow_args < <(lane_args "${slow[@]}")
mapfile -t rest_args < <(lane_args "${rest[@]}")
# The slow lane's log lives under target/, which no test touches. Its exit code is the
# background job's own, collected by `wait`: a subshell inherits `set -e` and would exit at a
# failing `cargo test` before it could write the code anywhere.
mkdir -p target
slow_log=$(mktemp "$PWD/target/test-lane-slow.XXXXXX")
step "cargo test --release --no-fail-fast, two lanes: [${slow[*]}] (log shown when it ends) beside [lib, bins, ${#rest[@]} test files, doc tests]"
cargo test --release --no-fail-fast "${slow_args[@]}" >"$slow_log" 2>&1 &
slow_pid=$!
rest_rc=0
cargo test --release --no-fail-fast --lib --bins "${rest_args[@]}" || rest_rc=$?
# cargo takes --doc only alone.
cargo test --release --doc || rest_rc=$?
slow_rc=0
wait "$slow_pid" || slow_rc=$?
echo "---- lane: ${slow[*]} (exit $slow_rc, $(date +%T))"
cat "$slow_log"
rm -f "$slow_log"
if [ "$rest_rc" != 0 ] || [ "$slow_rc" != 0 ]; then
    echo "cargo test failed (lanes above: exit $rest_rc and $slow_rc)" >&2
    exit 1
fi

step "the tests with S3 cases: ${late[*]} (waiting for scripts/s3s-fs.sh)"
await_background "$s3s_pid" "$s3s_log" "scripts/s3s-fs.sh failed: the S3 tests' server could not be built"
mapfile -t late_args < <(lane_args "${late[@]}")
cargo test --release --no-fail-fast "${late_args[@]}"

step "the FUSE tests through FUSE over io_uring: scripts/test-fuse-uring.sh"
scripts/test-fuse-uring.sh

if [ "$fuzz_seconds" = 0 ]; then
    step "fuzz smoke: skipped (FUZZ_SECONDS=0)"
    exit 0
fi

step "fuzz smoke: ${fuzz_seconds}s per target (waiting for scripts/fuzz-prepare.sh)"
await_background "$prepare_pid" "$prepare_log" "fuzz smoke: scripts/fuzz-prepare.sh failed: nightly, cargo-fuzz or a target build"
scripts/fuzz-smoke.sh "$fuzz_seconds"

step "all tests passed"
