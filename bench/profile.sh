#!/usr/bin/env bash
# Edge-profiling cost (issue 8; paper 003 Section 3, Tables 1 and 2) on the
# machine's Debian binaries, all from one run of this script:
#   native         the program alone
#   slow           `aetrace profile --placement every-block` (a counter per block, pixie)
#   quick          `aetrace profile` (counters on the chords of a maximum
#                  spanning tree, heuristic weights)
#   feedback       `aetrace profile --weights PROFILE` (weights: the counts of
#                  the quick run)
#   paths          `aetrace paths` (Ball-Larus path profiling, paper 001:
#                  increments are path counter increments, plus the edge
#                  counters of procedures with too many paths)
# Times are the program's run under each (the profile's `run_seconds`:
# spawn to end, the rewrite excluded), best of REPS; increments are the sum
# of the counters of that run. Prints each overhead and the paper's ratios:
# slow/quick and slow/feedback increments (the paper: 1.1-4.2x fewer) and
# overheads (the paper: 11-424% down to 9-105%), and path profiling's
# overhead and increments beside them (paper 001: path profiling cost about
# twice edge profiling, 31% against 16% on SPEC95).
#
# Usage (from the repository root):  bench/profile.sh       REPS=N (default 3)
# bzip2 and xz do most of their work in libbz2 / liblzma: their rows with
# `+lib` profile the library too (`--libs`), the others the executable only.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh

REPS=${REPS:-3}
cargo build --release -p aetrace --quiet
AETRACE=$(realpath "${CARGO_TARGET_DIR:-target}/x86_64-unknown-linux-gnu/release/aetrace")
WORK=$(mktemp -d /tmp/aetrace-bench.XXXXXX)
trap 'rm -rf "$WORK"' EXIT

python3 - "$WORK" <<'PY'
import random, sys
work = sys.argv[1]
words = "the trace witness edge block procedure regenerate abstract execution of a program cache".split()
rng = random.Random(7)
out, size = [], 0
while size < 2_000_000:
    w = rng.choice(words) + rng.choice([" ", " ", " ", "\n"])
    out.append(w); size += len(w)
open(f"{work}/text-2m", "w").write("".join(out)[:2_000_000])
open(f"{work}/lines-100k", "w").write("".join(f"{rng.randrange(10**9)}\n" for _ in range(100_000)))
PY

# name|--libs of the profiles|command.
WORKLOADS=(
    "gzip 2MB|none|/usr/bin/gzip -c text-2m"
    "gzip -d 2MB|none|/usr/bin/gzip -dc text-2m.gz"
    "bzip2 2MB|none|/usr/bin/bzip2 -c text-2m"
    "bzip2 2MB +libbz2|libbz2.so.1.0|/usr/bin/bzip2 -c text-2m"
    "xz 2MB|none|/usr/bin/xz -c text-2m"
    "xz 2MB +liblzma|liblzma.so.5|/usr/bin/xz -c text-2m"
    "sort 100k lines|none|/usr/bin/sort lines-100k"
)

cd "$WORK"
gzip -c text-2m >text-2m.gz
# Best run_seconds and the increments of REPS profiled runs: "seconds increments".
profiled() {
    local out=$1 i
    shift
    for ((i = 0; i < REPS; i++)); do
        "$AETRACE" profile -o "$out.$i" "$@" >/dev/null
    done
    python3 - "$out" "$REPS" <<'PY'
import json, sys
runs = [json.load(open(f"{sys.argv[1]}.{i}")) for i in range(int(sys.argv[2]))]
assert len({r["increments"] for r in runs}) == 1, "increments differ between runs"
print(f'{min(r["run_seconds"] for r in runs):.4f} {runs[0]["increments"]}')
PY
    cp "$out.0" "$out"
}
# The same for `aetrace paths` (its arguments: the profile, --libs, the
# command): "seconds increments", or "- -" when the program is refused
# (the reason goes to stderr).
paths() {
    local out=$1 libs=$2 i
    shift 2
    for ((i = 0; i < REPS; i++)); do
        if ! "$AETRACE" paths -o "$out.$i" --report /dev/null --libs "$libs" -- "$@" >/dev/null 2>"$out.err"; then
            sed 's/^/  paths refused: /' "$out.err" >&2
            echo "- -"
            return
        fi
    done
    python3 - "$out" "$REPS" <<'PY'
import json, sys
runs = [json.load(open(f"{sys.argv[1]}.{i}")) for i in range(int(sys.argv[2]))]
incs = {r["path_increments"] + r["edge_increments"] for r in runs}
assert len(incs) == 1, "increments differ between runs"
print(f'{min(r["run_seconds"] for r in runs):.4f} {incs.pop()}')
PY
}

RESULTS="$WORK/results.tsv"
: >"$RESULTS"
echo "machine: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"
for w in "${WORKLOADS[@]}"; do
    workload "$w" || continue
    n=$(best "${cmd[@]}")
    read -r s si <<<"$(profiled slow.aprof --libs "$libs" --placement every-block -- "${cmd[@]}")"
    read -r q qi <<<"$(profiled quick.aprof --libs "$libs" -- "${cmd[@]}")"
    read -r f fi <<<"$(profiled feedback.aprof --libs "$libs" --weights quick.aprof -- "${cmd[@]}")"
    read -r p pi <<<"$(paths run.apath "$libs" "${cmd[@]}")"
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$name" "$n" "$s" "$si" "$q" "$qi" "$f" "$fi" "$p" "$pi" >>"$RESULTS"
done

python3 - "$RESULTS" <<'PY'
import sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1])]
print()
print("Edge profiling (paper 003, Tables 1-2): seconds (best run), overhead over native, counter increments")
print(f"{'workload':18} {'native':>7} {'slow':>7} {'ovh':>6} {'quick':>7} {'ovh':>6} {'feedbk':>7} {'ovh':>6} "
      f"{'slow incs':>11} {'quick incs':>11} {'fb incs':>11} {'s/q':>5} {'s/f':>5}")
for r in rows:
    name = r[0]
    n, s, q, f = float(r[1]), float(r[2]), float(r[4]), float(r[6])
    si, qi, fi = int(r[3]), int(r[5]), int(r[7])
    o = lambda t: f"{100 * (t / n - 1):5.0f}%"
    ratio = lambda a, b: f"{a / b:5.2f}" if b else "  inf"
    print(f"{name:18} {n:7.4f} {s:7.4f} {o(s)} {q:7.4f} {o(q)} {f:7.4f} {o(f)} "
          f"{si:11d} {qi:11d} {fi:11d} {ratio(si, qi)} {ratio(si, fi)}")
print("s/q, s/f: every-block increments over quick (heuristic) and feedback placements (paper: 1.1-4.2x)")
print()
print("Path profiling (paper 001): seconds (best run), overhead over native, counter increments; beside quick")
print(f"{'workload':18} {'native':>7} {'quick':>7} {'ovh':>6} {'paths':>7} {'ovh':>6} {'quick incs':>11} {'path incs':>11} {'p/q ovh':>8}")
for r in rows:
    name, n, q, qi = r[0], float(r[1]), float(r[4]), int(r[5])
    if r[8] == "-":
        print(f"{name:18} {n:7.4f} {q:7.4f} {100 * (q / n - 1):5.0f}%  refused")
        continue
    p, pi = float(r[8]), int(r[9])
    oq, op = q / n - 1, p / n - 1
    rel = f"{op / oq:8.2f}" if oq > 0 else "       -"
    print(f"{name:18} {n:7.4f} {q:7.4f} {100 * oq:5.0f}% {p:7.4f} {100 * op:5.0f}% {qi:11d} {pi:11d} {rel}")
print("p/q ovh: path profiling's overhead over quick edge profiling's (paper 001: about 2x)")
PY
