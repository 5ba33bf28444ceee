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

step "dependencies: scripts/deps.sh"
scripts/deps.sh

step "cargo fmt --check"
cargo fmt --all --check

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

step "cargo test --release --no-fail-fast"
cargo test --release --no-fail-fast

step "the FUSE tests through FUSE over io_uring: scripts/test-fuse-uring.sh"
scripts/test-fuse-uring.sh

if [ "$fuzz_seconds" = 0 ]; then
    step "fuzz smoke: skipped (FUZZ_SECONDS=0)"
    exit 0
fi

have_fuzz() {
    cargo +nightly --version >/dev/null 2>&1 && cargo +nightly fuzz --version >/dev/null 2>&1
}

if ! have_fuzz; then
    step "installing nightly and cargo-fuzz"
    if ! cargo +nightly --version >/dev/null 2>&1; then
        rustup toolchain install nightly --profile minimal
    fi
    if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
        cargo install cargo-fuzz --locked
    fi
fi

if have_fuzz; then
    step "fuzz smoke: ${fuzz_seconds}s per target"
    scripts/fuzz-smoke.sh "$fuzz_seconds"
else
    echo "fuzz smoke: nightly or cargo-fuzz could not be installed" >&2
    exit 1
fi

step "all tests passed"
