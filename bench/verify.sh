#!/bin/sh
# Speed of `aetrace verify` on `gzip -c` of a 200 kB input: the trace is
# recorded first, then verified (the original gzip re-run under the ptrace
# block follower, compared block by block with the regenerated trace).
# Baselines measured in the same run: the native gzip (best of 5: it takes
# milliseconds) and valgrind lackey with --trace-mem=yes. Then the same for
# `aetrace verify --profile` on a profile of the same run, the trace check
# again with --no-pin, and the cost of a stop's ptrace requests.
# Usage: bench/verify.sh   (CARGO_TARGET_DIR is honoured)
set -eu
cd "$(dirname "$0")/.."
T=${CARGO_TARGET_DIR:-target}
cargo build --release -q --bin aetrace
A="$T/x86_64-unknown-linux-gnu/release/aetrace"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export AETRACE_CACHE="$tmp/cache"
# 200 kB of mixed text and binary: compresses like real data.
{ cat /usr/share/common-licenses/* /etc/services 2>/dev/null; cat /usr/bin/gzip; } | head -c 200000 > "$tmp/in"
now() { date +%s.%N; }
native=1000
for i in 1 2 3 4 5; do
    t0=$(now); gzip -c "$tmp/in" > "$tmp/native.gz"; t1=$(now)
    native=$(echo "$t1 - $t0" | bc | awk -v m="$native" '{ print ($1 < m) ? $1 : m }')
done
"$A" record -o "$tmp/t.aet" -- gzip -c "$tmp/in" > "$tmp/recorded.gz" < /dev/null
cmp "$tmp/native.gz" "$tmp/recorded.gz"
t2=$(now); "$A" verify "$tmp/t.aet" > "$tmp/report"; t3=$(now)
# The same check with the follower and gzip on any CPU (--no-pin).
t7=$(now); "$A" verify --no-pin "$tmp/t.aet" > "$tmp/report-free"; t8=$(now)
valgrind --tool=lackey --trace-mem=yes --log-file=/dev/null gzip -c "$tmp/in" > "$tmp/lackey.gz"; t4=$(now)
cmp "$tmp/native.gz" "$tmp/lackey.gz"
# The profile check (paper 004's own use) on the same input: profile once,
# then every block and edge count checked under the follower.
"$A" profile -o "$tmp/p.aprof" -- gzip -c "$tmp/in" > "$tmp/profiled.gz" < /dev/null
cmp "$tmp/native.gz" "$tmp/profiled.gz"
t5=$(now); "$A" verify --profile "$tmp/p.aprof" -- gzip -c "$tmp/in" > "$tmp/preport" < /dev/null; t6=$(now)
echo "report: $(tail -1 "$tmp/report")"
echo "profile report: $(tail -1 "$tmp/preport")"
pblocks=$(sed -n 's/^exact: .*(\([0-9]*\) blocks followed.*/\1/p' "$tmp/preport")
awk -v n="$native" -v v="$(echo "$t6 - $t5" | bc)" -v b="$pblocks" 'BEGIN {
  printf "verify --profile  %.3f s  (%.0fx native, %.0f blocks followed/s, %d blocks)\n", v, v/n, b/v, b }'
blocks=$(sed -n 's/^exact: \([0-9]*\) blocks.*/\1/p' "$tmp/report")
awk -v n="$native" -v v="$(echo "$t3 - $t2" | bc)" -v l="$(echo "$t4 - $t3" | bc)" -v b="$blocks" 'BEGIN {
  printf "native  %.4f s (best of 5)\nverify  %.3f s  (%.0fx native, %.0f blocks checked/s, %d blocks)\nlackey  %.3f s  (%.0fx native)\nverify/lackey %.2f\n", n, v, v/n, b/v, b, l, l/n, v/l }'
awk -v n="$native" -v v="$(echo "$t8 - $t7" | bc)" -v l="$(echo "$t4 - $t3" | bc)" -v b="$blocks" 'BEGIN {
  printf "verify --no-pin  %.3f s  (%.0fx native, %.0f blocks checked/s)\nverify --no-pin/lackey %.2f\n", v, v/n, b/v, v/l }'
echo "no-pin report: $(tail -1 "$tmp/report-free")"
# The price of one stop's pieces (docs/verify.md, Speed).
cc -O2 -o "$tmp/ptrace_cost" bench/ptrace_cost.c && "$tmp/ptrace_cost" 100000
