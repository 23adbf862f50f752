#!/bin/sh
# Speed of the ptrace block tracer (aetrace-verify) on `gzip -c` of a 200 kB
# input, against the native run and valgrind lackey in the same run.
# Usage: bench/verify.sh   (CARGO_TARGET_DIR is honoured)
set -eu
cd "$(dirname "$0")/.."
T=${CARGO_TARGET_DIR:-target}
cargo build --release -q -p aetrace-verify --example follow
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# 200 kB of mixed text and binary: compresses like real data.
{ cat /usr/share/common-licenses/* /etc/services 2>/dev/null; cat /usr/bin/gzip; } | head -c 200000 > "$tmp/in"
now() { date +%s.%N; }
t0=$(now); gzip -c "$tmp/in" > "$tmp/native.gz"; t1=$(now)
"$T/release/examples/follow" gzip -c "$tmp/in" > "$tmp/verify.gz" 2> "$tmp/stats"; t2=$(now)
valgrind --tool=lackey --trace-mem=yes --log-file=/dev/null gzip -c "$tmp/in" > "$tmp/lackey.gz"; t3=$(now)
cmp "$tmp/native.gz" "$tmp/verify.gz"
cmp "$tmp/native.gz" "$tmp/lackey.gz"
blocks=$(sed -n 's/.*blocks: \([0-9]*\),.*/\1/p' "$tmp/stats")
echo "stats: $(tail -1 "$tmp/stats")"
awk -v n="$(echo "$t1 - $t0" | bc)" -v v="$(echo "$t2 - $t1" | bc)" -v l="$(echo "$t3 - $t2" | bc)" -v b="$blocks" 'BEGIN {
  printf "native  %.3f s\nverify  %.3f s  (%.0fx native, %.0f blocks/s, %d blocks)\nlackey  %.3f s  (%.0fx native)\nverify/lackey %.2f\n", n, v, v/n, b/v, b, l, l/n, v/l }'
