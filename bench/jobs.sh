#!/usr/bin/env bash
# Issue 24 item 4: `regen -j 2` against `-j 1` on one long stream, one
# command from the repository root:  bench/jobs.sh   (REPS=N: best of N,
# default 3)
#
# Debian's gzip (and bzip2 with libbz2) compressing 2 MB of libc's bytes
# (as bench/sim.sh), recorded once; `aetrace index` writes the state index
# (its time is printed). Then for `--format bin`, `--format block` and
# `--count`, output to /dev/null: `-j 1` (one walk, no index), `-j 2` from
# the index, and `-j 2 --no-index` (the serial fast pass cuts the stream
# first). Wall time is the best of REPS runs; CPU time (user + sys, all
# threads) is the best of REPS runs too. Ratios are `-j 1` over `-j 2` (> 1:
# `-j 2` faster), measured in this run. The target is a wall-time ratio of
# at least 1.8 on an idle 2-core machine; on a loaded one (see the load
# average printed) two threads wait for cores more than one does, and the
# CPU ratio (about 1 when splitting costs nothing) says what the split
# costs. Every `-j 2` output is compared with `-j 1`'s (cmp) first.
# On a busy machine run it as `chrt -f 50 bench/jobs.sh` (root): every
# command it times then gets both cores (SCHED_FIFO) and the wall ratio
# means something again; but SCHED_FIFO gives no time slices, so `-j 2`'s
# writer thread then runs only when a worker blocks (docs/regen.md
# section 5, "Where `-j 2` loses").
set -euo pipefail
cd "$(dirname "$0")/.."
REPS=${REPS:-3}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-target}
cargo build --release -q -p aetrace --bin aetrace
AETRACE=$(realpath "$CARGO_TARGET_DIR/x86_64-unknown-linux-gnu/release/aetrace")
. bench/lib.sh
WORK=$(mktemp -d /dev/shm/aetrace-jobs.XXXXXX 2>/dev/null || mktemp -d)
trap 'rm -rf "$WORK"' EXIT
cd "$WORK"
LIBC=$(ldd /usr/bin/gzip | awk '/libc.so/ { print $3 }')
head -c 2000000 "$LIBC" >libc-2m

# Best CPU seconds (user + sys, all threads) of REPS runs of "$@", then
# that run's system seconds (-j 2's extra CPU was the kernel's: page
# faults of output batches waiting for the piece before them).
cpu() {
    local i line t b="" bs=""
    for ((i = 0; i < REPS; i++)); do
        line=$( { TIMEFORMAT='%U %S'; time "$@" >/dev/null 2>&1; } 2>&1 | tail -1)
        t=$(awk -v l="$line" 'BEGIN { split(l, f, " "); printf "%.3f", f[1] + f[2] }')
        if [ -z "$b" ] || awk -v t="$t" -v b="$b" 'BEGIN { exit !(t < b) }'; then b=$t bs=${line#* }; fi
    done
    echo "$b $bs"
}

WORKLOADS=(
    "gzip 2MB|none|/usr/bin/gzip -c libc-2m"
    "bzip2 2MB|libbz2.so.1.0|/usr/bin/bzip2 -c libc-2m"
)
echo "machine: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-11s %-6s %8s %8s %8s %8s %8s %8s %8s %8s %9s %9s\n' workload mode "j1 wall" "j2 wall" "j2 pass" "j1 CPU" "j2 CPU" "pass CPU" "j1 sys" "j2 sys" "wall j1/j2" "CPU j1/j2"
for w in "${WORKLOADS[@]}"; do
    workload "$w" || continue
    "$AETRACE" record --libs "$libs" -o t.aet -- "${cmd[@]}" >/dev/null
    idx=$(best "$AETRACE" index t.aet)
    echo "$name: aetrace index t.aet: $idx s ($(stat -c %s t.aet.idx) bytes)"
    for mode in bin block count; do
        case $mode in
            count) opt=(--count) ;;
            *) opt=(--format "$mode") ;;
        esac
        "$AETRACE" regen --no-index -j 1 "${opt[@]}" t.aet >one.out
        "$AETRACE" regen -j 2 "${opt[@]}" t.aet | cmp - one.out
        "$AETRACE" regen --no-index -j 2 "${opt[@]}" t.aet | cmp - one.out
        j1=$(best "$AETRACE" regen --no-index -j 1 "${opt[@]}" t.aet)
        j2=$(best "$AETRACE" regen -j 2 "${opt[@]}" t.aet)
        jp=$(best "$AETRACE" regen --no-index -j 2 "${opt[@]}" t.aet)
        read -r c1 s1 < <(cpu "$AETRACE" regen --no-index -j 1 "${opt[@]}" t.aet)
        read -r c2 s2 < <(cpu "$AETRACE" regen -j 2 "${opt[@]}" t.aet)
        read -r cp _ < <(cpu "$AETRACE" regen --no-index -j 2 "${opt[@]}" t.aet)
        awk -v n="$name" -v m="$mode" -v a="$j1" -v b="$j2" -v p="$jp" -v c="$c1" -v d="$c2" -v q="$cp" \
            -v s1="$s1" -v s2="$s2" 'BEGIN {
            printf "%-11s %-6s %8.3f %8.3f %8.3f %8.3f %8.3f %8.3f %8.3f %8.3f %8.2fx %8.2fx\n", n, m, a, b, p, c, d, q, s1, s2, a / b, c / d }'
    done
    rm -f t.aet t.aet.idx one.out
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
