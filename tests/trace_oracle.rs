//! Exactness of recorded traces against valgrind lackey (DESIGN.md, oracles):
//! `aetrace record` runs the rewritten program (its stdout, stderr and exit
//! status must equal the native run's), then `aetrace regen --format insn
//! --relative` must equal, instruction for instruction, the addresses
//! lackey reports inside the main executable (minus its load bias and link
//! base) for the same program and arguments. A difference is reported with
//! the first diverging position and its context. Procedures the rewriter
//! left alone (named, with their reasons, by `aetrace info`) run untraced:
//! their instructions are removed from lackey's stream before comparing,
//! and the test reports how many there were. Signals: handlers run by
//! `raise`, `kill`, nested and in a second thread compare exactly; faults
//! compare up to the few instructions lackey loses before each fault (see
//! `faults_recovered_by_siglongjmp`); asynchronous timer signals, which
//! valgrind delivers at its own points, are checked against the program's
//! own counts.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::build::{build, run_native, Link, Opt, Variant};
use common::elf::Elf;
use common::lackey::{self, Capture, LogMode};

/// Lowest PT_LOAD vaddr, page-aligned down: what `--relative` subtracts.
fn link_base(exe: &Path) -> u64 {
    let b = std::fs::read(exe).unwrap();
    let u16_at = |o: usize| u16::from_le_bytes([b[o], b[o + 1]]) as usize;
    let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap());
    let (phoff, phentsize, phnum) = (u64_at(0x20) as usize, u16_at(0x36), u16_at(0x38));
    (0..phnum)
        .map(|i| phoff + i * phentsize)
        .filter(|&o| u32::from_le_bytes(b[o..o + 4].try_into().unwrap()) == 1)
        .map(|o| u64_at(o + 16))
        .min()
        .unwrap()
        & !0xfff
}

/// The instruction sequences of `aetrace regen`, one per thread.
fn regen_threads(trace: &Path) -> Vec<Vec<u64>> {
    let out = Command::new(common::aetrace())
        .args(["regen", "--format", "insn", "--relative", "-j", "1"])
        .arg(trace)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "aetrace regen failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut threads: Vec<Vec<u64>> = Vec::new();
    for line in out.stdout.split(|&c| c == b'\n') {
        if line.starts_with(b"#") {
            threads.push(Vec::new());
        } else if !line.is_empty() {
            let s = std::str::from_utf8(line).unwrap();
            let a = u64::from_str_radix(s, 16).unwrap_or_else(|_| panic!("bad line {s:?}"));
            if threads.is_empty() {
                threads.push(Vec::new());
            }
            threads.last_mut().unwrap().push(a);
        }
    }
    threads
}

fn first_difference(expected: &[u64], got: &[u64]) -> Option<String> {
    let i = expected.iter().zip(got).position(|(a, b)| a != b);
    let i = match i {
        Some(i) => i,
        None if expected.len() == got.len() => return None,
        None => expected.len().min(got.len()),
    };
    let ctx = |s: &[u64]| {
        s[i.saturating_sub(5)..(i + 5).min(s.len())]
            .iter()
            .map(|a| format!("{a:x}"))
            .collect::<Vec<_>>()
            .join(" ")
    };
    Some(format!(
        "first difference at instruction {i} (lackey {} instructions, regen {}):\n  lackey: {}\n  regen:  {}",
        expected.len(),
        got.len(),
        ctx(expected),
        ctx(got)
    ))
}

/// Whether the instruction at `addr` carries a `rep`/`repne` prefix:
/// lackey reports one execution per iteration of such an instruction
/// (VEX turns each iteration into its own jump back), the program executes
/// it once.
fn is_rep(elf: &Elf, addr: u64) -> bool {
    let Some(s) = elf
        .sections
        .iter()
        .find(|s| s.exec && s.addr <= addr && addr < s.addr + s.size)
    else {
        return false;
    };
    elf.bytes_of(s, addr, 4.min(s.addr + s.size - addr))
        .iter()
        .take_while(|b| {
            matches!(
                b,
                0x66 | 0x67 | 0x2e | 0x3e | 0x26 | 0x64 | 0x65 | 0x36 | 0xf2 | 0xf3
            )
        })
        .any(|&b| b == 0xf2 || b == 0xf3)
}

/// Address ranges of the procedures `aetrace info` says were left alone.
fn left_alone_ranges(exe: &Path, trace: &Path) -> Vec<(u64, u64)> {
    let info = Command::new(common::aetrace())
        .args(["info", "--json"])
        .arg(trace)
        .output()
        .unwrap();
    assert!(info.status.success(), "aetrace info failed");
    let info: serde_json::Value = serde_json::from_slice(&info.stdout).unwrap();
    let names: Vec<String> = info["programs"][0]["left_alone"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["name"].as_str().unwrap().to_owned())
        .collect();
    let cfg = Command::new(common::aetrace())
        .args(["cfg", "--json"])
        .arg(exe)
        .output()
        .unwrap();
    let cfg: serde_json::Value = serde_json::from_slice(&cfg.stdout).unwrap();
    let mut ranges = Vec::new();
    for p in cfg["procedures"].as_array().unwrap() {
        if names.iter().any(|n| p["name"] == n.as_str()) {
            for r in p["ranges"].as_array().unwrap() {
                ranges.push((r[0].as_u64().unwrap(), r[1].as_u64().unwrap()));
            }
        }
    }
    ranges
}

/// Records `exe args`, checks its behaviour against the native run and
/// its regenerated trace against lackey.
fn check(exe: &Path, args: &[&str]) {
    check_with(exe, args, LogMode::Pipe)
}

/// [`check`]; `mode` is [`LogMode::PerProcessFiles`] for programs that fork
/// (each process's threads follow its parent's, in pid order, like
/// aetrace's streams).
fn check_with(exe: &Path, args: &[&str], mode: LogMode) {
    let (name, lk, rg) = record_both(exe, args, mode);
    for (t, (l, r)) in lk.iter().zip(&rg).enumerate() {
        if let Some(d) = first_difference(l, r) {
            panic!("{name}: thread {t}: {d}");
        }
    }
}

/// Records `exe args` (checking its behaviour against the native run) and
/// returns its name, lackey's instruction sequences and aetrace's, one per
/// thread, as link-time offsets (the thread counts are checked equal).
fn record_both(exe: &Path, args: &[&str], mode: LogMode) -> (String, Vec<Vec<u64>>, Vec<Vec<u64>>) {
    let name = exe.file_name().unwrap().to_string_lossy().into_owned();
    let native = run_native(exe, args);
    let dir = common::scratch("trace-oracle");
    let trace = dir.join(format!("{name}-{}.aet", std::process::id()));
    let recorded = Command::new(common::aetrace())
        .arg("record")
        .arg("-o")
        .arg(&trace)
        .arg("--")
        .arg(exe)
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&recorded.stderr),
        String::from_utf8_lossy(&native.stderr),
        "{name}: stderr differs"
    );
    assert_eq!(recorded.stdout, native.stdout, "{name}: stdout differs");
    assert_eq!(
        recorded.status.code(),
        native.status.code(),
        "{name}: status differs"
    );
    let modules = [exe.to_path_buf()];
    let run = lackey::run_with(exe, args, &modules, "*", mode, Capture::Sequences);
    let base = link_base(exe);
    let alone = left_alone_ranges(exe, &trace);
    let elf = Elf::read(exe);
    let mut rep_cache: std::collections::HashMap<u64, bool> = Default::default();
    let mut untraced = 0usize;
    let lk: Vec<Vec<u64>> = run.modules[0]
        .sequences
        .values()
        .map(|s| {
            // `a` is a link-time address (lackey's minus the load bias).
            let mut kept: Vec<u64> = Vec::with_capacity(s.len());
            let mut prev = None;
            for &a in s {
                let repeat =
                    prev == Some(a) && *rep_cache.entry(a).or_insert_with(|| is_rep(&elf, a));
                prev = Some(a);
                if repeat {
                    continue;
                }
                if alone.iter().any(|&(lo, hi)| lo <= a && a < hi) {
                    untraced += 1;
                } else {
                    kept.push(a - base);
                }
            }
            kept
        })
        .collect();
    if untraced > 0 {
        eprintln!("{name}: {untraced} instructions in procedures left alone ({alone:x?})");
    }
    let rg = regen_threads(&trace);
    assert_eq!(
        lk.len(),
        rg.len(),
        "{name}: thread count (lackey {}, regen {})",
        lk.len(),
        rg.len()
    );
    let _ = std::fs::remove_file(&trace);
    (name, lk, rg)
}

fn traced(source: &str, v: Variant, args: &[&str]) {
    let exe: PathBuf = build(source, v);
    check(&exe, args);
}

const O2_PIE: Variant = Variant::new(Opt::O2, Link::Pie, false);
const O0_NOPIE: Variant = Variant::new(Opt::O0, Link::NoPie, true);

#[test]
fn loops() {
    traced("loops.c", O2_PIE, &[]);
    traced("loops.c", O0_NOPIE, &[]);
}

#[test]
fn nested_if() {
    traced("nested_if.c", O2_PIE, &[]);
}

#[test]
fn switch_jump_tables() {
    traced("switch.c", O2_PIE, &[]);
    traced("switch.c", O0_NOPIE, &[]);
}

#[test]
fn recursion() {
    traced("recursion.c", O2_PIE, &[]);
}

#[test]
fn function_pointers() {
    traced("fnptr.c", O2_PIE, &[]);
}

#[test]
fn tail_calls() {
    traced("tailcall.c", O2_PIE, &[]);
}

#[test]
fn qsort_callbacks() {
    traced("qsort_callback.c", O2_PIE, &[]);
}

#[test]
fn exit_with_frames_active() {
    traced("exit_nested.c", O2_PIE, &[]);
}

#[test]
fn noreturn_calls() {
    traced("noreturn.c", O2_PIE, &[]);
}

/// A deterministic 20 kB input file for the system workloads.
fn input(name: &str) -> String {
    let p = common::scratch("inputs").join(format!("trace-oracle-{name}"));
    std::fs::write(&p, common::text_input(20_000)).unwrap();
    p.display().to_string()
}

#[test]
fn debian_gzip() {
    check(Path::new("/usr/bin/gzip"), &["-c", &input("gzip")]);
}

#[test]
fn debian_bzip2() {
    check(Path::new("/usr/bin/bzip2"), &["-c", &input("bzip2")]);
}

#[test]
fn debian_xz() {
    check(Path::new("/usr/bin/xz"), &["-c", &input("xz")]);
}

#[test]
fn debian_sort() {
    let p = common::scratch("inputs").join("trace-oracle-sort");
    let lines: String = (0..20_000u64)
        .map(|i| format!("{}\n", i.wrapping_mul(2_654_435_761) % 1_000_003))
        .collect();
    std::fs::write(&p, lines).unwrap();
    check(Path::new("/usr/bin/sort"), &[&p.display().to_string()]);
}

#[test]
fn threads() {
    // One stream per thread; lackey's threads in creation order (its
    // thread ids), aetrace's in the order their streams appear.
    traced("threads.c", O2_PIE, &[]);
}

#[test]
fn fork_child_continues_from_its_parent() {
    check_with(&build("fork.c", O2_PIE), &[], LogMode::PerProcessFiles);
}

#[test]
fn cxx_exceptions_land_in_the_right_frames() {
    traced("cxx_exceptions.cpp", O2_PIE, &[]);
    traced("cxx_unwind_deep.cpp", O2_PIE, &[]);
    traced(
        "cxx_unwind_deep.cpp",
        Variant::new(Opt::O0, Link::NoPie, false),
        &[],
    );
}

#[test]
fn setjmp_longjmp() {
    traced("setjmp.c", O2_PIE, &[]);
    traced("setjmp.c", O0_NOPIE, &[]);
}

/// Builds `traces/<source>` with extra gcc flags (into the scratch dir).
fn build_with(source: &str, tag: &str, flags: &[&str]) -> PathBuf {
    let out = common::scratch("trace-oracle-builds").join(format!("{source}-{tag}"));
    let st = Command::new("gcc")
        .args(flags)
        .arg("-o")
        .arg(&out)
        .arg(common::repo_root().join("traces").join(source))
        .status()
        .unwrap();
    assert!(st.success(), "gcc {source} {flags:?}");
    out
}

#[test]
fn stripped_binary_without_unwind_tables() {
    // No FDEs for the program's own functions and no symbols: procedures
    // come from the entry point, init/fini arrays and call targets.
    let exe = build_with(
        "switch.c",
        "noeh-stripped",
        &[
            "-O2",
            "-fno-asynchronous-unwind-tables",
            "-fno-unwind-tables",
            "-s",
        ],
    );
    check(&exe, &[]);
}

#[test]
fn signal_handlers_run_by_raise() {
    traced("signal.c", O2_PIE, &[]);
    traced("signal.c", O0_NOPIE, &[]);
}

#[test]
fn signal_handlers_calling_traced_code() {
    traced("signal_calls.c", O2_PIE, &[]);
    traced("signal_calls.c", O0_NOPIE, &[]);
}

#[test]
fn nested_signal_handlers() {
    traced("signal_nested.c", O2_PIE, &[]);
}

/// Link-time offset of symbol `sym` in `exe` (from `nm`).
fn symbol(exe: &Path, sym: &str) -> u64 {
    let out = Command::new("nm").arg(exe).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let addr = text
        .lines()
        .find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() == 3 && f[2] == sym).then(|| u64::from_str_radix(f[0], 16).unwrap())
        })
        .unwrap_or_else(|| panic!("no symbol {sym} in {}", exe.display()));
    addr - link_base(exe)
}

#[test]
fn faults_recovered_by_siglongjmp() {
    // Lackey prints instruction addresses from a small buffer flushed every
    // few events, and a fault discards what is still buffered: before each
    // entry of the fault handler its stream may lack the last few
    // instructions that ran (the faulting one among them, which aetrace
    // lists: it was fetched and started, and runs again if the handler
    // returns). Those, and only those, are dropped from aetrace's sequence
    // before comparing; everything else must be equal.
    for v in [O2_PIE, Variant::new(Opt::O0, Link::NoPie, false)] {
        let exe = build("signal_fault.c", v);
        let handler = symbol(&exe, "on_fault");
        let (name, lk, rg) = record_both(&exe, &[], LogMode::Pipe);
        let (l, r) = (&lk[0], &rg[0]);
        let mut kept = Vec::with_capacity(r.len());
        let (mut faults, mut lpos) = (0, 0);
        for &a in r {
            if a == handler {
                faults += 1;
                // Lackey's entry of the same handler call: what lackey lacks
                // just before it is what it lost at the fault.
                let k = kept.len();
                let p = lpos
                    + l[lpos..]
                        .iter()
                        .position(|&x| x == handler)
                        .unwrap_or_else(|| panic!("{name}: lackey has no handler entry {faults}"));
                let missing = k.saturating_sub(p);
                assert!(
                    missing <= 4,
                    "{name}: {missing} instructions missing before fault {faults}"
                );
                kept.truncate(k - missing);
                lpos = p + 1;
            }
            kept.push(a);
        }
        assert_eq!(
            faults, 4,
            "{name}: handler entries in the regenerated trace"
        );
        if let Some(d) = first_difference(l, &kept) {
            panic!("{name}: thread 0: {d}");
        }
    }
}

#[test]
fn signal_in_a_second_thread() {
    traced("signal_thread.c", O2_PIE, &[]);
}

/// Runs `aetrace` with `args`, which must succeed; its stdout.
fn aetrace_ok(args: &[&str], trace: &Path) -> String {
    let out = Command::new(common::aetrace())
        .args(args)
        .arg(trace)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "aetrace {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn asynchronous_timer_signals() {
    // Valgrind delivers asynchronous signals at its own points, so the
    // oracle is the program's output: how many times the handler ran and
    // how many loop iterations (each one call of `step`) ran.
    for v in [O2_PIE, Variant::new(Opt::O0, Link::NoPie, false)] {
        let exe = build("signal_alarm.c", v);
        let name = exe.file_name().unwrap().to_string_lossy().into_owned();
        let trace =
            common::scratch("trace-oracle").join(format!("{name}-{}.aet", std::process::id()));
        let rec = Command::new(common::aetrace())
            .arg("record")
            .arg("-o")
            .arg(&trace)
            .arg("--")
            .arg(&exe)
            .output()
            .unwrap();
        assert!(
            rec.status.success(),
            "{name}: {}",
            String::from_utf8_lossy(&rec.stderr)
        );
        let stdout = String::from_utf8(rec.stdout).unwrap();
        let field = |key: &str| -> u64 {
            stdout
                .split_whitespace()
                .find_map(|w| w.strip_prefix(key)?.parse().ok())
                .unwrap_or_else(|| panic!("{name}: no {key} in {stdout:?}"))
        };
        let (handled, iterations) = (field("handled="), field("iterations="));
        let blocks = aetrace_ok(&["regen", "--format", "block", "--relative"], &trace);
        let entries = |sym: &str| {
            let at = format!("{:x} ", symbol(&exe, sym));
            blocks.lines().filter(|l| l.starts_with(&at)).count() as u64
        };
        assert_eq!(entries("on_alarm"), handled, "{name}: handler entries");
        assert_eq!(entries("step"), iterations, "{name}: loop iterations");
        // The instruction trace regenerates too, and many signals landed
        // inside instrumentation (witness writes, checks, records).
        let insns = aetrace_ok(&["regen", "--format", "insn"], &trace);
        let count = aetrace_ok(&["regen", "--count"], &trace);
        // Blocks split by a handler are counted once: the same instructions.
        let lines = insns.lines().filter(|l| !l.starts_with('#')).count();
        assert!(
            count.contains(&format!(": {lines} instructions,")),
            "{name}: {lines} instructions regenerated, --count says {count}"
        );
        let line = count.lines().next().unwrap();
        let nums: Vec<u64> = line
            .split(|c: char| !c.is_ascii_digit())
            .filter_map(|w| w.parse().ok())
            .collect();
        let n = nums.len();
        assert!(line.contains("signals ("), "{name}: {line}");
        let (signals, inside) = (nums[n - 2], nums[n - 1]);
        assert_eq!(signals, handled, "{name}: SIGNAL records placed: {line}");
        eprintln!("{name}: {handled} handlers, {iterations} iterations, {inside} signals inside instrumentation");
        assert!(
            inside > 0,
            "{name}: no signal interrupted instrumentation: {line}"
        );
        let _ = std::fs::remove_file(&trace);
    }
}
