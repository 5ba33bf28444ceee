#!/usr/bin/env bash
# Get the fuzz smoke ready: a nightly toolchain and cargo-fuzz (installed when missing), and
# every fuzz target built. scripts/test.sh runs it in the background at the lowest priority
# while the lints and tests run, so the smoke at its end only fuzzes.
#
#   scripts/fuzz-prepare.sh
set -euo pipefail

cd "$(dirname "$0")/.."

if ! cargo +nightly --version >/dev/null 2>&1; then
    echo "fuzz-prepare: installing the nightly toolchain"
    rustup toolchain install nightly --profile minimal
fi
if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
    echo "fuzz-prepare: installing cargo-fuzz"
    cargo install cargo-fuzz --locked
fi
cd fuzz
cargo +nightly fuzz build
echo "fuzz-prepare: every fuzz target built"
