#!/bin/sh
# Online reencryption's effect on a concurrent sequential reader: fio reads the open device
# (1 MiB, O_DIRECT, through the loop device) for a while before, then during `luks reencrypt
# NAME`; the MB/s of both phases and their ratio are printed. The image holds random data (no
# holes to read for free) and the page cache is dropped before each phase, so both phases read
# the disk. Root, FUSE, loop, fio, cryptsetup.
# Usage: scripts/bench-online-reencrypt.sh [DATA_MIB] (default 1024; the image lives in $TMPDIR).
set -eu
MIB=${1:-1024}
D=${DMKIT:-$(dirname "$0")/../target/release/dmkit}
W=$(mktemp -d)
export DMKIT_RUN_DIR="$W/run"
mkdir "$DMKIT_RUN_DIR"
trap '"$D" close benchre >/dev/null 2>&1 || true; rm -rf "$W"' EXIT
printf 'bench' > "$W/pass"
head -c $(( (MIB + 16) << 20 )) /dev/urandom > "$W/img"
cryptsetup luksFormat --batch-mode --type luks2 --pbkdf pbkdf2 --pbkdf-force-iterations 1000 --key-file "$W/pass" "$W/img"
LOOP=$("$D" luks open "$W/img" benchre --key-file "$W/pass" --loop | sed -n 2p)
read_mbs() { # fio sequential 1 MiB reads for $1 seconds from a cold cache; prints MB/s
  sync; echo 3 > /proc/sys/vm/drop_caches
  fio --name=seqread --filename="$LOOP" --rw=read --bs=1M --direct=1 --ioengine=libaio --iodepth=4 \
    --time_based --runtime="$1" --output-format=json 2>/dev/null |
    python3 -c 'import json,sys; print("%.1f" % (json.load(sys.stdin)["jobs"][0]["read"]["bw_bytes"]/1e6))'
}
BEFORE=$(read_mbs 5)
"$D" luks reencrypt benchre --key-file "$W/pass" --pbkdf pbkdf2 --pbkdf-force-iterations 1000 --batch-mode > "$W/progress" 2>&1 &
RE=$!
T0=$(date +%s.%N)
sleep 0.2
DURING=$(read_mbs 4)
wait $RE
T1=$(date +%s.%N)
echo "data: $MIB MiB; reencryption took $(python3 -c "print('%.1f' % ($T1-$T0))") s (with the reader)"
echo "sequential 1 MiB reads: before $BEFORE MB/s, during reencryption $DURING MB/s, ratio $(python3 -c "print('%.2f' % ($DURING/$BEFORE))")"
"$D" status benchre | grep reencryption
