#!/usr/bin/env bash
# Coverage-guided fuzzing of every reader of outside input (issue 25):
# each target of fuzz/ (cargo-fuzz, libFuzzer) for SECONDS, one at a time,
# one job. The committed corpus (fuzz/corpus/TARGET) seeds a scratch corpus
# that receives the new inputs; crashes, timeouts and OOMs are written to
# fuzz/artifacts/TARGET/. Prints per target: runs, coverage, corpus, crashes.
#   bench/fuzz.sh [SECONDS] [TARGET...]    (default 60 s, every target)
# Needs cargo-fuzz (`cargo install cargo-fuzz`) and a nightly toolchain;
# without nightly, stable is used with RUSTC_BOOTSTRAP=1 (docs/fuzzing.md).
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-60}
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(elf_cfg trace_regen progdb addrtrace din profile)
if rustup run nightly rustc --version >/dev/null 2>&1; then
    fuzz=(cargo +nightly fuzz)
else
    export RUSTC_BOOTSTRAP=1
    fuzz=(cargo fuzz)
fi
echo "machine: $(nproc) cores, load average $(cut -d" " -f1-3 /proc/loadavg)"
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
logs=${FUZZ_LOGS:-$scratch}
printf '%-12s %8s %10s %8s %8s %8s %s\n' target seconds runs cov ft corpus crashes
for t in "${targets[@]}"; do
    mkdir -p "$scratch/$t" "fuzz/artifacts/$t"
    before=$(ls "fuzz/artifacts/$t" | wc -l)
    log=$logs/$t.log
    status=0
    "${fuzz[@]}" run -O "$t" "$scratch/$t" "fuzz/corpus/$t" -- \
        -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
        -artifact_prefix="fuzz/artifacts/$t/" >"$log" 2>&1 || status=$?
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    last=$(grep -E '^#[0-9]+' "$log" | tail -1)
    cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$last")
    ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$last")
    corp=$(sed -n 's/.* corp: \([0-9]*\).*/\1/p' <<<"$last")
    crashes=$(( $(ls "fuzz/artifacts/$t" | wc -l) - before ))
    printf '%-12s %8s %10s %8s %8s %8s %s\n' "$t" "$secs" "${runs:-?}" "${cov:-?}" "${ft:-?}" "${corp:-?}" "$crashes"
    if [ "$status" -ne 0 ]; then
        grep -E 'panicked|ERROR: libFuzzer|SUMMARY' "$log" | head -3 | sed 's/^/    /'
    fi
done
