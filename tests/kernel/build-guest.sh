#!/usr/bin/env bash
# Build (or find in the cache) the test guest: a stock Debian kernel, extracted to its
# uncompressed ELF vmlinux (booted through its PVH entry), and an uncompressed initramfs holding
# bash, busybox, the Debian cryptsetup/veritysetup/integritysetup/dmsetup, fsverity, e2fsprogs,
# keyctl, util-linux and kmod binaries with their libraries (and libssl, for dmkit binaries
# tests copy in), the kernel's dm, crypto, virtio and loop modules, and the guest init
# (tests/kernel/init).
#
#   tests/kernel/build-guest.sh [CACHE_ROOT]      (default: <repo>/target/kernel-cache)
#
# Prints the directory holding `vmlinux`, `initramfs.cpio` and `versions`. Everything comes
# from apt packages: the kernel package is downloaded (apt-get download, never installed on the
# host) and unpacked; the user-space tools are the host's installed Debian binaries. The cache
# directory is keyed by the kernel package version, the tool package versions and this script
# and the init, so a package upgrade or a harness change rebuilds it.
#
# Environment:
#   DMKIT_GUEST_KERNEL_PKG  kernel meta packages, space separated, the first apt knows is used
#                           (default: linux-image-cloud-amd64 linux-image-amd64)
#
# Exit status: 0 built or found; 77 a prerequisite is missing (the message says which);
# anything else is a harness bug.
set -Eeuo pipefail
export LC_ALL=C
# Never end silently: name the line and the command that failed.
trap 'rc=$?; echo "build-guest: line $LINENO: \`$BASH_COMMAND\` failed (exit $rc)" >&2; exit $rc' ERR

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
cache_root=${1:-$repo/target/kernel-cache}

die_missing() {
    echo "build-guest: $*" >&2
    exit 77
}

# --- which kernel package ------------------------------------------------------------------
kernel_pkg=""
kernel_ver=""
metas=${DMKIT_GUEST_KERNEL_PKG:-linux-image-cloud-amd64 linux-image-amd64}
for meta in $metas; do
    dep=$(apt-cache depends "$meta" 2>/dev/null | awk '/Depends: linux-image-[0-9]/ {print $2; exit}' || true)
    [ -n "$dep" ] || continue
    ver=$(apt-cache policy "$dep" 2>/dev/null | awk '/Candidate:/ {print $2; exit}' || true)
    [ -n "$ver" ] && [ "$ver" != "(none)" ] || continue
    kernel_pkg=$dep
    kernel_ver=$ver
    break
done
[ -n "$kernel_pkg" ] || die_missing "no Debian kernel package ($metas) is known to apt (run apt-get update)"

# --- the user-space tools: binaries taken from the installed Debian packages ---------------
# name:package. The first group is required; the rest are copied when present.
required_tools=(
    bash:bash busybox:busybox cryptsetup:cryptsetup-bin veritysetup:cryptsetup-bin
    integritysetup:cryptsetup-bin dmsetup:dmsetup fsverity:fsverity mkfs.ext4:e2fsprogs
    keyctl:keyutils losetup:mount kmod:kmod
)
optional_tools=(
    mke2fs e2fsck tune2fs debugfs dumpe2fs blkid blockdev wipefs mount umount
    dd cmp sha256sum sha512sum stat truncate head tail od cat cut sort uniq wc tr env seq
    sync timeout base64 xxd hexdump fallocate
)
packages=()
for pair in "${required_tools[@]}"; do
    cmd=${pair%%:*}
    pkg=${pair#*:}
    command -v "$cmd" >/dev/null 2>&1 || die_missing "$cmd is not installed (apt-get install $pkg)"
    packages+=("$pkg")
done
for lib in libc6 libcryptsetup12 libdevmapper1.02.1 libfsverity0 libssl3; do
    packages+=("$lib")
done
versions=$(
    echo "kernel $kernel_pkg=$kernel_ver"
    # shellcheck disable=SC2046
    dpkg-query -W -f '${Package}=${Version}\n' $(printf '%s\n' "${packages[@]}" | sort -u) 2>/dev/null || true
)
key=$( { echo "$versions"; cat "$0" "$here/init"; } | sha256sum | cut -c1-16)
out="$cache_root/${kernel_pkg}_${kernel_ver}-$key"
if [ -s "$out/vmlinux" ] && [ -s "$out/initramfs.cpio" ]; then
    echo "$out"
    exit 0
fi

# --- build into a temporary directory, then rename into place (atomic for concurrent runs) ---
mkdir -p "$cache_root"
work=$(mktemp -d "$cache_root/.build.XXXXXX")
trap 'rm -rf "$work"' EXIT
echo "build-guest: building the test guest from $kernel_pkg $kernel_ver (cached in $out)" >&2

(
    cd "$work"
    # apt-get download warns when run as root in a directory _apt cannot write; harmless.
    apt-get download "$kernel_pkg=$kernel_ver" >/dev/null 2>apt.err ||
        { cat apt.err >&2; exit 77; }
) || die_missing "cannot download $kernel_pkg $kernel_ver"
dpkg-deb -x "$work"/linux-image-*.deb "$work/pkg"
kver=$(ls "$work/pkg/lib/modules")
vmlinuz=$work/pkg/boot/vmlinuz-$kver

# The uncompressed vmlinux (ELF with a PVH note) is inside the bzImage: find the payload by its
# compression magic and decompress it (trailing bytes after the payload are ignored).
extract() { # MAGIC PACKAGE DECOMPRESSOR...
    local magic=$1 pkg=$2
    shift 2
    local off
    off=$(grep -obUaP "$magic" "$vmlinuz" | head -1 | cut -d: -f1) || true
    [ -n "$off" ] || return 1
    command -v "$1" >/dev/null 2>&1 ||
        die_missing "$1 is needed to unpack the kernel (apt-get install $pkg)"
    tail -c +$((off + 1)) "$vmlinuz" | "$@" >"$work/vmlinux" 2>/dev/null || true
    [ "$(head -c 4 "$work/vmlinux" | od -An -c | tr -d ' ')" = '177ELF' ]
}
extract '\x02\x21\x4c\x18' lz4 lz4 -dc ||
    extract '\x28\xb5\x2f\xfd' zstd zstd -dc ||
    extract '\xfd\x37\x7a\x58\x5a\x00' xz-utils xz -dc ||
    extract '\x1f\x8b\x08' gzip gzip -dc ||
    { echo "build-guest: cannot extract vmlinux from $vmlinuz" >&2; exit 1; }

# --- the initramfs tree ----------------------------------------------------------------------
root=$work/root
mkdir -p "$root"/{bin,sbin,usr/bin,usr/sbin,lib64,lib/x86_64-linux-gnu,etc,dev,proc,sys,run,tmp,mnt,root,var/tmp}
ln -s ../proc/self/mounts "$root/etc/mtab"
echo "root:x:0:0:root:/root:/bin/bash" >"$root/etc/passwd"
echo "root:x:0:" >"$root/etc/group"

copy_with_libs() {
    local src=$1 dst=$2 libs
    install -D -m 0755 "$(readlink -f "$src")" "$root$dst"
    # A static binary (busybox-static) has no libraries: ldd says so and exits 1.
    libs=$(ldd "$src" 2>/dev/null | awk '/=> \// {print $3} /^\t\/lib/ {print $1}') || true
    for lib in $libs; do
        [ -e "$root$lib" ] || install -D -m 0755 "$(readlink -f "$lib")" "$root$lib"
    done
}

# busybox first (its applets fill the gaps), then the real tools over them.
copy_with_libs "$(command -v busybox)" /bin/busybox
for applet in $("$root/bin/busybox" --list); do
    [ -e "$root/bin/$applet" ] || ln -s busybox "$root/bin/$applet"
done
for pair in "${required_tools[@]}"; do
    cmd=${pair%%:*}
    [ "$cmd" = busybox ] && continue
    copy_with_libs "$(command -v "$cmd")" "/usr/bin/$cmd"
done
for cmd in "${optional_tools[@]}"; do
    p=$(command -v "$cmd" 2>/dev/null) || continue
    case $p in /*) copy_with_libs "$p" "/usr/bin/$cmd" ;; esac
done
for m in modprobe insmod lsmod rmmod depmod modinfo; do
    ln -sf kmod "$root/usr/bin/$m"
done
ln -sf ../usr/bin/modprobe "$root/sbin/modprobe"
ln -sf ../usr/bin/bash "$root/bin/bash"
# glibc loads libgcc_s at run time for thread cancellation (cryptsetup's argon2 threads).
for lib in /lib/x86_64-linux-gnu/libgcc_s.so.1; do
    [ -e "$lib" ] && install -D -m 0755 "$lib" "$root$lib"
done
# Tests copy the host's dmkit binary into the guest: it needs libssl besides the libraries the
# tools above bring (libcrypto, libgcc_s, libc). Here rather than on each test's disk, so the
# guest has one place for libraries and every test that runs dmkit gets it.
libssl=$(readlink -f /usr/lib/x86_64-linux-gnu/libssl.so.3 2>/dev/null || true)
[ -e "$libssl" ] || die_missing "libssl.so.3 is not installed (apt-get install libssl3)"
install -D -m 0755 "$libssl" "$root/lib/x86_64-linux-gnu/libssl.so.3"

# Modules: dm, crypto, virtio, loop, the read-only root file systems EROFS and SquashFS (and
# their dependencies), with depmod's indexes so the kernel's request_module (crypto algorithms,
# dm targets, file systems) finds them through /sbin/modprobe.
kmods=$work/pkg/lib/modules/$kver
dst=$root/lib/modules/$kver
mkdir -p "$dst"
cp "$kmods"/modules.order "$kmods"/modules.builtin "$kmods"/modules.builtin.modinfo "$dst"/
(
    cd "$kmods"
    for d in kernel/drivers/md kernel/crypto kernel/arch/x86/crypto kernel/lib kernel/drivers/virtio \
        kernel/drivers/block/virtio_blk.ko* kernel/drivers/block/loop.ko* \
        kernel/drivers/char/virtio_console.ko* kernel/drivers/char/hw_random \
        kernel/drivers/firmware/qemu_fw_cfg.ko* kernel/security kernel/fs/erofs kernel/fs/squashfs kernel/fs/fat kernel/fs/nls; do
        [ -e "$d" ] && find "$d" -name '*.ko*'
    done
) | while read -r m; do
    install -D -m 0644 "$kmods/$m" "$dst/$m"
done
depmod -b "$root" "$kver"

install -m 0755 "$here/init" "$root/init"
echo "$versions" >"$root/etc/dmkit-guest-versions"

# --- archive: newc, uncompressed (the kernel unpacks it fastest), owned by root ------------
(
    cd "$root"
    if command -v cpio >/dev/null 2>&1; then
        find . -mindepth 1 | sort | cpio -o -H newc -R 0:0 --quiet
    else
        find . -mindepth 1 | sort | busybox cpio -o -H newc -R 0:0
    fi
) >"$work/initramfs.cpio"

mkdir -p "$work/out"
mv "$work/vmlinux" "$work/initramfs.cpio" "$work/out/"
echo "$versions" >"$work/out/versions"
echo "$kver" >"$work/out/kernel-release"
if ! mv -T "$work/out" "$out" 2>/dev/null; then
    # Another run built it at the same time; theirs is as good as ours.
    [ -s "$out/initramfs.cpio" ] || { echo "build-guest: cannot create $out" >&2; exit 1; }
fi
echo "build-guest: built $(du -sh "$out" | cut -f1) in $SECONDS s" >&2
echo "$out"
