#!/usr/bin/env bash
# Install every Debian package that dmkit's build, demo, tests and benchmarks call. This list is
# the one source of truth: packages are named here, by package name, and installed every time
# (apt-get returns at once when all of them are there), so a fresh machine gets exactly what a
# developer machine has. Needs root on Debian 12 and a Rust toolchain (rustup).
set -euo pipefail

packages=(
  # The build: a C toolchain (build scripts, openssl-sys) and OpenSSL's headers.
  build-essential pkg-config libssl-dev
  # The real tools we are compared with and tested against.
  cryptsetup-bin fsverity fio openssl keyutils dmsetup
  # strace cuts a cryptsetup run at a chosen fsync (tests/luks_reencrypt_reduce_header.rs).
  strace
  # Serving: FUSE (fusermount3 for rootless serving), loop devices (losetup), filesystems.
  fuse3 mount util-linux e2fsprogs kmod
  # `image open` without root puts fuse-overlayfs over dmkit's FUSE tree (tests/image_rootless.rs).
  fuse-overlayfs
  # qemu-img (LUKS1 images, NBD tests), qemu-storage-daemon (the `bench crypt --peer` peer) and
  # qemu-system-x86 (the kernel tests boot a Debian kernel under it; qboot comes with it).
  qemu-utils qemu-system-x86 qemu-system-common
  # Real NBD clients the NBD server is tested against (tests/nbd.rs): nbdinfo and nbdcopy
  # (libnbd-bin) and nbdfuse; qemu-img and qemu-io come with qemu-utils.
  libnbd-bin nbdfuse
  # The kernel test guest: its initramfs is built from these (tests/kernel/build-guest.sh).
  busybox cpio lz4 zstd xz-utils
  # cryptsetup's own test material (tests/cryptsetup_suite.rs): downloaded with curl, its
  # header generators run with bash, jq and xxd.
  curl ca-certificates jq xxd
  # An independent serpent/twofish/AES (XTS, CBC) the cipher tests compare with (dlopened).
  libgcrypt20
  # The rootless-serving test creates an unprivileged user (useradd) and runs as it (setpriv).
  passwd
  # The passphrase tests type at a terminal through script(1).
  bsdutils
  # `dmkit image build` runs the real mkfs.erofs and mksquashfs (mkfs.ext4 is e2fsprogs').
  erofs-utils squashfs-tools
  # The signature-probe tests (tests/signature.rs) check what dmkit's safety prompts detect on
  # images made by the real tools: mkfs.vfat (dosfstools) and partition tables by sfdisk (fdisk).
  dosfstools fdisk
  # The image tests check our images with systemd-dissect (systemd-container) and compare
  # them with an image systemd-repart (systemd) builds from the same tree.
  systemd systemd-container
  # `dmkit bench image` builds its default tree, a minimal Debian root, with debootstrap.
  debootstrap
  # The remote transport's tests (issue 28) serve images over HTTP and HTTPS with nginx (Debian
  # 12's `nginx` is the server itself, with the SSL module; nginx-light only adds a module).
  nginx
  # `dmkit bench seeds` draws its plots' text with a TrueType font (DejaVu Sans).
  fonts-dejavu-core
  # `man dmkit-luks` after scripts/install-docs.sh (man-db, groff-base render the pages the CLI
  # generates); bash-completion loads the installed completion in interactive shells.
  man-db groff-base bash-completion
  # issue 28 (r30): `dmkit bench remote` reads the same image through nbdkit's curl plugin (in
  # the nbdkit package itself) and QEMU's curl block driver (qemu-block-extra).
  nbdkit qemu-block-extra
)

# busybox and busybox-static conflict; either serves the test guest, so keep the one installed.
if dpkg-query -W -f '${Status}' busybox-static 2>/dev/null | grep -q "install ok installed"; then
  packages=("${packages[@]/#busybox/busybox-static}")
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f '${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "deps: installing ${missing[*]}" >&2
  apt-get update -qq
  # Without recommends: qemu's GUI, firmware and network extras are not needed.
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${packages[@]}" >/dev/null
fi

# FUSE and loop devices: the kernel modules may need loading in a fresh VM or container.
[ -e /dev/fuse ] || modprobe fuse 2>/dev/null || true
# Rootless serving goes through fusermount3, which opens /dev/fuse with the user's own rights:
# Debian's udev makes it 0666 (50-udev-default.rules); machines without udev leave it 0600.
[ -c /dev/fuse ] && chmod 0666 /dev/fuse 2>/dev/null || true
# fusermount3 reads /etc/mtab before it unmounts a user's mount: every Debian system has it
# (a symlink systemd-tmpfiles makes), a minbase chroot does not.
[ -e /etc/mtab ] || ln -s ../proc/self/mounts /etc/mtab 2>/dev/null || true
# The rootless test runs as a user of its own, who must be able to reach /usr and /tmp: a
# Debian root directory is 0755, a chroot unpacked into a mktemp directory is 0700.
[ "$(( $(stat -c '0%a' /) & 01 ))" = 1 ] || chmod o+rx / 2>/dev/null || true
[ -e /dev/loop-control ] || modprobe loop 2>/dev/null || true
command -v cargo >/dev/null 2>&1 || { echo "deps: cargo is missing (install Rust with rustup)" >&2; exit 1; }
# The S3 tests' server, s3s-fs, is built from crates.io by scripts/s3s-fs.sh (minutes of CPU):
# scripts/test.sh builds it in the background and runs tests/remote_s3.rs once it is there.
