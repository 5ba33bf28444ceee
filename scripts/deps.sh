#!/usr/bin/env bash
# Install what dmkit's demo and tests drive: the real tools we are compared with (fio,
# veritysetup), FUSE, e2fsprogs for filesystem images, OpenSSL for signatures.
# Idempotent: installs only what is missing, so a developer machine is not touched twice.
set -euo pipefail
need=()
for pair in fio:fio veritysetup:cryptsetup-bin fusermount3:fuse3 mkfs.ext4:e2fsprogs \
            debugfs:e2fsprogs losetup:mount openssl:openssl pkg-config:pkg-config; do
  cmd=${pair%%:*}; pkg=${pair#*:}
  command -v "$cmd" >/dev/null 2>&1 || need+=("$pkg")
done
dpkg -s libssl-dev >/dev/null 2>&1 || need+=(libssl-dev)
if [ ${#need[@]} -gt 0 ]; then
  echo "deps: installing ${need[*]}" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi
# FUSE and loop devices: the kernel modules may need loading in a fresh VM or container.
[ -e /dev/fuse ] || modprobe fuse 2>/dev/null || true
[ -e /dev/loop-control ] || modprobe loop 2>/dev/null || true
command -v cargo >/dev/null 2>&1 || { echo "deps: cargo is missing (install Rust with rustup)" >&2; exit 1; }
