#!/usr/bin/env bash
# Seeds for the fuzz corpus (fuzz/corpus/TARGET/), from the machine's small
# binaries and recordings of traces/ programs; `cargo fuzz cmin TARGET`
# then keeps the inputs that add coverage (docs/fuzzing.md).
#   fuzz/seed.sh [OUTDIR]   (default fuzz/corpus)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-fuzz/corpus}
cargo build -q --release -p aetrace --bin aetrace
cargo build -q --release -p aetrace-fuzzing --example seed
bin=target/x86_64-unknown-linux-gnu/release
[ -x "$bin/aetrace" ] || bin=target/release
aetrace=$bin/aetrace
seed=$bin/examples/seed
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for t in elf_cfg trace_regen progdb addrtrace din profile; do mkdir -p "$out/$t"; done

# Programs: small, and between them threads, fork, signals, setjmp, jump
# tables, computed gotos, C++ exceptions.
progs=(loops nested_if recursion fnptr calltree signal fork many_threads setjmp computed_goto rc_switch cxx_exceptions)
for p in "${progs[@]}"; do
    src=$(ls traces/$p.c* | head -1)
    cc=gcc; [[ $src == *.cpp ]] && cc=g++
    $cc -O1 -o "$tmp/$p" "$src" -lpthread
    cp "$tmp/$p" "$out/elf_cfg/$p"
done
cp /usr/bin/true "$out/elf_cfg/true"
for lib in libutil.so.1 libattr.so.1 libmnl.so.0; do
    [ -e "/usr/lib/x86_64-linux-gnu/$lib" ] && cp -L "/usr/lib/x86_64-linux-gnu/$lib" "$out/elf_cfg/$lib"
done

for p in "${progs[@]}"; do
    ( cd "$tmp" && "$OLDPWD/$aetrace" record -o "$p.aet" "./$p" >/dev/null 2>&1 ) || true
    [ -s "$tmp/$p.aet" ] || continue
    cp "$tmp/$p.aet" "$out/trace_regen/$p.zstd.aet"
    "$seed" stored "$tmp/$p.aet" "$out/trace_regen/$p.aet"
    "$seed" databases "$tmp/$p.aet" "$out/progdb/$p"
    # Text and binary address traces, cut to a few kilobytes.
    for f in din xdin; do
        "$aetrace" regen --format $f "$tmp/$p.aet" 2>/dev/null | head -c 4000 > "$out/din/$p.$f" || true
    done
    "$aetrace" regen --format bin -o "$tmp/$p.bin" "$tmp/$p.aet"
    head -c 4096 "$tmp/$p.bin" > "$out/addrtrace/$p.bin"
    ( cd "$tmp" && "$OLDPWD/$aetrace" profile -o "$p.aprof" "./$p" >/dev/null 2>&1 \
        && "$OLDPWD/$aetrace" paths -o "$p.apath" "./$p" >/dev/null 2>&1 ) || true
    for f in aprof apath; do
        [ -s "$tmp/$p.$f" ] && cp "$tmp/$p.$f" "$out/profile/$p.$f"
    done
done
du -sh "$out"/*
