#!/usr/bin/env bash
# The main job on the bundled example (traces/demo.c): recover its CFGs, take
# its instruction and data address stream, and simulate an L1I + L1D + L2
# hierarchy, naive against blocked matrix multiply.
#
# Until `aetrace record` and `aetrace regen` land (issues 4 and 5), the
# address stream comes from valgrind lackey; the cache simulator and the CFG
# recovery are aetrace's own.
set -euo pipefail
cd "$(dirname "$0")"
.ci/deps
cargo build --release --quiet
aetrace=${CARGO_TARGET_DIR:-target}/release/aetrace
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

gcc -O2 -g -o "$work/demo" traces/demo.c
echo "== aetrace cfg: control-flow graphs of the example"
"$aetrace" cfg "$work/demo" | sed -n '1,20p'

for variant in naive blocked; do
    echo
    echo "== $variant matrix multiply: $("$work/demo" "${variant:0:1}")"
    # lackey's "I/L/S/M addr,size" lines become Dinero extended din.
    valgrind --tool=lackey --trace-mem=yes "$work/demo" "${variant:0:1}" 2>&1 >/dev/null \
        | awk -F'[ ,]+' '/^I /{print "i", $2, $3} /^ [LM] /{print "r", $3, $4} /^ [SM] /{print "w", $3, $4}' \
        > "$work/$variant.din"
    echo "   $(wc -l < "$work/$variant.din") references"
    "$aetrace" cachesim -l1-isize 32k -l1-ibsize 64 -l1-iassoc 8 \
        -l1-dsize 32k -l1-dbsize 64 -l1-dassoc 8 \
        -l2-usize 256k -l2-ubsize 64 -l2-uassoc 8 "$work/$variant.din" > "$work/$variant.stats"
    grep -E 'cache|Demand miss rate|Demand Misses' "$work/$variant.stats"
    # The total demand misses of the L1 data cache (first number after the label).
    awk '/^l1-dcache/{d=1} d && /Demand Misses/{print $3; exit}' "$work/$variant.stats" > "$work/$variant.l1d"
done
naive=$(cat "$work/naive.l1d"); blocked=$(cat "$work/blocked.l1d")
echo
echo "== summary: L1D demand misses, naive $naive, blocked $blocked:" \
     "$(awk -v n="$naive" -v b="$blocked" 'BEGIN {printf "%.1f", n / b}')x fewer when blocked"
