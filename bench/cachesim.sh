#!/usr/bin/env bash
# cachesim throughput, one command from the repository root:
#
#   bench/cachesim.sh            (N=20000000 SWEEP_N=2000000 PY_N=5000000)
#   DINERO=/path/to/dineroIV bench/cachesim.sh   (also times Dinero IV)
#   BASELINE=/path/to/old/cachesim bench/cachesim.sh   (also times an older
#       build on every input, run by run beside the new one)
#
# 1. references per second for extended din, traditional din and the binary
#    format (from a file and from a pipe), L1I 32k/8 + L1D 32k/8 + unified
#    L2 1m/16, 64-byte blocks, on a deterministic synthetic program-like
#    stream (cachesim/examples/gentrace.rs);
# 2. pycachesim's C backend on the same references, from memory (the figure
#    the issue compares against), when `import cachesim` works;
# 3. when DINERO names a Dinero IV binary (built with 64-bit addresses:
#    SIZEOF_VOIDP 8 in its config.h), Dinero on the same din and extended din
#    files, checking that its statistics equal ours byte for byte;
# 4. the one-pass sweep (--sweep 4k..8m --assoc 1,2,4,8,full) against running
#    its 60 configurations one by one, checking that every miss count agrees.
#
# Times are wall-clock, best of 3, with the CPU time (user + sys, all
# threads) of that run beside them; the machine's load average is printed
# because other work on a 2-core machine changes the wall times.
set -euo pipefail
cd "$(dirname "$0")/.."

N=${N:-20000000}
SWEEP_N=${SWEEP_N:-2000000}
PY_N=${PY_N:-5000000}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-target}

cargo build --release -q -p aetrace --bin cachesim
cargo build --release -q -p aetrace-cachesim --example gentrace
SIM=$CARGO_TARGET_DIR/x86_64-unknown-linux-gnu/release/cachesim
GEN=$CARGO_TARGET_DIR/x86_64-unknown-linux-gnu/release/examples/gentrace
DIR=$(mktemp -d)
trap 'rm -rf "$DIR"' EXIT

"$GEN" "$N" "$DIR/t"
GEOM=(-l1-isize 32k -l1-ibsize 64 -l1-iassoc 8 -l1-dsize 32k -l1-dbsize 64 -l1-dassoc 8
      -l2-usize 1m -l2-ubsize 64 -l2-uassoc 16)

now() { date +%s%N; }
# best_of3 CMD...: prints "wall cpu" seconds (cpu = user + sys of all
# threads) of the run with the best wall time.
best_of3() {
    local best="" line wall
    for _ in 1 2 3; do
        line=$( { TIMEFORMAT='%R %U %S'; time "$@" >/dev/null; } 2>&1 | tail -1)
        wall=${line%% *}
        if [[ -z $best ]] || awk -v a="$wall" -v b="${best%% *}" 'BEGIN { exit !(a < b) }'; then
            best=$(awk -v l="$line" 'BEGIN { split(l, f, " "); printf "%s %.3f", f[1], f[2] + f[3] }')
        fi
    done
    echo "$best"
}
rate() { awk -v n="$1" -v t="$2" 'BEGIN { printf "%.1f", n / t / 1e6 }'; }

echo "machine: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo "trace:   $N references (xdin $(($(stat -c %s "$DIR/t.xdin") >> 20)) MiB," \
     "din $(($(stat -c %s "$DIR/t.din") >> 20)) MiB, bin $(($(stat -c %s "$DIR/t.bin") >> 20)) MiB)"
"$SIM" "${GEOM[@]}" "$DIR/t.bin" | awk '/^l[0-9]-/ { name = $1 } /Demand miss rate/ { printf "         %s demand miss rate %s\n", name, $4 }'
echo
printf "%-20s %8s %9s %8s %14s\n" "input" "wall s" "Mrefs/s" "CPU s" "Mrefs/CPU-s"
if [[ -n ${BASELINE:-} ]]; then
    [[ -x $BASELINE ]] || { echo "BASELINE=$BASELINE is not an executable"; exit 1; }
    cmp -s <("$SIM" "${GEOM[@]}" "$DIR/t.bin") <("$BASELINE" "${GEOM[@]}" "$DIR/t.bin") \
        || { echo "BASELINE statistics DIFFER from this build's"; exit 1; }
fi
run_pipe() { cat "$1" | "$SIM_RUN" "${@:2}"; }
declare -A R
for spec in "xdin file:$DIR/t.xdin" "xdin pipe:pipe $DIR/t.xdin" "din file:-informat d $DIR/t.din" \
            "din pipe:pipe -informat d $DIR/t.din" "bin file:$DIR/t.bin" "bin pipe:pipe $DIR/t.bin"; do
    name=${spec%%:*}
    read -r -a args <<<"${spec#*:}"
    for who in ${BASELINE:+baseline} new; do
        [[ $who == new ]] && SIM_RUN=$SIM || SIM_RUN=$BASELINE
        if [[ ${args[0]} == pipe ]]; then
            file=${args[-1]}
            extra=("${args[@]:1:${#args[@]}-2}")
            m=$(best_of3 run_pipe "$file" "${GEOM[@]}" "${extra[@]}")
        else
            m=$(best_of3 "$SIM_RUN" "${GEOM[@]}" "${args[@]}")
        fi
        t=${m% *}
        c=${m#* }
        label=$name
        if [[ $who == baseline ]]; then
            label="  (baseline)"
        else
            R[$name]=$(rate "$N" "$t")
        fi
        printf "%-20s %8s %9s %8s %14s\n" "$label" "$t" "$(rate "$N" "$t")" "$c" "$(rate "$N" "$c")"
    done
done
# The same statistics from every format (din differs: Dinero III implies size 4).
cmp -s <("$SIM" "${GEOM[@]}" "$DIR/t.xdin") <("$SIM" "${GEOM[@]}" "$DIR/t.bin") \
    && echo "xdin and bin statistics identical" || { echo "xdin and bin statistics DIFFER"; exit 1; }

echo
PY_RATE=""
if (cd / && python3 -c 'from cachesim import CacheSimulator') 2>/dev/null; then
    PY_RATE=$(python3 - "$DIR/t.bin" "$PY_N" <<'EOF'
import sys, time
from array import array
from cachesim import CacheSimulator, Cache, MainMemory
path, n = sys.argv[1], int(sys.argv[2])
words = array("Q")
with open(path, "rb") as f:
    f.read(24)                                   # aetrace bin header
    words.fromfile(f, n)
mask = (1 << 56) - 1
loads = [w & mask for w in words if (w >> 56) & 3 != 1]
stores = [w & mask for w in words if (w >> 56) & 3 == 1]
mem = MainMemory()
l2 = Cache("L2", 1024, 16, 64, "LRU")            # 1m, 16-way
mem.load_to(l2); mem.store_from(l2)
l1 = Cache("L1", 64, 8, 64, "LRU", store_to=l2, load_from=l2)   # 32k, 8-way
cs = CacheSimulator(l1, mem)
t, c = time.perf_counter(), time.process_time()
cs.loadstore([(loads, stores)], length=1)        # the C backend loops over the lists
dt, dc = time.perf_counter() - t, time.process_time() - c
print("%.1f %.1f" % (len(words) / dt / 1e6, len(words) / dc / 1e6))
EOF
)
    PY_CPU=${PY_RATE#* }
    PY_RATE=${PY_RATE% *}
    echo "pycachesim C backend, from memory ($PY_N refs, unified L1 32k/8 + L2 1m/16):" \
         "$PY_RATE Mrefs/s, $PY_CPU Mrefs/CPU-s"
    awk -v a="${R[xdin file]}" -v p="$PY_RATE" 'BEGIN { printf "ratio cachesim xdin (file) / pycachesim in memory: %.2f\n", a / p }'
else
    echo "pycachesim not installed (pip install pycachesim): no side-by-side figure"
fi
if [[ -n ${DINERO:-} && -x $DINERO ]]; then
    stats() { sed -n '/^l1-/,$p' | grep -v '^---'; }
    for f in "D xdin" "d din"; do
        read -r letter ext <<<"$f"
        m=$(best_of3 sh -c "\"\$0\" \"\$@\" < '$DIR/t.$ext'" "$DINERO" "${GEOM[@]}" -informat "$letter")
        t=${m% *}
        d_rate=$(rate "$N" "$t")
        cmp -s <("$DINERO" "${GEOM[@]}" -informat "$letter" <"$DIR/t.$ext" | stats) \
               <("$SIM" "${GEOM[@]}" -informat "$letter" "$DIR/t.$ext" | stats) \
            && same="statistics identical" || same="statistics DIFFER"
        key="$ext file"
        awk -v n="$ext" -v d="$d_rate" -v c="${m#* }" -v o="${R[$key]}" -v s="$same" 'BEGIN {
            printf "Dinero IV %-4s from stdin: %6.1f Mrefs/s (CPU %s s); cachesim file %.1fx faster; %s\n", n, d, c, o / d, s }'
    done
else
    echo "Dinero IV for reference (quoted in the issue, not measured: set DINERO): din ~16 Mrefs/s, its binary ~29 Mrefs/s"
fi
awk -v x="${R[xdin file]}" -v b="${R[bin file]}" -v p="${PY_RATE:-0}" 'BEGIN {
    if (p > 0) printf "goal xdin >= pycachesim in-memory rate: %s\n", (x >= p ? "met" : "NOT met")
    printf "goal bin >= 150 Mrefs/s: %s (%s)\n", (b >= 150 ? "met" : "NOT met"), b }'

echo
echo "one-pass sweep vs separate runs ($SWEEP_N references, 64-byte blocks, sizes 4k..8m, assoc 1,2,4,8,full)"
s=$(now)
"$SIM" --sweep 4k..8m --assoc 1,2,4,8,full -maxcount "$SWEEP_N" "$DIR/t.bin" >"$DIR/sweep.txt"
e=$(now)
t_sweep=$(awk -v t=$((e - s)) 'BEGIN { printf "%.3f", t / 1e9 }')
mult() { case $1 in *k) echo $(( ${1%k} << 10 ));; *m) echo $(( ${1%m} << 20 ));; *) echo "$1";; esac; }
configs=0
s=$(now)
while read -r size assoc _ misses _; do
    bytes=$(mult "$size")
    if [[ $assoc == full ]]; then a=$((bytes / 64)); else a=${assoc%-way}; fi
    got=$("$SIM" -l1-usize "$bytes" -l1-ubsize 64 -l1-uassoc "$a" -maxcount "$SWEEP_N" "$DIR/t.bin" \
          | awk '/Demand Misses/ { print $3; exit }')
    if [[ $got != "$misses" ]]; then echo "MISMATCH $size $assoc: sweep $misses, separate run $got"; exit 1; fi
    configs=$((configs + 1))
done < <(tail -n +3 "$DIR/sweep.txt")
e=$(now)
t_sep=$(awk -v t=$((e - s)) 'BEGIN { printf "%.3f", t / 1e9 }')
echo "one pass: ${t_sweep}s; $configs separate runs: ${t_sep}s; all miss counts equal"
awk -v a="$t_sep" -v b="$t_sweep" 'BEGIN { printf "sweep speed-up: %.1fx\n", a / b }'
