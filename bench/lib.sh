# Shared by the bench scripts (sourced from the repository root).

# Best wall time in seconds of REPS runs of "$@" (stdout discarded), read
# from bash's own clock in microseconds: `$(date +%s%N)` around the command
# added the end of one `date` process and the start of another (about 1 ms
# on this machine) to every time, which hid a short run's fixed cost.
best() {
    local i t t0 t1 b=""
    for ((i = 0; i < REPS; i++)); do
        t0=${EPOCHREALTIME/[.,]/}
        "$@" >/dev/null
        t1=${EPOCHREALTIME/[.,]/}
        t=$((t1 - t0))
        if [ -z "$b" ] || [ "$t" -lt "$b" ]; then b=$t; fi
    done
    awk -v b="$b" 'BEGIN {printf "%.4f", b / 1e6}'
}

# Splits a WORKLOADS entry "name|libs|command" into $name, $libs and the
# array cmd; false when ONLY (regular expressions, comma-separated) names
# other workloads.
workload() {
    name=${1%%|*}
    if [ -n "${ONLY:-}" ]; then
        local r re kept=1
        IFS=, read -r -a re <<<"$ONLY"
        for r in "${re[@]}"; do [[ $name =~ $r ]] && kept=0; done
        [ $kept = 0 ] || return 1
    fi
    local rest=${1#*|}
    libs=${rest%%|*}
    read -r -a cmd <<<"${rest#*|}"
}

# Sets AETRACE, the aetrace binary to time: built here unless given (an
# A/B against another tree's build).
aetrace_binary() {
    if [ -z "${AETRACE:-}" ]; then
        cargo build --release -p aetrace --quiet
        AETRACE=$(realpath "${CARGO_TARGET_DIR:-target}/x86_64-unknown-linux-gnu/release/aetrace")
    fi
}
