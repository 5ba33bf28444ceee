#!/usr/bin/env bash
# The FUSE test files again, every export served through FUSE over io_uring: the kernel's switch
# is turned on for the run (and put back as it was), and DMKIT_FUSE_TRANSPORT=io-uring makes
# every `open` fail rather than fall back to /dev/fuse, so a pass means the data went through the
# ring (linear, verity with ext4 and a corrupt block, LUKS1/LUKS2, plain, integrity, sealed
# fs-verity trees, images). tests/fuse_uring.rs covers the choice, the fallback and the
# lifecycle itself and runs in the normal suite.
#
#   scripts/test-fuse-uring.sh [extra cargo test arguments]
#
# Needs root, /dev/fuse and a kernel with /sys/module/fuse/parameters/enable_uring (6.14+);
# without them it says so and exits 0, unless CI is set.
set -euo pipefail

cd "$(dirname "$0")/.."
switch=/sys/module/fuse/parameters/enable_uring

skip() {
    if [ -n "${CI:-}" ]; then
        echo "test-fuse-uring: cannot run in CI: $*" >&2
        exit 1
    fi
    echo "test-fuse-uring: skipped: $*"
    exit 0
}

[ "$(id -u)" = 0 ] || skip "not running as root"
[ -e "$switch" ] || skip "this kernel has no FUSE over io_uring ($switch is missing)"

old=$(cat "$switch")
trap 'echo "$old" > "$switch"' EXIT
echo Y > "$switch"

# The kill -9 test keeps its acceptance count (20 kills per case) in the normal suite; through
# the ring, 6 per case show that fsync'd writes survive this transport too, in a third of the time.
DMKIT_CRASH_CYCLES="${DMKIT_CRASH_CYCLES:-6}" DMKIT_FUSE_TRANSPORT=io-uring cargo test --release --no-fail-fast "$@" \
    --test export --test durability --test fsverity_seal --test luks_cli --test luks_interop \
    --test crypt_plain --test integrity_cli --test verity_e2e --test verity_interop --test image \
    --test export_writes --test close_by_path --test integrity_crash
