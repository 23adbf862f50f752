#!/usr/bin/env bash
# Issue 21's `bench/run data`: the cost of `aetrace record --data` and the
# size of its values, one command from the repository root:  bench/data.sh
#
# For gzip, bzip2 (+libbz2) and xz (+liblzma) compressing 2 MB of libc's
# bytes and sort on 100k lines, from one run of this script: the native
# time; `aetrace record` (control only) and `aetrace record --data`, each
# as a ratio to native (the rewrite cache warmed first: rewriting is not
# part of a recorded run); the geometric mean of the ratios (target: --data
# at most 2.0x native); then from `aetrace info` of each trace: the data
# references, the share recorded (a VALUE record) against derived
# (recomputed from recorded ones) and static, the raw value bytes, the
# stored witness stream of the data trace and of the control trace, and
# bits per data reference of the whole stored stream (target: 2) and of
# its data part (data trace stored - control trace stored). Then the
# regeneration of the data trace, `aetrace regen --format bin --data -o
# /dev/null` at -j 1 and -j 2 (wall and CPU of the best of REGEN_REPS runs):
# its references (the `bin` records: one per instruction fetch, read and
# write, a read-modify-write two) per wall second and per CPU second,
# against issue 21's target of 200 M per second. The references are
# counted from the bytes of `-o -` (less the 24-byte header, over 8), in a
# run that also compares -j 2's output with -j 1's, byte for byte. With
# data, -j 2 cuts the control walk's stream by the summarised fast pass (no
# state index: `regen --data` reads none) while the data walk stays one
# thread: on 2 cores it costs about twice the control walk's CPU for no
# less wall time, and is printed to show that.
#   REPS=N        best of N wall times for native and control runs (default 3)
#   DATA_REPS=N   best of N for the --data runs (default 1: xz takes ~30 s)
#   LACKEY=1      also time valgrind lackey once per workload (minutes each)
#   ONLY=REGEX    only the workloads whose name matches
#   AETRACE=PATH  this aetrace binary instead of building the worktree's (before/after pairs)
#   REGEN=0       skip the regeneration part (its check reads two
#                 regenerations' output side by side: xz's is the largest)
#   REGEN_REPS=N  best of N wall times for each regeneration (default 1)
# CPU time (user + sys of the run and its children) of the best run is
# printed beside each wall time: on a loaded machine the recorder's work
# shows there, not in wall time. Slow part: `aetrace info` of xz's data
# trace regenerates every reference and holds every value in memory (over
# 3.6 GB and 9 minutes on a loaded machine, 2026-11-29): ONLY= skips it.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
REPS=${REPS:-3}
DATA_REPS=${DATA_REPS:-1}
REGEN=${REGEN:-1}
REGEN_REPS=${REGEN_REPS:-1}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-target}
[ -n "${AETRACE:-}" ] || cargo build --release -q -p aetrace --bin aetrace
AETRACE=${AETRACE:-$(realpath "$CARGO_TARGET_DIR/x86_64-unknown-linux-gnu/release/aetrace")}
WORK=$(mktemp -d /tmp/aetrace-data.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
head -c 2000000 "$(gcc -print-file-name=libc.so.6)" >"$WORK/libc-2m"
python3 -c '
import random, sys
rng = random.Random(7)
open(sys.argv[1], "w").write("".join(f"{rng.randrange(10**9)}\n" for _ in range(100_000)))
' "$WORK/lines-100k"

# name|--libs|command (run from $WORK, output to /dev/null).
WORKLOADS=(
    "gzip|none|/usr/bin/gzip -c libc-2m"
    "bzip2+libbz2|libbz2.so.1.0|/usr/bin/bzip2 -c libc-2m"
    "xz+liblzma|liblzma.so.5|/usr/bin/xz -c libc-2m"
    "sort 100k|none|/usr/bin/sort lines-100k"
)

# The `bin` records `"$AETRACE" regen --format bin --data -o - $1` writes
# (its bytes less the 24-byte header, over 8), after checking that its -j 2
# writes the same bytes (both read side by side; a difference, or a failed
# run, stops the bench).
same_records() {
    python3 - "$AETRACE" "$1" <<'EOF'
import subprocess, sys
aetrace, trace = sys.argv[1:]
runs = [subprocess.Popen([aetrace, "regen", "-j", j, "--format", "bin", "--data", "-o", "-", trace],
                         stdout=subprocess.PIPE) for j in ("1", "2")]
n = 0
while True:
    a, b = (r.stdout.read(1 << 20) for r in runs)
    if a != b:
        sys.exit(f"bench/data.sh: regen --data of {trace}: -j 2's output differs from -j 1's after byte {n}")
    if not a:
        break
    n += len(a)
if any(r.wait() for r in runs) or n < 24 or (n - 24) % 8:
    sys.exit(f"bench/data.sh: regen --data of {trace}: failed or wrote {n} bytes")
print((n - 24) // 8)
EOF
}

# "wall cpu" in seconds of the run with the least wall time of N runs of
# "$@" (stdout discarded); cpu is user + sys of the run and its children.
timed() {
    local n=$1 i b="" out
    shift
    for ((i = 0; i < n; i++)); do
        /usr/bin/time -f '%e %U %S' -o "$WORK/time" "$@" >/dev/null
        out=$(awk '{printf "%s %.2f", $1, $2 + $3}' "$WORK/time")
        if [ -z "$b" ] || awk -v a="${out%% *}" -v b="${b%% *}" 'BEGIN {exit !(a < b)}'; then
            b=$out
        fi
    done
    echo "$b"
}

cd "$WORK"
echo "machine: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg), $(date -u '+%Y-%m-%d %H:%M UTC')"
: >results
for w in "${WORKLOADS[@]}"; do
    workload "$w" || continue
    "$AETRACE" record --libs "$libs" -o warm.aet -- "${cmd[@]}" >/dev/null
    "$AETRACE" record --libs "$libs" --data -o warm.aet -- "${cmd[@]}" >/dev/null
    native=$(timed "$REPS" "${cmd[@]}")
    control=$(timed "$REPS" "$AETRACE" record --libs "$libs" -o control.aet -- "${cmd[@]}")
    data=$(timed "$DATA_REPS" "$AETRACE" record --libs "$libs" --data -o data.aet -- "${cmd[@]}")
    lackey="nan nan"
    if [ "${LACKEY:-0}" = 1 ]; then
        lackey=$(timed 1 valgrind -q --tool=lackey --trace-mem=yes --vex-guest-chase=no \
            --log-file=/dev/null "${cmd[@]}")
    fi
    regen="nan nan nan nan nan"
    if [ "$REGEN" = 1 ]; then
        regen="$(same_records data.aet) \
$(timed "$REGEN_REPS" "$AETRACE" regen -j 1 --format bin --data -o /dev/null data.aet) \
$(timed "$REGEN_REPS" "$AETRACE" regen -j 2 --format bin --data -o /dev/null data.aet)"
    fi
    "$AETRACE" info control.aet >control.info
    "$AETRACE" info data.aet >data.info
    python3 - "$name" $native $control $data $lackey $regen <<'EOF' >>results
import re, sys
name, *t = sys.argv[1:]
t, regen = t[:8], t[8:]
def grab(f, pat):
    m = re.search(pat, open(f).read())
    if not m:
        sys.exit(f"bench/data.sh: {f}: no match for {pat!r}")
    return [int(g) for g in m.groups()]
stream = r"witness streams: \d+ chunks, (\d+) raw bytes, (\d+) stored bytes"
_, c_stored = grab("control.info", stream)
raw, stored = grab("data.info", stream)
values, value_bytes = grab("data.info", r"data values: (\d+) \((\d+) bytes")
refs, static, derived, recorded = grab(
    "data.info", r"data references: (\d+) \((\d+) static [\d.]+%, (\d+) derived [\d.]+%, (\d+) recorded")
print("\t".join([name, *t] + [str(x) for x in
      (refs, static, derived, recorded, values, value_bytes, raw, stored, c_stored)] + regen))
EOF
done

python3 - results <<'EOF'
import math, sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1])]
print()
print("Times: wall seconds (best run) / CPU seconds of that run; ratios wall / native wall, then CPU / native CPU")
print(f"{'workload':14} {'native':>12} {'record':>12} {'x':>6} {'xcpu':>6} {'--data':>13} {'x':>6} {'xcpu':>6} {'lackey':>13} {'x':>6}")
ctl, dat, ctlc, datc = [], [], [], []
for r in rows:
    name = r[0]
    nw, nc, cw, cc, dw, dc, lw, lc = map(float, r[1:9])
    ctl.append(cw / nw); dat.append(dw / nw); ctlc.append(cc / nc); datc.append(dc / nc)
    print(f"{name:14} {nw:6.2f}/{nc:5.2f} {cw:6.2f}/{cc:5.2f} {cw/nw:6.2f} {cc/nc:6.2f} {dw:7.2f}/{dc:5.2f} {dw/nw:6.2f} {dc/nc:6.2f} "
          f"{lw:7.2f}/{lc:5.2f} {lw/nw:6.1f}")
g = lambda xs: math.exp(sum(map(math.log, xs)) / len(xs))
print(f"geometric mean: record {g(ctl):.2f}x, record --data {g(dat):.2f}x native wall (target for --data: <= 2.0x); "
      f"CPU {g(ctlc):.2f}x, {g(datc):.2f}x")
print()
print("Data references (aetrace info of the --data trace); stored = the witness stream as written (zstd+values);")
print("data part = data trace stored - control trace stored; bits per reference over all data references")
print(f"{'workload':14} {'references':>11} {'static':>7} {'derived':>8} {'recorded':>9} {'values':>10} "
      f"{'value B raw':>12} {'stream raw':>11} {'stored':>10} {'ctl stored':>10} {'bits/ref':>8} {'data b/ref':>10}")
bits = []
for r in rows:
    name = r[0]
    refs, static, derived, recorded, values, vbytes, raw, stored, cstored = map(int, r[9:18])
    pct = lambda x: f"{100 * x / refs:6.1f}%" if refs else "    nan"
    b = stored * 8 / refs if refs else float("nan")
    bits.append(b)
    print(f"{name:14} {refs:11d} {pct(static):>7} {pct(derived):>8} {pct(recorded):>9} {values:10d} "
          f"{vbytes:12d} {raw:11d} {stored:10d} {cstored:10d} {b:8.2f} {(stored - cstored) * 8 / refs if refs else float('nan'):10.2f}")
print(f"bits per data reference, whole stored stream: max {max(bits):.2f} (target <= 2)")
print("\nRegeneration of the --data trace, regen --format bin --data -o /dev/null: references = its bin records\n"
      "(fetches, reads, writes; -j 2's bytes checked equal to -j 1's), M references per wall second and per CPU second")
# Per -j: wall, CPU, M references per wall second and per CPU second.
per_j = lambda j: [f"{f'j{j} wall':>8}", f"{f'j{j} CPU':>7}", f"{'M/s':>6}", f"{'M/CPU s':>8}"]
print(" ".join([f"{'workload':14}", f"{'references':>11}"] + per_j(1) + per_j(2)))
speeds = []
for r in (r for r in rows if r[18] != "nan"):
    records = int(r[18])
    cols = [f"{r[0]:14}", f"{records:11d}"]
    for wall, cpu in ((float(r[19]), float(r[20])), (float(r[21]), float(r[22]))):
        cols += [f"{wall:8.2f}", f"{cpu:7.2f}", f"{records / wall / 1e6:6.0f}", f"{records / cpu / 1e6:8.0f}"]
        speeds.append((r[0], records / wall / 1e6))
    print(" ".join(cols))
speeds = [max(s for n, s in speeds if n == w) for w in dict(speeds)]
if speeds:
    print(f"regeneration with data, the slowest workload at its faster -j: {min(speeds):.0f} M references "
          f"per second (target: at least 200 M per second to /dev/null)")
EOF
