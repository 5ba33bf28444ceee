#!/usr/bin/env bash
# Install what dmkit's demo and tests drive: the real tools we are compared with (fio,
# veritysetup), FUSE, e2fsprogs for filesystem images, OpenSSL for signatures.
# Idempotent: installs only what is missing, so a developer machine is not touched twice.
set -euo pipefail
need=()
for pair in fio:fio veritysetup:cryptsetup-bin fusermount3:fuse3 mkfs.ext4:e2fsprogs \
            debugfs:e2fsprogs losetup:mount openssl:openssl pkg-config:pkg-config \
            fsverity:fsverity integritysetup:cryptsetup-bin dmsetup:dmsetup keyctl:keyutils \
            busybox:busybox lz4:lz4 depmod:kmod; do
  cmd=${pair%%:*}; pkg=${pair#*:}
  command -v "$cmd" >/dev/null 2>&1 || need+=("$pkg")
done
dpkg -s libssl-dev >/dev/null 2>&1 || need+=(libssl-dev)
if [ ${#need[@]} -gt 0 ]; then
  echo "deps: installing ${need[*]}" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi
# The kernel tests (tests/kernel.rs) boot a Debian kernel under QEMU: qemu-system-x86 (qboot
# comes with it); the kernel package itself is downloaded by tests/kernel/build-guest.sh, never
# installed. Without recommends: the GUI, firmware and network extras are not needed.
if ! command -v qemu-system-x86_64 >/dev/null 2>&1; then
  echo "deps: installing qemu-system-x86" >&2
  [ ${#need[@]} -gt 0 ] || apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends qemu-system-x86 >/dev/null
fi
# FUSE and loop devices: the kernel modules may need loading in a fresh VM or container.
[ -e /dev/fuse ] || modprobe fuse 2>/dev/null || true
[ -e /dev/loop-control ] || modprobe loop 2>/dev/null || true
command -v cargo >/dev/null 2>&1 || { echo "deps: cargo is missing (install Rust with rustup)" >&2; exit 1; }
