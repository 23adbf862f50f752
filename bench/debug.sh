#!/usr/bin/env bash
# Speed of `aetrace debug` time travel (issue 22): gdb (`-batch`) connected
# to `aetrace debug --server` on the trace of `gzip -c` of a 20 kB input;
# `continue` from the first instruction runs to the last (no breakpoint),
# `reverse-continue` from the last back to the first. Each is timed as a
# gdb session minus the same session without that command (best of REPS),
# and reported in executed instructions per second (target: 100 M/s) and
# against `aetrace regen --format bin` of the same trace to /dev/null,
# timed in the same run. Then the cost of a stop against the history
# before it (below). AETRACE=PATH measures that binary (an older build,
# for a before and after) instead of this tree's.
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh
REPS=${REPS:-5}
cargo build --release -p aetrace --quiet
A=${AETRACE:-$(realpath "${CARGO_TARGET_DIR:-target}/x86_64-unknown-linux-gnu/release/aetrace")}
WORK=$(mktemp -d /tmp/aetrace-bench.XXXXXX)
trap 'rm -rf "$WORK"' EXIT

{ cat /usr/share/common-licenses/* /etc/services 2>/dev/null; cat /usr/bin/gzip; } | head -c 20000 >"$WORK/in" || true
"$A" record -o "$WORK/t.aet" -- gzip -c "$WORK/in" >/dev/null </dev/null
N=$("$A" regen --count --thread 0 "$WORK/t.aet" | awk '/^total:/ {print $2}')

session() { # name, gdb commands after connecting
    printf 'set remotetimeout 60\ntarget remote | %q debug --server %q\n%s\n' "$A" "$WORK/t.aet" "$2" >"$WORK/$1.gdb"
}
# Wall time, and CPU time where perf is installed (the figures to read on
# a loaded machine).
# Each crossing is repeated K times in one session (a seek back to the
# start or the end between them) so that the gdb session's own cost, which
# is subtracted, is small against what is measured.
K=10
again() { for ((i = 0; i < K; i++)); do printf '%s\n' "$@"; done; }
flush='maintenance flush register-cache'
session connect ''
session once 'continue'
session forward "$(again 'monitor seek 0' "$flush" continue)"
session backward "continue
$(again "monitor seek $((N - 1))" "$flush" reverse-continue)"
# The same seeks without the crossings: a stop's own cost (the registers
# gdb reads there, the frames' walk at the end) is not the crossing's.
session seeks0 "$(again 'monitor seek 0' "$flush")"
session seeksN "continue
$(again "monitor seek $((N - 1))" "$flush")"
run() { gdb -batch -nx -x "$WORK/$1.gdb" /usr/bin/gzip 2>/dev/null; }

# CPU time (user and system, gdb and the stub: perf's task-clock counts
# the children) in seconds, best of REPS: on the shared machine wall time
# is mostly other processes' (negative differences at load 20).
best_cpu() {
    local i t b="" cmd=("$@")
    # perf runs programs, not shell functions.
    [ "$1" != run ] || cmd=(gdb -batch -nx -x "$WORK/$2.gdb" /usr/bin/gzip)
    for ((i = 0; i < REPS; i++)); do
        perf stat -x, -o "$WORK/perf" -e task-clock "${cmd[@]}" >/dev/null 2>&1
        t=$(awk -F, '/task-clock/ {printf "%d", $1 * 1000}' "$WORK/perf")
        if [ -z "$b" ] || [ "$t" -lt "$b" ]; then b=$t; fi
    done
    awk -v b="$b" 'BEGIN {printf "%.4f", b / 1e6}'
}

figures() { # the timer (best or best_cpu), its name
    local c o f b s0 sn r
    c=$($1 run connect)
    o=$($1 run once)
    f=$($1 run forward)
    b=$($1 run backward)
    s0=$($1 run seeks0)
    sn=$($1 run seeksN)
    r=$($1 "$A" regen --format bin --thread 0 "$WORK/t.aet")
    awk -v n="$N" -v k="$K" -v c="$c" -v o="$o" -v f="$f" -v b="$b" -v s0="$s0" -v sn="$sn" -v r="$r" -v what="$2" 'BEGIN {
        fc = (f - s0) / k; rc = (b - sn) / k; first = o - c
        printf "%s: gdb session alone %.3f s\n", what, c
        printf "  a seek and its stop, at the start: %.4f s; at the end: %.4f s (not in the crossings below)\n", (s0 - c) / k, (sn - o) / k
        printf "  continue, first to last:         %.4f s  %7.1f M instructions/s\n", fc, n / fc / 1e6
        printf "  reverse-continue, last to first: %.4f s  %7.1f M instructions/s\n", rc, n / rc / 1e6
        printf "  a session'"'"'s first continue:       %.4f s  %7.1f M instructions/s (builds the snapshots)\n", first, n / first / 1e6
        printf "  regen --format bin (baseline):   %.4f s  %7.1f M instructions/s (whole command)\n", r, n / r / 1e6
        printf "  continue / regen: %.2fx the time\n", fc / r
    }'
}

echo "gzip -c 20 kB: $N instructions"
figures best "wall time"
if command -v perf >/dev/null; then figures best_cpu "CPU time"; fi

# A stop's cost against the history before it (issue 22): gdb with
# aetrace.py (its unwinder reads the frames and their addresses) on
# `aetrace debug --server --at P` at the start, the middle and the end of
# a control-only trace: `bt`, `stepi`, `bt` after connecting (the stop),
# and the same with k more `stepi` and `bt`, whose CPU time less the
# first's, over k, is one further stop's (k large on the large trace, whose
# connection's cost varies by seconds). Connecting regenerates the
# trace to P (the timeline and the procedure stack go forwards); a
# further stop's cost is what must not grow with P.
stop_costs() { # trace, its length, name, repetitions, k
    local where p s one more i k=$5
    for where in start middle end; do
        case $where in
            start) p=1000 ;;
            middle) p=$(($2 / 2)) ;;
            end) p=$(($2 - 1000)) ;;
        esac
        s="set pagination off
set remotetimeout 600
target remote | $(printf '%q' "$A") debug --server --at $p $(printf '%q' "$1")
bt
stepi
bt"
        printf '%s\n' "$s" >"$WORK/stop1.gdb"
        {
            printf '%s\n' "$s"
            for ((i = 0; i < k; i++)); do printf 'stepi\nbt\n'; done
        } >"$WORK/stopk.gdb"
        one=$(REPS=$4 best_cpu gdb -batch -nx -x debug/gdb/aetrace.py -x "$WORK/stop1.gdb" /usr/bin/gzip)
        more=$(REPS=$4 best_cpu gdb -batch -nx -x debug/gdb/aetrace.py -x "$WORK/stopk.gdb" /usr/bin/gzip)
        awk -v n="$3" -v w="$where" -v p="$p" -v one="$one" -v more="$more" -v k="$k" 'BEGIN {
            printf "  %s, %-6s (--at %11d): connect + bt + stepi + bt %7.3f s CPU; a further stepi + bt %7.4f s\n", n, w, p, one, (more - one) / k
        }'
    done
}
if command -v perf >/dev/null; then
    echo "stop costs (CPU time, best of 3; the large trace once):"
    stop_costs "$WORK/t.aet" "$N" "gzip 20 kB" 3 10
    { cat /usr/share/common-licenses/* /etc/services 2>/dev/null; cat /usr/bin/gzip; } >"$WORK/seed"
    while [ "$(stat -c %s "$WORK/seed")" -lt 2000000 ]; do cat "$WORK/seed" "$WORK/seed" >"$WORK/seed2"; mv "$WORK/seed2" "$WORK/seed"; done
    head -c 2000000 "$WORK/seed" >"$WORK/big"
    "$A" record -o "$WORK/big.aet" -- gzip -c "$WORK/big" >/dev/null </dev/null
    NB=$("$A" regen --count --thread 0 "$WORK/big.aet" | awk '/^total:/ {print $2}')
    echo "gzip -c 2 MB: $NB instructions"
    stop_costs "$WORK/big.aet" "$NB" "gzip 2 MB" 1 200
fi
