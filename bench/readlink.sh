#!/usr/bin/env bash
# Cost of the runtime's exe_path hook per readlink call (docs/runtime.md
# section 5, "/proc/self/exe"): bench/readlink.c reading an ordinary
# symlink N times (default 100000) through libc's readlink (hooked) and
# through syscall(SYS_readlink) (not hooked), native and recorded,
# alternating, REPS rounds (default 5), CPU time (perf stat task-clock of
# the recorder and the program). Per call: the median over rounds of
# (recorded libc - recorded raw - (native libc - native raw)) / N.
# AETRACE=PATH times that aetrace binary (A/B against another build).
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
WORK=$(mktemp -d /tmp/aetrace-readlink.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
gcc -O2 -o "$WORK/readlink" bench/readlink.c
ln -s /usr/share/doc "$WORK/link"
aetrace_binary
N=${N:-100000}
REPS=${REPS:-5}
# CPU milliseconds of a command and its children.
cpu() {
    perf stat -x, -e task-clock "$@" 2>&1 >/dev/null | awk -F, '/task-clock/ { print $1 }'
}
echo "load average $(cut -d' ' -f1-3 /proc/loadavg), $N calls, $REPS rounds"
per=()
for _ in $(seq "$REPS"); do
    nl=$(cpu "$WORK/readlink" "$N" "$WORK/link" libc)
    nr=$(cpu "$WORK/readlink" "$N" "$WORK/link" raw)
    rl=$(cpu "$AETRACE" record -o "$WORK/t.aet" -- "$WORK/readlink" "$N" "$WORK/link" libc)
    rr=$(cpu "$AETRACE" record -o "$WORK/t.aet" -- "$WORK/readlink" "$N" "$WORK/link" raw)
    p=$(echo "($rl - $rr - ($nl - $nr)) * 1000000 / $N" | bc -l)
    printf 'native libc %.1f ms (%.0f ns a call), raw %.1f ms; recorded libc %.1f ms, raw %.1f ms: %+.0f ns per hooked call\n' \
        "$nl" "$(echo "$nl * 1000000 / $N" | bc -l)" "$nr" "$rl" "$rr" "$p"
    per+=("$p")
done
printf '%s\n' "${per[@]}" | sort -g | awk '{ v[NR] = $1 } END { printf "median: %+.0f ns per hooked call\n", v[int((NR + 1) / 2)] }'
