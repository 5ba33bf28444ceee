#!/usr/bin/env bash
# The S3-compatible server the S3 tests start on 127.0.0.1 (tests/common/s3.rs): s3s-fs, which
# checks SigV4 signatures (header and presigned), built from crates.io once and kept in
# target/tools/bin beside the build cache, so a CI run that keeps target/ reuses it.
#
# Pinned: 0.14.1 is the newest whose rust-version (1.92) the toolchain here accepts (0.15 wants
# 1.96); --locked builds with its own Cargo.lock; only the `binary` feature (the server
# program). Measured on this project's 2-core machine: see README (remote objects).
set -euo pipefail

version=0.14.1
root="${CARGO_TARGET_DIR:-$(cd "$(dirname "$0")/.." && pwd)/target}/tools"
bin="$root/bin/s3s-fs"

if [ -x "$bin" ] && "$bin" --version 2>/dev/null | grep -qx "s3s-fs $version"; then
  exit 0
fi
echo "deps: building s3s-fs $version into $root (once; a few minutes on 2 cores)" >&2
start=$(date +%s)
cargo install --quiet --locked --root "$root" --version "$version" --features binary s3s-fs
echo "deps: s3s-fs built in $(( $(date +%s) - start )) s" >&2
