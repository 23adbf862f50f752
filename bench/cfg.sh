#!/usr/bin/env bash
# Speed of CFG recovery (issue 2): `aetrace cfg` on libc.so.6 must take less
# time than `objdump -d` on the same file, both measured here, in the same run.
#
# Usage (from the repository root):  bench/cfg.sh [FILE...]
#   FILE defaults to the machine's libc.so.6; REPS=N sets the repetitions (5).
# Builds the release binary, times each command REPS times with output to
# /dev/null, prints the best and median wall times and the ratio
# aetrace/objdump (best against best). Exits 1 if aetrace is not faster.
set -euo pipefail
cd "$(dirname "$0")/.."

REPS=${REPS:-5}
FILES=("$@")
[ ${#FILES[@]} -gt 0 ] || FILES=(/lib/x86_64-linux-gnu/libc.so.6)

cargo build --release -p aetrace --quiet
TARGET_DIR=${CARGO_TARGET_DIR:-target}
AETRACE=$TARGET_DIR/x86_64-unknown-linux-gnu/release/aetrace
[ -x "$AETRACE" ] || { echo "bench/cfg.sh: no $AETRACE" >&2; exit 1; }

# Wall time of one run of "$@" in nanoseconds (output discarded; failure aborts).
once() {
    local t0 t1
    t0=$(date +%s%N)
    "$@" >/dev/null
    t1=$(date +%s%N)
    echo $((t1 - t0))
}

# "best median" of REPS runs of "$@", after one untimed warm-up run (page cache).
measure() {
    "$@" >/dev/null
    local i times=()
    for ((i = 0; i < REPS; i++)); do times+=("$(once "$@")"); done
    printf '%s\n' "${times[@]}" | sort -n | awk '{a[NR]=$1} END {printf "%.4f %.4f\n", a[1] / 1e9, a[int((NR+1)/2)] / 1e9}'
}

status=0
printf '%-40s %-22s %10s %10s\n' file command best_s median_s
for f in "${FILES[@]}"; do
    read -r od_best od_med < <(measure objdump -d "$f")
    read -r ae_best ae_med < <(measure "$AETRACE" cfg "$f")
    read -r aj_best aj_med < <(measure "$AETRACE" cfg "$f" --json)
    printf '%-40s %-22s %10s %10s\n' "$f" "objdump -d" "$od_best" "$od_med"
    printf '%-40s %-22s %10s %10s\n' "$f" "aetrace cfg" "$ae_best" "$ae_med"
    printf '%-40s %-22s %10s %10s\n' "$f" "aetrace cfg --json" "$aj_best" "$aj_med"
    ratio=$(awk -v a="$ae_best" -v o="$od_best" 'BEGIN {printf "%.3f", a / o}')
    ratio_json=$(awk -v a="$aj_best" -v o="$od_best" 'BEGIN {printf "%.3f", a / o}')
    if awk -v a="$ae_best" -v o="$od_best" 'BEGIN {exit !(a < o)}'; then verdict=PASS; else verdict=FAIL; status=1; fi
    echo "$f: aetrace cfg / objdump -d = $ratio (--json: $ratio_json), target < 1: $verdict"
done
exit $status
