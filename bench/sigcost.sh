#!/usr/bin/env bash
# Cost per handled signal (docs/runtime.md section 5, "A handler's
# return"): bench/sigcost.c raising N SIGUSR1s (default 100000), native
# against recorded (control, and --data), best of REPS (default 5); per
# signal: (recorded(N) - recorded(0) - (native(N) - native(0))) / N, so a
# recorded run's fixed cost (rewriting, start) is left out. AETRACE=PATH times that aetrace binary (A/B
# against another tree's build, back to back). Run as
# `chrt -f 50 bench/sigcost.sh` (root) on a busy machine.
set -euo pipefail
cd "$(dirname "$0")/.."
N=${N:-100000}
REPS=${REPS:-5}
. bench/lib.sh
aetrace_binary
WORK=$(mktemp -d /tmp/aetrace-sigcost.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
gcc -O2 -no-pie -o "$WORK/sigcost" bench/sigcost.c
best() {
    local b=
    for _ in $(seq "$REPS"); do
        local s e
        s=$(date +%s.%N)
        "$@" >/dev/null
        e=$(date +%s.%N)
        b=$(echo "$e - $s" | bc -l | awk -v b="$b" '{ if (b == "" || $1 < b) print $1; else print b }')
    done
    echo "$b"
}
echo "load average $(cut -d' ' -f1-3 /proc/loadavg), $N signals, best of $REPS"
for mode in native control data; do
    for n in 0 "$N"; do
        case $mode in
            native) t=$(best "$WORK/sigcost" "$n") ;;
            control) t=$(best "$AETRACE" record -o "$WORK/c.aet" -- "$WORK/sigcost" "$n") ;;
            data) t=$(best "$AETRACE" record --data -o "$WORK/d.aet" -- "$WORK/sigcost" "$n") ;;
        esac
        eval "${mode}_$n=$t"
    done
done
per() { echo "($1 - $2 - ($native_N - $native_0)) * 1000000000 / $N" | bc -l | xargs printf '%.0f'; }
native_N=$(eval echo "\$native_$N")
control_N=$(eval echo "\$control_$N")
data_N=$(eval echo "\$data_$N")
printf 'native %.3f s (0 signals: %.3f s); recorded %.3f s (0: %.3f s), +%s ns per signal; --data %.3f s (0: %.3f s), +%s ns per signal\n' \
    "$native_N" "$native_0" "$control_N" "$control_0" "$(per "$control_N" "$control_0")" \
    "$data_N" "$data_0" "$(per "$data_N" "$data_0")"
