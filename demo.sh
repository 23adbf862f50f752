#!/usr/bin/env bash
# The main job on the bundled example (traces/demo.c): recover its CFGs,
# record its run with aetrace (witness trace), regenerate the exact
# instruction stream of the program's own code and simulate its instruction
# cache; then record it again with data addresses (record --data: the
# regenerator recomputes them by abstract execution) and simulate an L1I +
# L1D + L2 hierarchy on the program's instruction and data stream, naive
# against blocked matrix multiply. Everything is aetrace's own: no valgrind.
# The traced module is the executable (libc is not, without --libs), so the
# references simulated are the program's own.
set -euo pipefail
cd "$(dirname "$0")"
.ci/deps
cargo build --release --quiet
aetrace=${CARGO_TARGET_DIR:-target}/x86_64-unknown-linux-gnu/release/aetrace
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

gcc -O2 -g -o "$work/demo" traces/demo.c
echo "== aetrace cfg: control-flow graphs of the example"
"$aetrace" cfg "$work/demo" | sed -n '1,20p'

echo
echo "== aetrace record / regen / cachesim: the program's own instructions"
for variant in naive blocked; do
    "$aetrace" record -o "$work/$variant.aet" -- "$work/demo" "${variant:0:1}" >/dev/null
    "$aetrace" info "$work/$variant.aet" | grep -E 'executed instructions|bits per'
    "$aetrace" regen --format xdin "$work/$variant.aet" \
        | "$aetrace" cachesim -l1-isize 4k -l1-ibsize 64 -l1-iassoc 2 > "$work/$variant.istats"
    echo "   $variant: L1I $(grep -m1 'Demand Fetches' "$work/$variant.istats" | awk '{print $3}') fetches," \
         "$(grep -m1 'Demand Misses' "$work/$variant.istats" | awk '{print $3}') misses"
done

for variant in naive blocked; do
    echo
    echo "== $variant matrix multiply: $("$work/demo" "${variant:0:1}")"
    "$aetrace" record --data -o "$work/$variant-data.aet" -- "$work/demo" "${variant:0:1}" >/dev/null
    "$aetrace" info "$work/$variant-data.aet" | grep -E '^data references'
    # Regenerated and simulated in this process; the same figures as
    # `aetrace regen --format xdin --data TRACE | aetrace cachesim ...`.
    "$aetrace" cachesim -l1-isize 32k -l1-ibsize 64 -l1-iassoc 8 \
        -l1-dsize 32k -l1-dbsize 64 -l1-dassoc 8 \
        -l2-usize 256k -l2-ubsize 64 -l2-uassoc 8 "$work/$variant-data.aet" > "$work/$variant.stats"
    grep -E 'cache|Demand miss rate|Demand Misses' "$work/$variant.stats"
    # The total demand misses of the L1 data cache (first number after the label).
    awk '/^l1-dcache/{d=1} d && /Demand Misses/{print $3; exit}' "$work/$variant.stats" > "$work/$variant.l1d"
done
naive=$(cat "$work/naive.l1d"); blocked=$(cat "$work/blocked.l1d")
echo
echo "== summary: L1D demand misses, naive $naive, blocked $blocked:" \
     "$(awk -v n="$naive" -v b="$blocked" 'BEGIN {printf "%.1f", n / b}')x fewer when blocked"
