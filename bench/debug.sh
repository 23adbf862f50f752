#!/usr/bin/env bash
# Speed of `aetrace debug` time travel (issue 22): gdb (`-batch`) connected
# to `aetrace debug --server` on the trace of `gzip -c` of a 20 kB input;
# `continue` from the first instruction runs to the last (no breakpoint),
# `reverse-continue` from the last back to the first. Each is timed as a
# gdb session minus the same session without that command (best of REPS),
# and reported in executed instructions per second (target: 100 M/s) and
# against `aetrace regen --format bin` of the same trace to /dev/null,
# timed in the same run.
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh
REPS=${REPS:-5}
cargo build --release -p aetrace --quiet
A=$(realpath "${CARGO_TARGET_DIR:-target}/x86_64-unknown-linux-gnu/release/aetrace")
WORK=$(mktemp -d /tmp/aetrace-bench.XXXXXX)
trap 'rm -rf "$WORK"' EXIT

{ cat /usr/share/common-licenses/* /etc/services 2>/dev/null; cat /usr/bin/gzip; } | head -c 20000 >"$WORK/in" || true
"$A" record -o "$WORK/t.aet" -- gzip -c "$WORK/in" >/dev/null </dev/null
N=$("$A" regen --count --thread 0 "$WORK/t.aet" | awk '/^total:/ {print $2}')

session() { # name, gdb commands after connecting
    printf 'set remotetimeout 60\ntarget remote | %q debug --server %q\n%s\n' "$A" "$WORK/t.aet" "$2" >"$WORK/$1.gdb"
}
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
run() { gdb -batch -nx -x "$WORK/$1.gdb" /usr/bin/gzip 2>/dev/null; }

t_connect=$(best run connect)
t_once=$(best run once)
t_fwd=$(best run forward)
t_back=$(best run backward)
t_regen=$(best "$A" regen --format bin --thread 0 "$WORK/t.aet")
awk -v n="$N" -v k="$K" -v c="$t_connect" -v o="$t_once" -v f="$t_fwd" -v b="$t_back" -v r="$t_regen" 'BEGIN {
    fc = (f - c) / k; rc = (b - o) / k
    printf "gzip -c 20 kB: %d instructions; gdb session alone %.3f s\n", n, c
    printf "continue, first to last:         %.4f s  %7.1f M instructions/s\n", fc, n / fc / 1e6
    printf "reverse-continue, last to first: %.4f s  %7.1f M instructions/s\n", rc, n / rc / 1e6
    printf "regen --format bin (baseline):   %.4f s  %7.1f M instructions/s (whole command)\n", r, n / r / 1e6
    printf "continue / regen: %.2fx the time\n", fc / r
}'
