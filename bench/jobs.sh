#!/usr/bin/env bash
# Issue 24 item 4: `regen -j 2` against `-j 1` on one long stream, one
# command from the repository root:  bench/jobs.sh   (REPS=N rounds,
# default 3)
#
# Debian's gzip (and bzip2 with libbz2) compressing 2 MB of libc's bytes
# (as bench/sim.sh), recorded once; `aetrace index` writes the state index
# (its time is printed). Then for `--format bin`, `--format block` and
# `--count`, output to /dev/null: `-j 1` (one walk, no index), `-j 2` from
# the index, and `-j 2 --no-index` (the serial fast pass cuts the stream
# first). The three run alternately, REPS rounds; wall time is the best
# of REPS runs, CPU time (user + sys, all threads) too, and "median" is
# the median of the REPS wall ratios of `-j 1` and `-j 2` run next to each
# other (two runs minutes apart moved the same binary's ratio from 1.4x
# to 2x, docs/regen.md section 5; runs next to each other see the same
# machine). Ratios are `-j 1` over `-j 2` (> 1:
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

# One run of "$@" (output discarded): wall seconds, CPU seconds (user +
# sys, all threads) and system seconds (-j 2's extra CPU was the
# kernel's: page faults of output batches waiting for the piece before
# them), from bash's `time`.
timed() {
    local TIMEFORMAT='%R %U %S'
    { time "$@" >/dev/null 2>&1; } 2>&1 | tail -1 | awk '{ printf "%.3f %.3f %.3f\n", $1, $2 + $3, $3 }'
}

# The median of the numbers on stdin.
median() {
    sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

WORKLOADS=(
    "gzip 2MB|none|/usr/bin/gzip -c libc-2m"
    "bzip2 2MB|libbz2.so.1.0|/usr/bin/bzip2 -c libc-2m"
)
echo "machine: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-11s %-6s %8s %8s %8s %8s %8s %8s %8s %8s %9s %9s %9s\n' workload mode "j1 wall" "j2 wall" "j2 pass" "j1 CPU" "j2 CPU" "pass CPU" "j1 sys" "j2 sys" "wall j1/j2" "median" "CPU j1/j2"
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
        # The three alternate run by run, so that a change of the
        # machine's speed within the run (other guests of the host, other
        # jobs) weighs on all three alike: the best of each, and the
        # median of the REPS ratios of neighbouring runs.
        : >runs
        for ((i = 0; i < REPS; i++)); do
            echo "$(timed "$AETRACE" regen --no-index -j 1 "${opt[@]}" t.aet)" \
                "$(timed "$AETRACE" regen -j 2 "${opt[@]}" t.aet)" \
                "$(timed "$AETRACE" regen --no-index -j 2 "${opt[@]}" t.aet)" >>runs
        done
        low() { awk -v c="$1" 'NR == 1 || $c < b { b = $c; l = $0 } END { print l }' runs; }
        read -r j1 _ _ _ _ _ _ _ _ < <(low 1)
        read -r _ _ _ j2 _ _ _ _ _ < <(low 4)
        read -r _ _ _ _ _ _ jp _ _ < <(low 7)
        read -r _ c1 s1 _ _ _ _ _ _ < <(low 2)
        read -r _ _ _ _ c2 s2 _ _ _ < <(low 5)
        read -r _ _ _ _ _ _ _ cp _ < <(low 8)
        mw=$(awk '{ print $1 / $4 }' runs | median)
        awk -v n="$name" -v m="$mode" -v a="$j1" -v b="$j2" -v p="$jp" -v c="$c1" -v d="$c2" -v q="$cp" \
            -v s1="$s1" -v s2="$s2" -v mw="$mw" 'BEGIN {
            printf "%-11s %-6s %8.3f %8.3f %8.3f %8.3f %8.3f %8.3f %8.3f %8.3f %8.2fx %8.2fx %8.2fx\n", n, m, a, b, p, c, d, q, s1, s2, a / b, mw, c / d }'
    done
    rm -f t.aet t.aet.idx one.out runs
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
