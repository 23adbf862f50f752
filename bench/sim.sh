#!/usr/bin/env bash
# Issue 24: trace to cache statistics against cachegrind, one command from
# the repository root:  bench/sim.sh   (REPS=N: best of N, default 3)
#
# For gzip, bzip2 (+libbz2) and xz (+liblzma) compressing 2 MB of libc's
# bytes and sort on 100k lines, from one run of this script: the native
# time; `valgrind --tool=cachegrind --cache-sim=yes` (instructions and data)
# with I1/D1 32k 8-way, LL 1m 16-way, 64-byte lines; `aetrace record` (the
# rewrite cache warmed first); `aetrace cachesim --model cachegrind TRACE`
# (regenerated and simulated in one process, instructions only) with the
# same geometry; record + simulate against cachegrind (> 1: faster), in
# wall time and in CPU time (user + sys, one run each: the honest figure on
# a loaded machine, where two threads wait more than one); and
# our I refs beside cachegrind's (cachegrind counts every instruction of
# the process, we count the traced modules). Then ten geometries: ten
# cachegrind runs (one each) against one recording and one
# `aetrace cachesim --configs` pass simulating all ten (the recording's
# time is the table's best). Then cachesim's own speed on
# `bin` input: 20M references of a synthetic program-like stream
# (cachesim/examples/gentrace.rs) from a file in /dev/shm, in M references
# per second of wall time and of CPU time (user + sys).
#
# The fair pair against cachegrind, which simulates data too, is printed
# after the control-only one: `aetrace record --data` and `aetrace cachesim
# --model cachegrind TRACE` of that data trace (instructions and data
# references, regenerated and simulated in one process), their sum against
# cachegrind's time from the same run, and the statistics the two print
# side by side (I refs, I1/LLi misses, D refs, D1/LLd misses: cachegrind's
# cover the whole process, ours the traced modules, so they are equal only
# where every executed instruction is traced, as tests/data_trace.rs checks).
# AETRACE=PATH times another build. ONLY=gzip,sort runs only the workloads whose names start with those words;
# PARTS=data,ten runs only those parts (control, data, ten, bin; default all).
# The data pair times each command REPS times and takes the best wall and the
# least CPU time (user + sys) of those runs, and its statistics from the last
# run of each (no extra run for them).
set -euo pipefail
cd "$(dirname "$0")/.."
REPS=${REPS:-3}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-target}
cargo build --release -q -p aetrace --bin aetrace --bin cachesim
cargo build --release -q -p aetrace-cachesim --example gentrace
BIN=$(realpath "$CARGO_TARGET_DIR/x86_64-unknown-linux-gnu/release")
AETRACE=${AETRACE:-$BIN/aetrace}
. bench/lib.sh
WORK=$(mktemp -d /dev/shm/aetrace-sim.XXXXXX 2>/dev/null || mktemp -d)
trap 'rm -rf "$WORK"' EXIT
cd "$WORK"
LIBC=$(ldd /usr/bin/gzip | awk '/libc.so/ { print $3 }')
head -c 2000000 "$LIBC" >libc-2m
python3 -c 'import random; r = random.Random(7); open("lines-100k", "w").write("".join(f"{r.randrange(10**9)}\n" for _ in range(100_000)))'

# CPU seconds (user + sys, all threads) of one run of "$@".
cpu() {
    local line
    line=$( { TIMEFORMAT='%U %S'; time "$@" >/dev/null 2>&1; } 2>&1 | tail -1)
    awk -v l="$line" 'BEGIN { split(l, f, " "); printf "%.3f", f[1] + f[2] }'
}

CG=(--I1=32768,8,64 --D1=32768,8,64 --LL=1048576,16,64)
GEOM=(-l1-isize 32k -l1-ibsize 64 -l1-iassoc 8 -l1-dsize 32k -l1-dbsize 64 -l1-dassoc 8
      -l2-usize 1m -l2-ubsize 64 -l2-uassoc 16)
WORKLOADS=(
    "gzip 2MB|none|/usr/bin/gzip -c libc-2m"
    "bzip2 2MB|libbz2.so.1.0|/usr/bin/bzip2 -c libc-2m"
    "xz 2MB|liblzma.so.5|/usr/bin/xz -c libc-2m"
    "sort 100k lines|none|/usr/bin/sort lines-100k"
)
if [ -n "${ONLY:-}" ]; then
    kept=()
    for w in "${WORKLOADS[@]}"; do
        [[ ",$ONLY," == *",${w%% *},"* ]] && kept+=("$w")
    done
    WORKLOADS=("${kept[@]}")
fi
PARTS=${PARTS:-control,data,ten,bin}
part() { [[ ",$PARTS," == *",$1,"* ]]; }
echo "machine: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"
if part control; then
printf '%-16s %8s %10s %8s %9s %8s %8s %12s %13s %13s\n' workload native cachegrind record cachesim "rec+sim" "vs cg" "CPU vs cg" "cg I refs" "our I refs"
for w in "${WORKLOADS[@]}"; do
    workload "$w" || continue
    native=$(best "${cmd[@]}")
    cg=$(best valgrind -q --log-file=/dev/null --tool=cachegrind --cache-sim=yes --cachegrind-out-file=/dev/null "${CG[@]}" "${cmd[@]}")
    cg_cpu=$(cpu valgrind -q --log-file=/dev/null --tool=cachegrind --cache-sim=yes --cachegrind-out-file=/dev/null "${CG[@]}" "${cmd[@]}")
    cg_irefs=$(valgrind --tool=cachegrind --cache-sim=yes --cachegrind-out-file=/dev/null "${CG[@]}" "${cmd[@]}" 2>&1 >/dev/null \
        | awk '/I *refs:/ { gsub(",", "", $4); print $4 }')
    "$AETRACE" record --libs "$libs" -o t.aet -- "${cmd[@]}" >/dev/null
    rec=$(best "$AETRACE" record --libs "$libs" -o t.aet -- "${cmd[@]}")
    sim=$(best "$AETRACE" cachesim --model cachegrind "${GEOM[@]}" t.aet)
    rec_cpu=$(cpu "$AETRACE" record --libs "$libs" -o t.aet -- "${cmd[@]}")
    sim_cpu=$(cpu "$AETRACE" cachesim --model cachegrind "${GEOM[@]}" t.aet)
    ours=$("$AETRACE" cachesim --model cachegrind --json "${GEOM[@]}" t.aet \
        | python3 -c 'import json, sys; print(json.load(sys.stdin)["stats"]["i_refs"])')
    awk -v n="$name" -v a="$native" -v c="$cg" -v r="$rec" -v s="$sim" -v ci="$cg_irefs" -v oi="$ours" \
        -v cc="$cg_cpu" -v rc="$rec_cpu" -v sc="$sim_cpu" 'BEGIN {
        printf "%-16s %8.3f %10.3f %8.3f %9.3f %8.3f %7.2fx %11.2fx %13.0f %13.0f\n", n, a, c, r, s, r + s, c / (r + s), cc / (rc + sc), ci, oi }'
done
fi

# Best wall time and least CPU time (user + sys, all threads) of REPS runs
# of "$@", as "WALL CPU"; the last run's stdout in $OUT, its stderr in $ERR.
timed() {
    local i line w u s c bw="" bc=""
    for ((i = 0; i < REPS; i++)); do
        line=$( { TIMEFORMAT='%R %U %S'; time "$@" >"$OUT" 2>"$ERR"; } 2>&1 | tail -1)
        read -r w u s <<<"$line"
        c=$(awk -v u="$u" -v s="$s" 'BEGIN { print u + s }')
        if [ -z "$bw" ] || awk -v a="$w" -v b="$bw" 'BEGIN { exit !(a < b) }'; then bw=$w; fi
        if [ -z "$bc" ] || awk -v a="$c" -v b="$bc" 'BEGIN { exit !(a < b) }'; then bc=$c; fi
    done
    echo "$bw $bc"
}

# cachegrind's summary (its stderr, in file $1) as "I1 LLi D-refs D1 LLd"
# totals (thousands separators removed).
cg_stats() {
    awk '{ gsub(",", "") } /I1 +misses:/ { i1 = $4 } /LLi +misses:/ { lli = $4 }
         /D +refs:/ { d = $4 } /D1 +misses:/ { d1 = $4 } /LLd +misses:/ { lld = $4 }
         END { print i1, lli, d, d1, lld }' "$1"
}

# The same from `aetrace cachesim --model cachegrind --json`'s output (file $1).
our_stats() {
    python3 -c 'import json, sys
s = json.load(open(sys.argv[1]))["stats"]
print(s["i1_misses"], s["lli_misses"], s["d_reads"] + s["d_writes"],
      s["d1_read_misses"] + s["d1_write_misses"], s["lld_read_misses"] + s["lld_write_misses"])' "$1"
}

if part data; then
echo
echo "record --data + cachesim of the data trace (instructions and data) against cachegrind"
printf '%-16s %10s %12s %9s %8s %8s %11s\n' workload cachegrind "record --data" cachesim "rec+sim" "vs cg" "CPU vs cg"
stats=()
for w in "${WORKLOADS[@]}"; do
    workload "$w" || continue
    read -r cg cg_cpu < <(OUT=/dev/null ERR=cg.err timed valgrind --tool=cachegrind --cache-sim=yes --cachegrind-out-file=/dev/null "${CG[@]}" "${cmd[@]}")
    "$AETRACE" record --data --libs "$libs" -o d.aet -- "${cmd[@]}" >/dev/null
    read -r rec rec_cpu < <(OUT=/dev/null ERR=/dev/null timed "$AETRACE" record --data --libs "$libs" -o d.aet -- "${cmd[@]}")
    read -r sim sim_cpu < <(OUT=d.json ERR=/dev/null timed "$AETRACE" cachesim --model cachegrind --json "${GEOM[@]}" d.aet)
    awk -v n="$name" -v c="$cg" -v r="$rec" -v s="$sim" -v cc="$cg_cpu" -v rc="$rec_cpu" -v sc="$sim_cpu" 'BEGIN {
        printf "%-16s %10.3f %12.3f %9.3f %8.3f %7.2fx %10.2fx\n", n, c, r, s, r + s, c / (r + s), cc / (rc + sc) }'
    stats+=("$name|$(cg_stats cg.err)|$(our_stats d.json)")
    rm -f d.aet d.json cg.err
done
echo
echo "their statistics (cachegrind: the whole process; aetrace: the traced modules)"
printf '%-16s %-10s %12s %12s %14s %12s %12s\n' workload "" "I1 misses" "LLi misses" "D refs" "D1 misses" "LLd misses"
for s in "${stats[@]}"; do
    IFS='|' read -r name c o <<<"$s"
    read -r -a cs <<<"$c"
    read -r -a os <<<"$o"
    printf '%-16s %-10s %12s %12s %14s %12s %12s\n' "$name" cachegrind "${cs[@]}"
    printf '%-16s %-10s %12s %12s %14s %12s %12s\n' "" aetrace "${os[@]}"
done
fi

if part ten; then
# Ten geometries (I1, D1, LL as cachegrind's size,assoc,line): line sizes
# of 32, 64 and 128 bytes, direct-mapped to 16-way, 4 kB to 8 MB.
TEN=(
    "32768,8,64 32768,8,64 1048576,16,64"
    "16384,4,64 32768,8,64 524288,8,64"
    "65536,8,64 32768,8,64 2097152,16,64"
    "8192,2,64 32768,8,64 262144,8,64"
    "32768,4,64 32768,8,64 4194304,16,64"
    "32768,2,32 32768,8,32 1048576,8,32"
    "16384,8,64 32768,8,64 8388608,16,64"
    "4096,1,64 32768,8,64 131072,4,64"
    "131072,8,64 32768,8,64 1048576,16,64"
    "32768,16,128 32768,8,128 2097152,8,128"
)
for g in "${TEN[@]}"; do
    read -r i d l <<<"$g"
    line=""
    for c in "l1-i $i" "l1-d $d" "l2-u $l"; do
        IFS=, read -r size assoc bsize <<<"${c#* }"
        line+="-${c%% *}size $size -${c%% *}assoc $assoc -${c%% *}bsize $bsize "
    done
    echo "$line"
done >ten.configs
echo
echo "ten geometries: ten cachegrind runs against one recording and one aetrace cachesim --configs pass"
printf '%-16s %12s %9s %12s %8s %11s\n' workload "10x cg" "record" "configs sim" "vs cg" "CPU vs cg"
for w in "${WORKLOADS[@]}"; do
    workload "$w" || continue
    cg=0 cg_cpu=0
    for g in "${TEN[@]}"; do
        read -r i d l <<<"$g"
        one=(valgrind -q --log-file=/dev/null --tool=cachegrind --cache-sim=yes --cachegrind-out-file=/dev/null
             --I1="$i" --D1="$d" --LL="$l" "${cmd[@]}")
        cg=$(awk -v a="$cg" -v b="$(REPS=1 best "${one[@]}")" 'BEGIN { print a + b }')
        cg_cpu=$(awk -v a="$cg_cpu" -v b="$(cpu "${one[@]}")" 'BEGIN { print a + b }')
    done
    "$AETRACE" record --libs "$libs" -o t.aet -- "${cmd[@]}" >/dev/null
    rec=$(best "$AETRACE" record --libs "$libs" -o t.aet -- "${cmd[@]}")
    rec_cpu=$(cpu "$AETRACE" record --libs "$libs" -o t.aet -- "${cmd[@]}")
    sim=$(best "$AETRACE" cachesim --model cachegrind --configs ten.configs t.aet)
    sim_cpu=$(cpu "$AETRACE" cachesim --model cachegrind --configs ten.configs t.aet)
    awk -v n="$name" -v c="$cg" -v r="$rec" -v s="$sim" -v cc="$cg_cpu" -v rc="$rec_cpu" -v sc="$sim_cpu" 'BEGIN {
        printf "%-16s %12.3f %9.3f %12.3f %7.2fx %10.2fx\n", n, c, r, s, c / (r + s), cc / (rc + sc) }'
done

fi

if part bin; then
echo
"$BIN/examples/gentrace" 20000000 t >/dev/null
rm -f t.din t.xdin
line=$( { TIMEFORMAT='%R %U %S'; time "$BIN/cachesim" "${GEOM[@]}" t.bin >/dev/null; } 2>&1 | tail -1)
best_line=$line
for ((i = 1; i < REPS; i++)); do
    line=$( { TIMEFORMAT='%R %U %S'; time "$BIN/cachesim" "${GEOM[@]}" t.bin >/dev/null; } 2>&1 | tail -1)
    if awk -v a="${line%% *}" -v b="${best_line%% *}" 'BEGIN { exit !(a < b) }'; then best_line=$line; fi
done
awk -v l="$best_line" 'BEGIN { split(l, f, " "); printf "cachesim bin input (20M refs, /dev/shm, best of runs): %.1f Mrefs/s wall, %.1f Mrefs per CPU-s (target 150)\n", 20 / f[1], 20 / (f[2] + f[3]) }'
fi
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
