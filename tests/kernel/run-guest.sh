#!/usr/bin/env bash
# Run a bash script as root in a Debian kernel booted under QEMU (TCG), with host image files
# attached as virtio disks: the real kernel as a test oracle for dm-verity, dm-integrity,
# dm-crypt and fs-verity.
#
#   tests/kernel/run-guest.sh [options] SCRIPT
#   tests/kernel/run-guest.sh --prepare
#
# Options:
#   --disk NAME=PATH[:ro|:rw]   attach PATH (raw image) as /dev/disk/NAME in the guest
#                               (read-only by default; NAME: up to 20 of [A-Za-z0-9_.-]).
#                               At most 24 disks.
#   --timeout SECONDS           kill the guest after this long (default 300)
#   --memory MIB                guest memory (default 1024)
#   --console FILE              keep the guest console log here (default: a temporary file)
#
# The script's stdout and stderr come back on this script's stdout and stderr, binary-clean
# (over virtio-serial, streamed while the guest runs), and its exit status is this script's
# exit status. If the guest dies, hangs or never runs the script, the exit status is 125 and
# the tail of the guest console is printed on stderr after a line starting `run-guest:`.
#
# --prepare installs nothing: it checks qemu-system-x86_64 and builds (or finds) the cached
# guest (tests/kernel/build-guest.sh), printing its directory. Exit 77 means a prerequisite is
# missing (the message says which); scripts/deps.sh installs them.
#
# Environment: DMKIT_KERNEL_CACHE (default <repo>/target/kernel-cache).
#
# How it boots, and why (each matters for speed or robustness under TCG on a host without KVM):
# the uncompressed vmlinux through its PVH entry with qboot instead of SeaBIOS, machine q35, one
# vCPU, an uncompressed initramfs, `cryptomgr.notests`; output over virtio-serial, not the UART
# (the UART FIFO loses bytes at power-off); the script on a small virtio disk of its own.
set -euo pipefail
export LC_ALL=C

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
cache=${DMKIT_KERNEL_CACHE:-$repo/target/kernel-cache}

fail() {
    echo "run-guest: $*" >&2
    exit 125
}

qemu=$(command -v qemu-system-x86_64 || true)

prepare() {
    [ -n "$qemu" ] || { echo "run-guest: qemu-system-x86_64 is not installed (apt-get install qemu-system-x86)" >&2; exit 77; }
    bash "$here/build-guest.sh" "$cache"
}

if [ "${1:-}" = --prepare ]; then
    prepare
    exit 0
fi

disks=()
timeout_s=300
memory=1024
console=""
while [ $# -gt 0 ]; do
    case $1 in
        --disk) disks+=("$2"); shift 2 ;;
        --timeout) timeout_s=$2; shift 2 ;;
        --memory) memory=$2; shift 2 ;;
        --console) console=$2; shift 2 ;;
        --) shift; break ;;
        -*) fail "unknown option $1" ;;
        *) break ;;
    esac
done
[ $# -eq 1 ] || fail "usage: run-guest.sh [--disk NAME=PATH[:ro|:rw]]... [--timeout S] SCRIPT"
script=$1
[ -f "$script" ] || fail "no script $script"
[ ${#disks[@]} -le 24 ] || fail "at most 24 disks (got ${#disks[@]})"

guest=$(prepare) || exit $?
qboot=""
for f in /usr/share/qemu/qboot.rom /usr/share/seabios/qboot.rom; do
    [ -e "$f" ] && { qboot=$f; break; }
done

tmp=$(mktemp -d "${TMPDIR:-/tmp}/dmkit-guest.XXXXXX")
qemu_pid=""
cleanup() {
    [ -n "$qemu_pid" ] && kill "$qemu_pid" 2>/dev/null
    rm -rf "$tmp"
}
trap cleanup EXIT
[ -n "$console" ] || console=$tmp/console.log
: >"$console"

# The script disk: the script padded to whole sectors; its length goes on the command line.
size=$(stat -c %s "$script")
cp "$script" "$tmp/script.img"
truncate -s $(((size + 511) / 512 * 512 + 512)) "$tmp/script.img"

args=(
    -machine q35,accel=tcg -cpu max -smp 1 -m "$memory"
    -nodefaults -no-user-config -display none -no-reboot
    -kernel "$guest/vmlinux" -initrd "$guest/initramfs.cpio"
    -append "console=ttyS0 quiet loglevel=3 panic=-1 reboot=t cryptomgr.notests rdinit=/init dmkit_script_size=$size"
    -serial "file:$console"
    -device virtio-rng-pci
    -device virtio-serial-pci,id=vser
    -chardev "file,id=out,path=$tmp/stdout"
    -device virtserialport,bus=vser.0,chardev=out,name=dmkit.stdout
    -chardev "file,id=err,path=$tmp/stderr"
    -device virtserialport,bus=vser.0,chardev=err,name=dmkit.stderr
    -chardev "file,id=status,path=$tmp/status"
    -device virtserialport,bus=vser.0,chardev=status,name=dmkit.status
    -drive "file=$tmp/script.img,if=none,id=script,format=raw,readonly=on"
    -device virtio-blk-pci,drive=script,serial=dmkit-script
)
[ -n "$qboot" ] && args+=(-bios "$qboot")

i=0
for d in "${disks[@]}"; do
    name=${d%%=*}
    rest=${d#*=}
    mode=ro
    case $rest in
        *:ro) rest=${rest%:ro} ;;
        *:rw) rest=${rest%:rw}; mode=rw ;;
    esac
    [[ $name =~ ^[A-Za-z0-9_.-]{1,20}$ ]] || fail "bad disk name '$name' (up to 20 of A-Za-z0-9_.-)"
    [ -f "$rest" ] || [ -b "$rest" ] || fail "no image $rest for disk $name"
    ro=off
    [ $mode = ro ] && ro=on
    args+=(
        -drive "file=$rest,if=none,id=d$i,format=raw,readonly=$ro,cache=writeback"
        -device "virtio-blk-pci,drive=d$i,serial=$name"
    )
    i=$((i + 1))
done

: >"$tmp/stdout"
: >"$tmp/stderr"
start=$(date +%s%N)
timeout --kill-after=5 "$timeout_s" "$qemu" "${args[@]}" </dev/null >"$tmp/qemu.log" 2>&1 &
qemu_pid=$!
# Stream while the guest runs; tail reads to the end once more after qemu is gone.
tail -c +1 --pid="$qemu_pid" -s 0.2 -f "$tmp/stdout" &
tail_out=$!
tail -c +1 --pid="$qemu_pid" -s 0.2 -f "$tmp/stderr" >&2 &
tail_err=$!
set +e
wait "$qemu_pid"
qemu_rc=$?
qemu_pid=""
wait "$tail_out" "$tail_err"
set -e
elapsed=$(( ($(date +%s%N) - start) / 1000000 ))ms

status=$(sed -n 's/^dmkit-status \([0-9]*\)$/\1/p' "$tmp/status" | tail -1)
if [ -z "$status" ] || [ "$status" = 125 ]; then
    if [ "$qemu_rc" = 124 ] || [ "$qemu_rc" = 137 ]; then
        why="guest timed out after ${timeout_s}s"
    else
        why="guest died without running the script to its end (qemu exit $qemu_rc)"
    fi
    {
        echo "run-guest: $why; qemu said:"
        tail -n 20 "$tmp/qemu.log"
        echo "run-guest: guest console tail:"
        tail -n 60 "$console"
    } >&2
    exit 125
fi
[ -n "${DMKIT_GUEST_VERBOSE:-}" ] && echo "run-guest: guest ran in ${elapsed}, status $status" >&2
exit "$status"
