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

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::build::{build, build_with_lib, run_checked, run_native, Link, Opt, Variant};
use common::elf::Elf;
use common::lackey::{self, Capture, LogMode};
use common::recorded::{
    assert_same_run, early_procedures, info_json, instrumented_modules, issue_workloads,
    left_alone_ranges, link_base, record_checked, record_ok, record_run, sort_lines, Knobs,
};

/// The instruction sequences of `aetrace regen`, one per thread (of
/// module `module` only, when given) with its thread id; the same bytes
/// with each stream cut into 4 kB pieces expanded in parallel.
pub(crate) fn regen_threads_with_tids(trace: &Path, module: Option<&str>) -> Vec<(u32, Vec<u64>)> {
    let regen = |jobs: &str| {
        let mut cmd = Command::new(common::aetrace());
        cmd.args([
            "regen",
            "--format",
            "insn",
            "--relative",
            "-j",
            jobs,
            "--piece",
            "4096",
        ]);
        if let Some(m) = module {
            cmd.args(["--module", m]);
        }
        let out = cmd.arg(trace).output().unwrap();
        assert!(
            out.status.success(),
            "aetrace regen -j {jobs} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        out
    };
    let out = regen("1");
    assert!(regen("2").stdout == out.stdout, "-j 2 differs from -j 1");
    let mut threads: Vec<(u32, Vec<u64>)> = Vec::new();
    for line in out.stdout.split(|&c| c == b'\n') {
        if let Some(head) = line.strip_prefix(b"# thread ") {
            // "# thread N pid P tid T"
            let head = String::from_utf8_lossy(head);
            let tid = head.rsplit(' ').next().and_then(|t| t.parse().ok());
            threads.push((tid.unwrap_or(0), Vec::new()));
        } else if !line.is_empty() && !line.starts_with(b"#") {
            let s = std::str::from_utf8(line).unwrap();
            let a = u64::from_str_radix(s, 16).unwrap_or_else(|_| panic!("bad line {s:?}"));
            if threads.is_empty() {
                threads.push((0, Vec::new()));
            }
            threads.last_mut().unwrap().1.push(a);
        }
    }
    threads
}

/// [`regen_threads_with_tids`] without the thread ids.
pub(crate) fn regen_threads(trace: &Path, module: Option<&str>) -> Vec<Vec<u64>> {
    let threads = regen_threads_with_tids(trace, module);
    threads.into_iter().map(|(_, t)| t).collect()
}

pub(crate) fn first_difference(expected: &[u64], got: &[u64]) -> Option<String> {
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

/// Records `exe args`, checks its behaviour against the native run and
/// its regenerated trace against lackey.
fn check(exe: &Path, args: &[&str]) {
    check_with(exe, args, LogMode::Pipe)
}

/// [`check`]; `mode` is [`LogMode::PerProcessFiles`] for programs that fork
/// (each process's threads follow its parent's, in pid order, like
/// aetrace's streams).
fn check_with(exe: &Path, args: &[&str], mode: LogMode) {
    check_libs(exe, args, &[], mode);
}

/// [`check_with`] recording with `--libs LIBS` too: every instrumented
/// module of the trace (the executable, then each library) is compared
/// with lackey's instructions inside that module, through `aetrace regen
/// --module M --relative` (threads that never ran in M are skipped on both
/// sides). Returns `aetrace info --json` of the trace.
pub(crate) fn check_libs(
    exe: &Path,
    args: &[&str],
    libs: &[&str],
    mode: LogMode,
) -> serde_json::Value {
    check_recorded(exe, args, libs, mode, Knobs::DEFAULT)
}

/// [`check_libs`] with `knobs`.
fn check_recorded(
    exe: &Path,
    args: &[&str],
    libs: &[&str],
    mode: LogMode,
    knobs: Knobs,
) -> serde_json::Value {
    let (name, trace) = record_checked(exe, args, libs, knobs);
    let info = info_json(&trace);
    let modules = instrumented_modules(&info);
    if libs == ["all"] {
        assert!(modules.len() > 1, "{name}: --libs all traced no library");
    } else {
        assert_eq!(
            modules.len(),
            1 + libs.len(),
            "{name}: instrumented modules in the trace: {modules:?}"
        );
    }
    let run = lackey::run_with(exe, args, &modules, mode, Capture::Sequences);
    for (k, module) in modules.iter().enumerate() {
        // libc.so.6, traced by `all`: its stream under valgrind has one
        // more `__cxa_finalize`, called by `vgpreload_core`'s destructor,
        // than a native run's; `libc_so_traced` compares it with the
        // native run stepped.
        if libs == ["all"] && module.file_name().is_some_and(|f| f == "libc.so.6") {
            continue;
        }
        let filter = (!libs.is_empty()).then(|| module.to_str().unwrap());
        compare_module(&name, module, &info, k, &run.modules[k], &trace, filter);
    }
    let _ = std::fs::remove_file(&trace);
    info
}

/// The names `aetrace info` gives for the procedures of the `k`th program
/// of a trace that were left alone, with their reasons.
pub(crate) fn left_alone(info: &serde_json::Value, k: usize) -> Vec<String> {
    info["programs"][k]["left_alone"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l.to_string())
        .collect()
}

/// The offsets from `base` of the link-time addresses `addrs` that a trace
/// holds: a `rep` instruction once, those in procedures left alone
/// (`alone`) counted apart (the second value).
fn traced_offsets(
    addrs: impl Iterator<Item = u64>,
    elf: &Elf,
    alone: &[(u64, u64)],
    base: u64,
) -> (Vec<u64>, usize) {
    let mut rep_cache: std::collections::HashMap<u64, bool> = Default::default();
    let (mut kept, mut prev, mut untraced) = (Vec::new(), None, 0usize);
    for a in addrs {
        let repeat = prev == Some(a) && *rep_cache.entry(a).or_insert_with(|| elf.is_rep(a));
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
    (kept, untraced)
}

/// The addresses of `s` (one thread's, in one module) that the trace
/// holds once its code ld.so runs before the runtime's init (`early`,
/// traced from the init on) is taken out: when `first`, the leading
/// instructions in it, before the first one outside it and outside the
/// procedures left alone (`alone`). Per module, since lackey's sequences
/// are: a module's early code that runs before any of its other traced
/// code runs before the init (ld.so relocates and resolves IFUNCs first).
fn after_init<'a>(
    s: &'a [u64],
    early: &'a [(u64, u64)],
    alone: &'a [(u64, u64)],
    first: bool,
) -> impl Iterator<Item = u64> + 'a {
    let inside = |r: &[(u64, u64)], a: u64| r.iter().any(|&(lo, hi)| lo <= a && a < hi);
    let mut before_init = first;
    s.iter().copied().filter(move |&a| {
        if before_init && inside(early, a) {
            return false;
        }
        before_init &= inside(alone, a);
        true
    })
}

/// Lackey's and aetrace's instruction sequences of one module, per thread,
/// as link-time offsets (thread counts checked equal).
pub(crate) fn module_sequences(
    name: &str,
    module: &Path,
    info: &serde_json::Value,
    k: usize,
    lackey: &lackey::ModuleTrace,
    trace: &Path,
    filter: Option<&str>,
) -> (String, Vec<Vec<u64>>, Vec<Vec<u64>>) {
    let exe = module;
    let base = link_base(exe);
    let alone = left_alone_ranges(exe, info, k);
    let elf = Elf::read(exe);
    let mut untraced = 0usize;
    let early: Vec<(u64, u64)> = (early_procedures(exe, info).into_iter())
        .flat_map(|(_, ranges)| ranges)
        .collect();
    let mut lk: Vec<Vec<u64>> = lackey
        .sequences
        .values()
        .enumerate()
        .map(|(t, s)| {
            // Only the first thread runs before the runtime's init.
            let s = after_init(s, &early, &alone, t == 0);
            // Link-time addresses (lackey's minus the load bias).
            let (kept, alone_here) = traced_offsets(s, &elf, &alone, base);
            untraced += alone_here;
            kept
        })
        .collect();
    let name = format!("{name} ({})", module.display());
    if untraced > 0 {
        eprintln!("{name}: {untraced} instructions in procedures left alone ({alone:x?})");
    }
    let mut rg = regen_threads(trace, filter);
    if filter.is_some() {
        lk.retain(|s| !s.is_empty());
        rg.retain(|s| !s.is_empty());
    }
    assert!(
        lk.iter().map(Vec::len).sum::<usize>() > 0,
        "{name}: lackey saw no instruction of the module"
    );
    assert_eq!(
        lk.len(),
        rg.len(),
        "{name}: thread count (lackey {}, regen {})",
        lk.len(),
        rg.len()
    );
    (name, lk, rg)
}

/// Lackey's instructions inside `module` (the `k`th program of the trace)
/// against `aetrace regen` (of that module only when `filter` is given).
fn compare_module(
    name: &str,
    module: &Path,
    info: &serde_json::Value,
    k: usize,
    lackey: &lackey::ModuleTrace,
    trace: &Path,
    filter: Option<&str>,
) {
    let (name, lk, rg) = module_sequences(name, module, info, k, lackey, trace, filter);
    // Threads are numbered by the order they start: under valgrind that is
    // creation order, natively threads created back to back may take their
    // stream slots in another order. Each of our threads must equal one of
    // lackey's, each used once; a thread that equals none is reported
    // against lackey's thread of the same number.
    let mut unmatched: Vec<&Vec<u64>> = lk.iter().collect();
    for (t, r) in rg.iter().enumerate() {
        match unmatched.iter().position(|l| *l == r) {
            Some(i) => {
                unmatched.swap_remove(i);
            }
            None => {
                let d = lk
                    .get(t)
                    .and_then(|l| first_difference(l, r))
                    .unwrap_or_else(|| "equal to a thread already matched".into());
                panic!("{name}: thread {t}: {d}");
            }
        }
    }
    eprintln!(
        "{name}: {} instructions equal to lackey's",
        lk.iter().map(Vec::len).sum::<usize>()
    );
}

/// Records `exe args` (checking its behaviour against the native run) and
/// returns its name, lackey's instruction sequences and aetrace's for the
/// executable, one per thread, as link-time offsets.
fn record_both(exe: &Path, args: &[&str], mode: LogMode) -> (String, Vec<Vec<u64>>, Vec<Vec<u64>>) {
    let (name, trace) = record_checked(exe, args, &[], Knobs::DEFAULT);
    let info = info_json(&trace);
    let run = lackey::run_with(exe, args, &[exe.to_path_buf()], mode, Capture::Sequences);
    let seqs = module_sequences(&name, exe, &info, 0, &run.modules[0], &trace, None);
    let _ = std::fs::remove_file(&trace);
    seqs
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

/// 2048 branches in a row in one procedure, without a loop or a call:
/// about 19 kB of witnesses on one path from the entry check. The rewriter
/// adds checks inside it; before, the path overran a buffer half's 4 KiB
/// headroom and every recording with 16 KiB halves failed ("fill 19517
/// outside 0..=16384"); with the default 256 KiB halves, one whose entry
/// came within 15 kB of a half's limit would have.
#[test]
fn long_acyclic_paths_get_buffer_checks() {
    for v in [O2_PIE, O0_NOPIE] {
        let exe = build("long_branches.c", v);
        check_recorded(&exe, &[], &[], LogMode::Pipe, SMALL_HALVES);
    }
}

#[test]
fn switch_jump_tables() {
    traced("switch.c", O2_PIE, &[]);
    traced("switch.c", O0_NOPIE, &[]);
}

/// Whether some jump table of `exe` (by `aetrace cfg --json`) has a case
/// outside the ranges of its procedure.
fn table_case_outside(exe: &Path) -> bool {
    let cfg = common::recorded::cfg_json(exe);
    cfg["procedures"].as_array().unwrap().iter().any(|p| {
        let inside = |t: u64| {
            p["ranges"].as_array().unwrap().iter().any(|r| {
                let (lo, hi) = (r[0].as_u64().unwrap(), r[1].as_u64().unwrap());
                lo <= t && t < hi
            })
        };
        p["indirect_jumps"].as_array().unwrap().iter().any(|j| {
            j["class"] == "jumptable"
                && j["targets"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|t| !inside(t.as_u64().unwrap()))
        })
    })
}

/// A switch whose holes go to gcc's `.cold` part, which only the table
/// enters (`traces/cold_case.c`, as in Debian's make and od): those cases
/// are tail calls to the part's own procedure, traced, and the run, which
/// ends in one, regenerates exactly, with or without the `.cold` symbol.
#[test]
fn jump_table_cases_in_a_cold_part() {
    for v in [O2_PIE, Variant::new(Opt::O2, Link::Pie, true)] {
        let exe = build("cold_case.c", v);
        // Not a test of anything if gcc kept the cases in the procedure.
        assert!(table_case_outside(&exe), "{v:?}: no case outside");
        let info = check_libs(&exe, &[], &[], LogMode::Pipe);
        let alone = left_alone(&info, 0);
        assert!(
            alone.iter().all(|l| !l.contains("jump table")),
            "{v:?}: {alone:?}"
        );
    }
}

/// Absolute jump tables read past their entry 0 (`traces/switch_nonzero.c`,
/// non-PIE; cc1's `hash_operand`, issue 23): gcc's `step` tests its index
/// against zero before `jmp *T(,%rax,8)`, so the path reads entries 1..=10
/// of the table the code names at T. The analysis described it from T + 8,
/// the copy's `jmp` (which names T) kept the original table and ran on in
/// the original code, untraced, and `regen` failed; now the table is read
/// from T (its entry 0 is a label) and `step` is traced. `shifted` names
/// its table one word (no label) before the first entry it can read: it
/// is left alone, with the reason, rather than traced wrongly.
#[test]
fn absolute_tables_read_past_entry_0() {
    let exe = build(
        "switch_nonzero.c",
        Variant::new(Opt::O2, Link::NoPie, false),
    );
    let info = check_libs(&exe, &[], &[], LogMode::Pipe);
    let alone = left_alone(&info, 0);
    assert_eq!(alone.len(), 1, "{alone:?}");
    assert!(
        alone[0].contains("shifted") && alone[0].contains("is not named by any instruction"),
        "{alone:?}"
    );
}

/// A function only a data word names (`traces/cold_slot.c`, non-PIE and
/// stripped; python3's `member_get`, named only by a type's slot, issue
/// 23) whose `.cold` part starts with a case its absolute switch table
/// enters: the hot part is the procedure's entry, with its springboard,
/// so the call through the table `ops` runs the traced copy. Before, the
/// `.cold` part was taken as the start, the call ran the original code
/// untraced and the trace lacked `get`'s instructions (python3's stepped
/// sweep differed at instruction 4,178,870).
#[test]
fn a_function_named_only_by_data_keeps_its_entry_before_its_cold_part() {
    let exe = build("cold_slot.c", Variant::new(Opt::O2, Link::NoPie, true));
    let info = check_libs(&exe, &[], &[], LogMode::Pipe);
    let alone = left_alone(&info, 0);
    assert!(alone.is_empty(), "{alone:?}");
}

/// A function only a data slot names whose `.cold` part another function
/// jumps to (`traces/cold_shared.c`, non-PIE and stripped; python3's
/// 0x56a100, issue 23): the outside jump makes the `.cold` part the
/// procedure's start, and the hot part must still be an entry, else the
/// call through the slot runs the original code untraced (python3's
/// stepped sweep differed at instruction 4,968,499).
#[test]
fn a_hot_part_named_by_a_slot_is_an_entry_beside_its_cold_start() {
    let exe = build("cold_shared.c", Variant::new(Opt::O2, Link::NoPie, true));
    let info = check_libs(&exe, &[], &[], LogMode::Pipe);
    let alone = left_alone(&info, 0);
    assert!(alone.is_empty(), "{alone:?}");
}

#[test]
fn recursion() {
    traced("recursion.c", O2_PIE, &[]);
}

#[test]
fn function_pointers() {
    traced("fnptr.c", O2_PIE, &[]);
}

/// Untraced code that keeps values in r11 and the flags across a direct
/// call (gcc's `-fipa-ra`, as cc1 -O2 does) enters traced procedures
/// through their outside-entry stubs: the run keeps its native output
/// (before, the stub's r11 clobbered `keep_r11`'s value and cc1 -O2
/// aborted in `free`; then the callees with nothing free were left alone,
/// and cc1 lost 46 procedures that way), every callee stays traced
/// (`bump_rcx`'s stub uses rcx, the others' calls go to a preserving
/// stub; `bump_lea`'s return saves the flags around its transfer count),
/// and the trace equals lackey's.
#[test]
fn fipa_ra_callers_keep_registers_across_outside_entries() {
    let exe = build("ipa_ra.c", O2_PIE);
    let info = check_libs(&exe, &[], &[], LogMode::Pipe);
    let alone = left_alone(&info, 0);
    assert_eq!(alone.len(), 3, "only the keep_* callers: {alone:?}");
    assert!(alone.iter().all(|l| l.contains("keep_")), "{alone:?}");
}

/// A callee of untraced code that untraced code entered by a short jump
/// (`traces/short_chain.c`, python3's 0x4db3e9 chain): its call goes to
/// the callee's preserving stub although it lies where the caller's
/// springboard would have gone; only the two procedures that cannot be
/// traced are left alone, and the trace equals lackey's.
#[test]
fn a_call_beside_a_springboard_its_procedure_lost_is_retargeted() {
    let exe = build("short_chain.c", O2_PIE);
    let info = check_libs(&exe, &[], &[], LogMode::Pipe);
    let alone = left_alone(&info, 0);
    assert_eq!(alone.len(), 2, "tiny and body only: {alone:?}");
    assert!(alone.iter().all(|l| !l.contains("leaf")), "{alone:?}");
}

/// The same with code gcc -O2 wrote: untraced `mix` keeps seven values in
/// caller-saved registers (rax, rcx, rsi, r8-r11) across its direct call
/// of `step`, which writes only memory and the flags; `step` is traced
/// (also called from traced `main`), entered from `mix` through its
/// preserving stub, and output and trace equal the native run's and
/// lackey's.
#[test]
fn fipa_ra_gcc_caller_keeps_caller_saved_registers() {
    let exe = build("ipa_ra_gcc.c", O2_PIE);
    let info = check_libs(&exe, &[], &[], LogMode::Pipe);
    let alone = left_alone(&info, 0);
    assert_eq!(alone.len(), 1, "only mix: {alone:?}");
    assert!(alone[0].contains("mix"), "{alone:?}");
}

/// Procedures shorter than a springboard with no fill after them: the
/// one only direct calls enter (from traced `main`, and from untraced
/// `outer`, whose call is retargeted to its copy) is traced without a
/// springboard, the one whose address is taken is left alone saying so,
/// and the trace equals lackey's.
#[test]
fn short_procedures_entered_only_directly_are_traced() {
    let exe = build("short_procs.c", O2_PIE);
    let info = check_libs(&exe, &[], &[], LogMode::Pipe);
    let alone = left_alone(&info, 0);
    assert_eq!(alone.len(), 2, "{alone:?}");
    assert!(alone.iter().any(|l| l.contains("outer")), "{alone:?}");
    assert!(
        alone
            .iter()
            .any(|l| l.contains("tiny_taken") && l.contains("address may be taken")),
        "{alone:?}"
    );
}

/// A non-PIE program that takes `malloc`'s and `free`'s addresses: libc
/// calls them through its GOT, bound to the program's PLT stubs, also
/// inside imports the rewriter knows never to call back (`strdup`). Those
/// calls now carry RETURN, so the stubs' ENTERs are placed; before, regen
/// stopped at them (cc1 at -O0, "ENTER after nl_langinfo@plt").
#[test]
fn libc_calls_a_canonical_plt_stub() {
    let exe = build("canonical_plt.c", Variant::new(Opt::O2, Link::NoPie, false));
    let syms = Command::new("readelf")
        .args(["--dyn-syms", "-W"])
        .arg(&exe)
        .output()
        .unwrap();
    // An undefined function with a value: its canonical PLT stub.
    let canonical = String::from_utf8_lossy(&syms.stdout)
        .lines()
        .filter(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.len() > 7 && f[6] == "UND" && f[3] == "FUNC" && u64::from_str_radix(f[1], 16) != Ok(0)
        })
        .count();
    assert!(canonical >= 2, "no canonical PLT stubs in {exe:?}");
    check(&exe, &[]);
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
    check(Path::new("/usr/bin/gzip"), &["-c", common::text_20k()]);
}

#[test]
fn debian_bzip2() {
    check(Path::new("/usr/bin/bzip2"), &["-c", common::text_20k()]);
}

/// Through the streaming comparison (`common::exact`), which `cargo bench
/// --bench exactness` runs on the issue's larger inputs: both modules
/// compared, every instruction of the trace matched.
#[test]
fn debian_bzip2_with_libbz2() {
    let bzip2 = Path::new("/usr/bin/bzip2");
    let args = ["-c", common::text_20k()];
    let (name, trace) = record_checked(bzip2, &args, &["libbz2.so.1.0"], Knobs::DEFAULT);
    let compared = common::exact::against_lackey(&trace, bzip2, &args)
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    assert!(compared.status.success());
    let counts: Vec<u64> = compared.modules.iter().map(|m| m.compared).collect();
    assert!(counts.iter().all(|&n| n > 0), "{name}: {counts:?}");
    assert_eq!(
        counts.iter().sum::<u64>(),
        instructions(&info_json(&trace)),
        "{name}"
    );
    let _ = std::fs::remove_file(&trace);
}

/// Executed instructions of every traced module, by `aetrace info`.
fn instructions(info: &serde_json::Value) -> u64 {
    info["instructions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_u64().unwrap())
        .sum()
}

/// The streaming comparison finds a difference: gzip's trace of one input
/// against lackey on the same text with one byte changed 15 kB in.
#[test]
fn streaming_comparison_reports_the_first_difference() {
    let gzip = Path::new("/usr/bin/gzip");
    let recorded = input("gzip-stream");
    let mut other = common::text_input(20_000);
    other[15_000] ^= 0x20;
    let other_path = common::scratch("inputs").join("trace-oracle-gzip-stream-other");
    std::fs::write(&other_path, other).unwrap();
    let (name, trace) = record_checked(gzip, &["-c", &recorded], &[], Knobs::DEFAULT);
    let e = match common::exact::against_lackey(
        &trace,
        gzip,
        &["-c", &other_path.display().to_string()],
    ) {
        Ok(c) => panic!("{name}: equal to lackey on another input: {:?}", c.modules),
        Err(e) => e,
    };
    assert!(
        e.contains("/usr/bin/gzip: first difference at instruction "),
        "{e}"
    );
    let _ = std::fs::remove_file(&trace);
}

/// Every procedure of both modules traced (xz alone, calling an untraced
/// library, is the case of gzip and sort): liblzma's range encoder (its
/// switch on a word compared through one address and read through
/// another), its 4-byte `lzma_index_stream_count` (springboard into the
/// fill after it), xz's switch on a 32-bit global. On the issue's 20 kB
/// input (31 M instructions in liblzma).
#[test]
fn debian_xz_with_liblzma() {
    let info = check_libs(
        Path::new("/usr/bin/xz"),
        &["-c", common::text_20k()],
        &["liblzma.so.5"],
        LogMode::Pipe,
    );
    for k in 0..2 {
        assert_eq!(left_alone(&info, k), Vec::<String>::new(), "program {k}");
    }
}

/// `traces/rc_switch.c`: liblzma's range-encoder switch (`cmpl $4,
/// 0x30(%rax,%rdx,4)` then `mov (%rax,%rcx,4)` with `rcx = rdx + 12`) and
/// a 4-byte procedure followed by alignment fill: both traced, exactly.
#[test]
fn switch_on_a_reloaded_word_and_a_4_byte_procedure() {
    for v in [O2_PIE, O0_NOPIE] {
        let info = check_libs(&build("rc_switch.c", v), &[], &[], LogMode::Pipe);
        assert_eq!(left_alone(&info, 0), Vec::<String>::new(), "{v:?}");
    }
}

/// Debian's xprop (x11-utils): a `.cold` part's CIE starts with the
/// registers its hot part saved, and the rows of the copy's stubs after
/// its last block drop them: written as `same_value` in the copy's FDE
/// (before, "register 3 loses its rule" refused the whole binary; node
/// and xwininfo too).
#[test]
fn debian_xprop_with_a_cold_part_cie() {
    check(Path::new("/usr/bin/xprop"), &["-version"]);
}

#[test]
fn debian_sort() {
    let p = common::scratch("inputs").join("trace-oracle-sort");
    // 2,000 lines: `data_real::debian_sort` compares every instruction of
    // 20,000 (with data); this one checks the control-only recording.
    std::fs::write(&p, sort_lines(2_000)).unwrap();
    // `-S`: without a buffer size, sort sizes its buffer from the free
    // memory of the moment, a branch that differs between our run and
    // lackey's (seen once in CI).
    check(
        Path::new("/usr/bin/sort"),
        &["-S", "64M", &p.display().to_string()],
    );
}

/// `--placement all-predicates` (old AE: a witness on every predicate
/// edge) and `naive-blocking` (the baselines of paper 003, section 4.2)
/// trace exactly too: each regenerates to lackey's instruction sequence,
/// so the bench's old-versus-new comparison (Table 3) compares exact
/// traces of the same run. All-predicates writes more than the optimal
/// placement (a check that the option took effect).
#[test]
fn the_baseline_placements_regenerate_exactly() {
    let gzip_input = common::text_20k();
    let programs = [
        (build("nested_if.c", O2_PIE), vec![]),
        (build("switch.c", O0_NOPIE), vec![]),
        (PathBuf::from("/usr/bin/gzip"), vec!["-c", gzip_input]),
    ];
    for (exe, args) in &programs {
        let optimal = check_recorded(exe, args, &[], LogMode::Pipe, Knobs::DEFAULT);
        for placement in ["all-predicates", "naive-blocking"] {
            let knobs = Knobs {
                placement: Some(placement),
                ..Knobs::DEFAULT
            };
            let info = check_recorded(exe, args, &[], LogMode::Pipe, knobs);
            if placement == "all-predicates" {
                assert!(
                    info["raw_bytes"].as_u64() > optimal["raw_bytes"].as_u64(),
                    "{}: all-predicates {} raw bytes, optimal {}",
                    exe.display(),
                    info["raw_bytes"],
                    optimal["raw_bytes"]
                );
            }
        }
    }
}

/// The workloads of issue 4 and `bench/record.sh`, at their sizes: gzip
/// and bzip2 (with libbz2) on 20 kB and 2 MB, xz with liblzma on 20 kB and
/// 2 MB, sort on 100,000 lines. Each recorded run's stdout, stderr and
/// status equal the native run's (the oracle), and its trace regenerates.
/// Instruction-level exactness against lackey is checked on the 20 kB
/// inputs above; on all of these inputs by `cargo bench --bench
/// exactness` (lackey alone took 72 minutes on xz's 4.65 billion
/// instructions: not a CI test).
#[test]
fn the_benchmark_workloads_record_with_their_native_output() {
    for w in issue_workloads() {
        let (_, trace) = record_checked(Path::new(w.exe), &w.args(), w.libs, Knobs::DEFAULT);
        aetrace_ok(&["regen", "--count"], &trace);
        let _ = std::fs::remove_file(&trace);
    }
}

#[test]
fn threads() {
    // One stream per thread; lackey's threads in creation order (its
    // thread ids), aetrace's in the order their streams appear.
    traced("threads.c", O2_PIE, &[]);
}

/// More threads over the run than the recorder has slots (256), never
/// more than five alive: `traces/many_threads.c` creates them in waves of
/// four and joins each wave. The recorder reclaims the slot of every
/// thread that has exited (before, thread 256 found no free slot and the
/// program stopped with status 125). 300 threads against lackey, thread
/// by thread; 1000 against the program's own output and count: one
/// thread per worker in `aetrace info`, each created by the main thread,
/// and `work` entered once per worker in the regenerated trace.
#[test]
fn threads_beyond_the_slot_count_reuse_the_slots_of_exited_threads() {
    let exe = build("many_threads.c", O2_PIE);
    check(&exe, &["300"]);
    let (name, trace) = record_checked(&exe, &["1000"], &[], Knobs::DEFAULT);
    let info = info_json(&trace);
    let threads = info["threads"].as_array().unwrap();
    assert_eq!(threads.len(), 1001, "{name}: threads in the trace");
    assert!(threads[0]["parent"].is_null(), "{name}: {}", threads[0]);
    for t in &threads[1..] {
        assert_eq!(t["start"], "thread", "{name}: {t}");
        assert_eq!(t["parent"], 0, "{name}: {t}");
        assert_eq!(t["end"], "exit", "{name}: {t}");
    }
    assert_eq!(info["regen_error"], serde_json::Value::Null, "{name}");
    assert_eq!(entries(&trace, &exe, "work"), 1000, "{name}");
    let _ = std::fs::remove_file(&trace);
}

/// A child forked inside libc (`daemon`, `traces/daemon.c`): its parent
/// exits at once and the child runs on in traced code on its parent's
/// slot, which has no thread or process any more. The recorder must not
/// reclaim it (when it did, the child's later output was lost: it wrote
/// through the reset cursor): the child's output is there as natively,
/// and its blocks follow
/// its parent's in the one stream (`work` entered twice).
#[test]
fn a_child_forked_outside_traced_code_keeps_its_parents_slot() {
    let exe = build("daemon.c", O2_PIE);
    let (name, trace) = record_checked(&exe, &[], &[], Knobs::DEFAULT);
    assert_eq!(entries(&trace, &exe, "work"), 2, "{name}");
    let _ = std::fs::remove_file(&trace);
}

#[test]
fn fork_child_continues_from_its_parent() {
    check_with(&build("fork.c", O2_PIE), &[], LogMode::PerProcessFiles);
}

/// `fork` through a wrapper that tail-jumps to it (`traces/fork_wrapper.c`,
/// as perl's `Perl_my_fork`): the wrapper's callers get `fork_child`
/// (before, each child ran on in its parent's stream and regen refused
/// the trace, or could have read the child's blocks as the parent's), and
/// each child longjmps to a jmp_buf its parent set before forking (the
/// child inherits the parent's setjmp bindings). -O0 calls `fork` and
/// returns: the plain case.
#[test]
fn fork_through_a_tail_jumping_wrapper() {
    check_with(
        &build("fork_wrapper.c", O2_PIE),
        &[],
        LogMode::PerProcessFiles,
    );
    check_with(
        &build("fork_wrapper.c", O0_NOPIE),
        &[],
        LogMode::PerProcessFiles,
    );
}

/// Traced `pthread_atfork` handlers: the child handler runs in the child
/// before fork returns there, still on its parent's slot; the runtime
/// claims the child's slot for it (before, it wrote into the parent's
/// stream and regen refused the trace: ENTER of `child` in `main`).
#[test]
fn atfork_handlers_write_into_their_own_process_stream() {
    check_with(&build("atfork.c", O2_PIE), &[], LogMode::PerProcessFiles);
    check_with(&build("atfork.c", O0_NOPIE), &[], LogMode::PerProcessFiles);
}

/// `--libs libc.so.6`: the executable and libc both equal, instruction
/// for instruction, to the native run single-stepped under ptrace (libc's
/// procedures left alone, named by `aetrace info`, taken out of its side):
/// qsort calling back into the program, handlers run by `raise`
/// (libc's restorer is left alone: it sits in `__libc_sigaction`'s range
/// as a second entry point without a free register), setjmp/longjmp
/// (libc's `__sigjmp_save`, traced, called from its untraced `_setjmp`),
/// atexit handlers run by `exit` from deep frames, and gzip.
/// Every import call of the executable is marked when glibc is traced
/// (before, 2026-11-30, regen stopped at the ENTER of a libc function the
/// executable called as a callback-free import: setjmp.c, exit_nested.c,
/// gzip). libc's fork family is traced: `traces/fork.c` in
/// [`libc_so_fork_traced`]. Not lackey: valgrind's preloaded
/// `vgpreload_core` calls libc's `__cxa_finalize` from its own destructor
/// at exit, which a native run never does (lackey's libc stream had one
/// more `__cxa_finalize` than ours, loops.c, 2026-11-30).
#[test]
fn libc_so_traced() {
    let sources = ["qsort_callback.c", "signal.c", "setjmp.c", "exit_nested.c"];
    for source in sources {
        libc_so_against_stepped(&build(source, O2_PIE), &[]);
    }
}

/// [`libc_so_traced`] for gzip on 200 bytes of text: every instruction of
/// the run is single-stepped (20 kB took 3.0 M steps and 62 CPU s; 200
/// bytes, 102 k traced instructions, 1.7 k of them libc's, as many as 20 kB).
#[test]
fn libc_so_traced_gzip() {
    let input = common::scratch("libc-so-gzip").join("text-200");
    std::fs::write(&input, common::text_input(200)).unwrap();
    libc_so_against_stepped(Path::new("/usr/bin/gzip"), &["-c", input.to_str().unwrap()]);
}

/// [`libc_so_traced`] for sort on 30 lines, a program that can start
/// threads (it imports `pthread_create`; before, `--libs libc.so.6` was
/// refused for it): 174 k instructions single-stepped, 143 k of them
/// libc's (locale set-up).
#[test]
fn libc_so_traced_sort() {
    let input = common::scratch("libc-so-sort").join("lines-30");
    std::fs::write(&input, sort_lines(30)).unwrap();
    libc_so_against_stepped(Path::new("/usr/bin/sort"), &[input.to_str().unwrap()]);
}

/// The single-stepped oracle gives the program its environment in the
/// order given, the order a recorded run inherits (before, std's
/// `Command` sorted it by name: `libc_so_traced_sort` run from a shell
/// differed in libc's `getenv`, which scans the array in order).
#[test]
fn stepped_environment_in_its_order() {
    let env = [("ZZ_FIRST", "1"), ("AA_SECOND", "2"), ("MM_THIRD", "3")];
    let env: Vec<(String, String)> = (env.iter())
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let run = common::singlestep::run(Path::new("/usr/bin/env"), None, &[], &env);
    assert_eq!(run.status, 0);
    assert_eq!(
        String::from_utf8_lossy(&run.stdout),
        "ZZ_FIRST=1\nAA_SECOND=2\nMM_THIRD=3\n"
    );
}

/// `exe args` recorded with `--libs libc.so.6` (its output and status the
/// native ones), libc's fork family and the code ld.so runs before the
/// runtime's init (`__libc_early_init` with what it calls, the IFUNC
/// resolvers) traced, and both modules equal to the native run stepped
/// (that code's instructions before the runtime's init, which ran
/// untraced, apart).
fn libc_so_against_stepped(exe: &Path, args: &[&str]) {
    let (name, info, counts) = libc_so_first_against_stepped(exe, args, 0);
    assert_eq!(counts.iter().sum::<u64>(), instructions(&info), "{name}");
}

/// [`libc_so_against_stepped`] of the first process's main thread, with
/// `others` more streams (threads, processes) that must regenerate but
/// are not compared: the trace's info and each module's count.
fn libc_so_first_against_stepped(
    exe: &Path,
    args: &[&str],
    others: usize,
) -> (String, serde_json::Value, Vec<u64>) {
    let env: Vec<(String, String)> = std::env::vars().collect();
    let (name, trace) = record_checked(exe, args, &["libc.so.6"], Knobs::FIXED);
    let info = info_json(&trace);
    let untraced = left_alone(&info, 1)
        .into_iter()
        .filter(|l| l.contains("fork") || l.contains("ld.so runs") || l.contains("IFUNC resolver"));
    assert_eq!(
        untraced.count(),
        0,
        "{name}: libc's fork family and early code are traced"
    );
    let (compared, _) = common::exact::against_stepped(&trace, exe, exe, args, &env)
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    let counts: Vec<u64> = compared.modules.iter().map(|m| m.compared).collect();
    assert!(
        counts.len() == 2 && counts.iter().all(|&n| n > 0),
        "{name}: {counts:?}"
    );
    let early = compared.modules[1].before_init;
    assert!(early > 0, "{name}: ld.so ran libc's early code");
    let streams = common::exact::regen_tasks(&trace);
    assert_eq!(streams.len(), 1 + others, "{name}: streams");
    eprintln!(
        "{name}: {counts:?} instructions equal (executable, libc); \
         {early} of libc's before the runtime's init"
    );
    let _ = std::fs::remove_file(&trace);
    (name, info, counts)
}

/// `traces/spawn.c` with `--libs libc.so.6`: `posix_spawn` and `system()`
/// reach libc.so.6's traced `__clone3` (CLONE_VM|CLONE_VFORK), whose
/// child claims its FORK slot right after the system call (before, it
/// wrote DESYNC into its parent's stream there, and regen stopped). The
/// parent, both modules, against its stepped run; then every task, its
/// three children up to their `execve` (or `_exit(127)` when it fails),
/// each against its task stepped natively (before, 2026-12-01, the
/// children were not compared: single-stepped, a child found SIGTRAP
/// unblocked, `static_posix_spawn_and_system`). The execs of `/bin/true`
/// and `/bin/sh` are followed (`docs/runtime.md` section 7, "exec"):
/// each image, its program and libc, against that program stepped
/// natively.
#[test]
fn libc_so_posix_spawn_and_system() {
    let exe = build("spawn.c", O2_PIE);
    libc_so_first_against_stepped(&exe, &[], 3);
    tasks_against_stepped_with(&exe, (&[], &["libc.so.6"]), (4, SPAWNED), Knobs::FIXED);
}

/// `traces/spawn.c`, libc untraced: `posix_spawn` runs its exec in the
/// child, inside libc; the call of `posix_spawn@plt` asks the recorder
/// first and gives libc the copy's path (`docs/runtime.md` section 7,
/// "exec"). The exec of `/bin/true` is followed, its image against
/// `/bin/true` stepped natively; the missing program fails natively
/// (ENOENT, output checked by `record_checked`); `system()`'s shell is
/// followed too (the runtime's `shell_call`, since 2026-12-01; before,
/// nothing at its call named the shell). Before (2026-12-01) no image
/// was followed.
#[test]
fn posix_spawn_followed_with_libc_untraced() {
    let exe = build("spawn.c", O2_PIE);
    tasks_against_stepped_with(&exe, (&[], &[]), (1, SPAWNED), Knobs::FIXED);
}

/// `traces/system.c`, libc untraced: each `system` call is made by the
/// runtime's `shell_call` (glibc 2.36's semantics, `posix_spawn` of the
/// followed shell), so the shell and what it runs are followed: the
/// output and exit status native (`record_checked`), the `/bin/echo` the
/// first shell execs against `/bin/echo` stepped natively; the shells
/// (dash, whose start-up follows its parent's pid) counted. The first
/// call goes through the unbound PLT slot, which the runtime binds as
/// ld.so would (the regenerated main task against its native run says
/// the lazy path is walked once, as natively).
#[test]
fn system_followed_with_libc_untraced() {
    let exe = build("system.c", O2_PIE);
    let echo: Followed = Some(("/bin/echo", "/bin/echo", &["from", "the", "shell"]));
    let followed = [None, echo, None, None, None];
    tasks_against_stepped_with(&exe, (&[], &[]), (1, &followed), Knobs::FIXED);
}

/// `traces/popen.c`, libc untraced: each `popen` is made by the
/// runtime's `shell_call` (glibc 2.36's `popen`, `posix_spawn` of the
/// followed shell with the pipe's end as its stdout or stdin) and each
/// `pclose` of such a stream waits for its child there: the output
/// (read through "r", written through "w" to `cat`, two "w" streams at
/// once: the second child holding the first's pipe would hang the first
/// `pclose`), the statuses (0, `exit 3`, a missing command's 127) and
/// the invalid mode's EINVAL native (`record_checked`); the `/bin/echo`
/// the first shell execs against `/bin/echo` stepped natively; the
/// shells and the `cat`s (which read the pipe, which a stepped run would
/// not give them) counted. The first `popen` and `pclose` go through
/// their unbound PLT slots, which the runtime binds as ld.so would.
#[test]
fn popen_followed_with_libc_untraced() {
    let exe = build("popen.c", O2_PIE);
    let echo: Followed = Some(("/bin/echo", "/bin/echo", &["from", "the", "shell"]));
    let followed = [None, echo, None, None, None, None, None, None];
    tasks_against_stepped_with(&exe, (&[], &[]), (1, &followed), Knobs::FIXED);
}

/// `traces/spawnp.c`, libc untraced: `posix_spawnp`'s PATH search,
/// `posix_spawn` of a relative name after a `chdir` file action, and of
/// a `#!` script whose interpreter is `/bin/true` (the kernel's argv:
/// interpreter, script, the rest) are followed, each image against
/// `/bin/true` stepped natively with that argv; a name on no PATH entry
/// and a file that is not executable fail natively (ENOENT, EACCES:
/// the output, checked by `record_checked`).
#[test]
fn posix_spawnp_and_file_actions_followed() {
    let dir = common::scratch("spawnp");
    let script = dir.join(format!("true-script-{}", std::process::id()));
    std::fs::write(&script, "#!/bin/true\n").unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let script = script.to_str().unwrap();
    let exe = build("spawnp.c", O2_PIE);
    let followed: &[Followed] = &[
        Some(("/bin/true", "true", &["x"])),
        Some(("/bin/true", "./true", &["x"])),
        Some(("/bin/true", "/bin/true", &[script, "x"])),
    ];
    tasks_against_stepped_with(&exe, (&[script], &[]), (1, followed), Knobs::FIXED);
    let _ = std::fs::remove_file(script);
}

/// A program a followed exec ran: its path, `argv[0]` and arguments;
/// `None` for an image whose path depends on the process's ids, counted
/// but not compared with a second run.
type Followed<'a> = Option<(&'a str, &'a str, &'a [&'a str])>;

/// What `traces/spawn.c`'s children exec (the first exec fails). dash
/// formats its parent's pid into `PPID` at start-up, so its instructions
/// follow the pid's number of digits, which a second (stepped) run need
/// not share (this test failed on it now and then): its image is
/// counted, not compared.
const SPAWNED: &[Followed] = &[Some(("/bin/true", "/bin/true", &[])), None];

/// Each image of `trace` a followed exec started, in the order of its
/// thread, against the program of `followed` stepped natively with
/// `env`: every traced module of the image.
fn followed_against_stepped(
    name: &str,
    trace: &Path,
    followed: &[Followed],
    env: &[(String, String)],
) {
    let info = info_json(trace);
    let threads = info["threads"].as_array().unwrap().iter();
    let execs: Vec<usize> = (threads.enumerate())
        .filter(|(_, t)| t["start"] == "exec")
        .map(|(k, _)| k)
        .collect();
    assert_eq!(execs.len(), followed.len(), "{name}: followed images");
    let compared = execs.iter().zip(followed);
    for (&t, &(program, argv0, args)) in compared.filter_map(|(t, f)| Some((t, f.as_ref()?))) {
        let how = (Path::new(argv0), args, env);
        let (compared, _) =
            common::exact::thread_against_stepped(trace, t, Path::new(program), how)
                .unwrap_or_else(|e| panic!("{name} thread {t} ({program}): {e}"));
        let counts: Vec<u64> = compared.modules.iter().map(|m| m.compared).collect();
        assert!(
            !counts.is_empty() && counts.iter().all(|&n| n > 0),
            "{name} thread {t} ({program}): {counts:?}"
        );
        eprintln!("{name} thread {t} ({program}): {counts:?} instructions equal");
    }
}

/// `--libs libc.so.6` on `traces/fork.c`: libc's fork family traced, the
/// child claims its slot right after `_Fork`'s system call, inside libc
/// (the executable's call of the `fork` import gets no `fork_child`).
/// Parent and child, each module, equal to their processes stepped
/// natively (before, 2026-11-30, the family and its 266-procedure closure
/// ran untraced, and regen stopped at the executable's LAZY of `fork@plt`).
#[test]
fn libc_so_fork_traced() {
    let env: Vec<(String, String)> = std::env::vars().collect();
    let exe = build("fork.c", O2_PIE);
    let (name, trace) = record_checked(&exe, &[], &["libc.so.6"], Knobs::FIXED);
    let info = info_json(&trace);
    let forks = left_alone(&info, 1)
        .into_iter()
        .filter(|l| l.contains("fork"));
    assert_eq!(forks.count(), 0, "{name}: libc's fork family is traced");
    let compared = common::exact::against_stepped_processes(&trace, &exe, &[], &env, 2)
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    let counts: Vec<Vec<u64>> = (compared.iter())
        .map(|c| c.modules.iter().map(|m| m.compared).collect())
        .collect();
    assert!(
        counts.iter().flatten().all(|&n| n > 0) && counts.iter().all(|c| c.len() == 2),
        "{name}: {counts:?}"
    );
    let total: u64 = counts.iter().flatten().sum();
    assert_eq!(total, instructions(&info), "{name}");
    eprintln!("{name}: {counts:?} instructions equal (per process: executable, libc)");
    let _ = std::fs::remove_file(&trace);
}

/// `--libs libc.so.6` on `traces/threads_gated.c`: libc.so.6's traced
/// `__clone3` starts each thread, which claims its slot right after the
/// system call (its FDE ends before the `syscall`, which splits the block
/// from the one loading the number: before, the new thread wrote DESYNC
/// into its creator's stream there and regen stopped), runs the worker and
/// exits through libc's traced `start_thread`. Every thread, both
/// modules, equal to its task stepped natively (`pthread_join`'s waits,
/// which depend on the scheduling, left out of the main thread's as in
/// `static_threads`).
#[test]
fn libc_so_threads() {
    let env: Vec<(String, String)> = std::env::vars().collect();
    let exe = build("threads_gated.c", O2_PIE);
    let (name, trace) = record_checked(&exe, &[], &["libc.so.6"], Knobs::FIXED);
    let (stepped, status) = common::exact::stepped_tasks(&trace, &exe, &[], &env);
    assert!(status.success(), "{name}: the stepped run: {status}");
    let ours = common::exact::regen_tasks(&trace);
    assert_eq!((stepped.len(), ours.len()), (4, 4), "{name}: tasks");
    let join = plt_stub(&exe, "pthread_join")[0].0;
    // One sequence of numbers per task: the module above the offset.
    let flat = |s: &[(usize, u64)]| -> Vec<u64> {
        let v: Vec<u64> = s.iter().map(|&(m, off)| (m as u64) << 48 | off).collect();
        without_calls_to(&v, join)
    };
    for (k, ((_, native), (_, regen))) in stepped.iter().zip(&ours).enumerate() {
        let in_libc = |s: &[(usize, u64)]| s.iter().filter(|i| i.0 == 1).count();
        assert!(in_libc(regen) > 0, "{name} thread {k}: no libc instruction");
        if let Some(d) = first_difference(&flat(native), &flat(regen)) {
            panic!("{name} thread {k} (expected: the stepped run): {d}");
        }
        eprintln!("{name} thread {k}: {} instructions equal", regen.len());
    }
    let _ = std::fs::remove_file(&trace);
}

/// Each task of `exe ARGS` recorded (`--libs LIBS`) against the same task
/// single-stepped natively, every traced module: `tasks` of them.
fn tasks_against_stepped(exe: &Path, args: &[&str], libs: &[&str], tasks: usize) {
    tasks_against_stepped_with(exe, (args, libs), (tasks, &[]), Knobs::DEFAULT)
}

/// [`tasks_against_stepped`], recorded with `knobs`; the images its
/// followed execs started against `followed` ([`followed_against_stepped`]).
fn tasks_against_stepped_with(
    exe: &Path,
    (args, libs): (&[&str], &[&str]),
    (tasks, followed): (usize, &[Followed]),
    knobs: Knobs,
) {
    let env: Vec<(String, String)> = std::env::vars().collect();
    let (name, trace) = record_checked(exe, args, libs, knobs);
    let name = format!("{name} {args:?} --libs {libs:?}");
    let (mut stepped, status) = common::exact::stepped_tasks(&trace, exe, args, &env);
    assert!(status.success(), "{name}: the stepped run: {status}");
    // A task that runs no traced instruction before its exec (a spawn
    // child inside an untraced libc) claims no slot: no stream.
    stepped.retain(|(_, s)| !s.is_empty());
    let ours = common::exact::regen_tasks(&trace);
    assert_eq!((stepped.len(), ours.len()), (tasks, tasks), "{name}: tasks");
    let flat = |s: &[(usize, u64)]| -> Vec<u64> {
        s.iter().map(|&(m, off)| (m as u64) << 48 | off).collect()
    };
    for (k, ((_, native), (_, regen))) in stepped.iter().zip(&ours).enumerate() {
        if let Some(d) = first_difference(&flat(native), &flat(regen)) {
            panic!("{name} task {k} (expected: the stepped run): {d}");
        }
        eprintln!("{name} task {k}: {} instructions equal", regen.len());
    }
    followed_against_stepped(&name, &trace, followed, &env);
    let _ = std::fs::remove_file(&trace);
}

/// `traces/raw_clone.c`: tasks the clone system call makes without
/// `pthread_create` or `fork()` (docs/rewrite.md, "System calls"). A
/// process made through libc's `syscall()` (SYS_fork; SYS_clone with
/// SIGCHLD and no stack; SYS_clone3 likewise) returns where its parent
/// does and claims its own slot there: at the return point of the
/// executable's call of `syscall@plt` (libc untraced), or, with
/// `--libs libc.so.6`, right after the system call inside libc's traced
/// `syscall()`, whose number is known only at run time. Before
/// (2026-12-01) the child wrote into its parent's stream and regen
/// refused the parent ("RETURN ... cannot occur"), or, libc traced, the
/// parent's stream said DESYNC there. A thread made by inline `syscall`
/// instructions claims its slot right after them (as before). A thread
/// that libc's `syscall()` starts on a stack of its own (`clone`,
/// `clone3`: SYS_clone, SYS_clone3 with CLONE_VM|CLONE_THREAD|... and no
/// TLS of its own) returns into `child`, which its creator put on that
/// stack: libc untraced, its creator marks its slot before the call and
/// the thread claims its own at `child`'s outside entry; libc traced, it
/// claims its slot right after the system call and enters `syscall()`
/// at its return point (ENTER_AT), no frame of its creator's below.
/// Before (2026-12-01) both stopped regen at a DESYNC. Each task
/// against its task stepped natively.
#[test]
fn raw_clone_tasks() {
    let exe = build("raw_clone.c", O2_PIE);
    for how in [
        "asm",
        "clone",
        "clone3",
        "fork",
        "clone-fork",
        "clone3-fork",
    ] {
        tasks_against_stepped(&exe, &[how], &[], 2);
    }
    for how in ["clone", "clone3", "clone-fork", "clone3-fork"] {
        tasks_against_stepped(&exe, &[how], &["libc.so.6"], 2);
    }
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

/// A SETJMP that is the first record of a procedure follows its caller's
/// call at once: regen must bind it at the setjmp's own call, not at the
/// caller's (before, the longjmp resumed in `main`: perl's traces failed,
/// each of four scripts tried, at its exit, `__longjmp_chk` back into `perl_run`).
#[test]
fn setjmp_first_in_a_callee() {
    traced("setjmp_callee.c", O2_PIE, &[]);
    traced("setjmp_callee.c", O0_NOPIE, &[]);
}

/// Untraced code entering a traced procedure by a jump, with a zero where
/// a return address would be: the outside-entry stub must not read through
/// `[rsp]` (before, the recorded program died of SIGSEGV in the stub's
/// signal-handler test; python3.11 did, each time it was recorded).
#[test]
fn jump_into_a_traced_procedure_from_outside() {
    traced("outside_jump.c", O2_PIE, &[]);
    // Not stripped: `finish`, only ever reached through a data word, is
    // then found by its symbol.
    traced(
        "outside_jump.c",
        Variant::new(Opt::O0, Link::NoPie, false),
        &[],
    );
}

#[test]
fn setjmp_longjmp() {
    traced("setjmp.c", O2_PIE, &[]);
    traced("setjmp.c", O0_NOPIE, &[]);
}

/// A longjmp made where no traced code writes a record: glibc's forced
/// unwind of `pthread_exit` and of a cancellation, which `longjmp`s into
/// each level of a recursion of C cleanup handlers (`__sigsetjmp` in
/// `pthread_cleanup_push`) from inside libc; and one out of `qsort`'s
/// comparator, by name or through a pointer, to the level of a recursion
/// whose every level set a jmp_buf at the same setjmp call. Each setjmp
/// call's second return writes SETJMP_RESUME (call, rsp). Before, regen
/// refused both programs ("witness ... cannot occur while untraced code
/// runs"), 2026-11-29.
/// A trace whose header says format 1.9 has SETJMP records naming
/// jmp_bufs: refused at the first one, in one line naming the version.
#[test]
fn setjmp_records_of_an_older_format_are_refused() {
    let exe = build("setjmp.c", O2_PIE);
    let (_, recorded, _) = record_ok(&exe, &[], &[], Knobs::DEFAULT);
    let trace = common::scratch("trace_oracle").join("setjmp-minor9.aet");
    let mut bytes = std::fs::read(&recorded).unwrap();
    bytes[10..12].copy_from_slice(&9u16.to_le_bytes());
    let crc = crc32fast::hash(&bytes[..60]);
    bytes[60..64].copy_from_slice(&crc.to_le_bytes());
    std::fs::write(&trace, bytes).unwrap();
    let out = Command::new(common::aetrace())
        .args(["regen", "--format", "insn"])
        .arg(&trace)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("SETJMP(") && err.contains("before format 1.10"),
        "{err}"
    );
}

#[test]
fn setjmp_resumed_by_a_longjmp_inside_untraced_code() {
    for v in [Variant::new(Opt::O1, Link::Pie, false), O0_NOPIE] {
        traced("pthread_cleanup.c", v, &[]);
        traced("longjmp_untraced.c", v, &[]);
    }
}

#[test]
fn exec_ends_the_traced_process_cleanly() {
    // argv[0] is the original program: the recorder follows the exec
    // (docs/runtime.md section 7, "exec"), so the new image is traced in
    // a stream of its own, started by the exec, with the same program;
    // the trace is complete, with the new image's exit status 3. (Each
    // image against lackey: `transparency::a_traced_program_execvps_*`.)
    let exe = build("exec.c", O2_PIE);
    let trace = common::scratch("trace-oracle").join(format!("exec-{}.aet", std::process::id()));
    let st = Command::new(common::aetrace())
        .arg("record")
        .arg("-o")
        .arg(&trace)
        .arg("--")
        .arg(&exe)
        .stdout(std::process::Stdio::null())
        .status()
        .unwrap();
    assert_eq!(st.code(), Some(3));
    let info = Command::new(common::aetrace())
        .args(["info"])
        .arg(&trace)
        .output()
        .unwrap();
    let info = String::from_utf8_lossy(&info.stdout);
    assert!(info.contains(": complete"), "{info}");
    assert!(info.contains("exited with status 3"), "{info}");
    let json = info_json(&trace);
    let threads = json["threads"].as_array().unwrap();
    let ends: Vec<_> = (threads.iter())
        .map(|t| (t["start"].as_str().unwrap(), t["end"].as_str().unwrap()))
        .collect();
    assert_eq!(ends, [("main", "exec"), ("exec", "exit")], "{info}");
    let real = exe.canonicalize().unwrap();
    assert_eq!(instrumented_modules(&json), [real.clone(), real], "{info}");
    common::regen::count(&trace);
    let _ = std::fs::remove_file(&trace);
}

/// A program that execs its own image (`traces/exec_lib.c`), whose new
/// image loads a `--libs` library (`libaeexec.so.1`, by `dlopen`), with
/// (`both`) and without the first image loading it too: each image's
/// stream (thread 0 the first, thread 1 the exec'd) equals lackey's run of
/// that image's arguments (lackey cannot follow an exec of
/// `/proc/self/exe`, see `debug.rs`'s `exec_streams_against_lackey`),
/// instruction for instruction, in the executable and in the library,
/// each selected by `regen --module`; without `--thread` the library's
/// trace is both images' in stream order. Four lackey runs of a few
/// hundred to ten thousand instructions: 5.1 s at load 15 (2026-11-30).
#[test]
fn an_exec_d_image_traces_its_libraries() {
    let exe = build_dlopening("exec_lib", "libaeexec.so.1");
    let lib = exe.parent().unwrap().join("libaeexec.so.1");
    let modules = [exe.clone(), lib];
    for first in [&["both"][..], &[]] {
        let (name, trace, rec) = record_run(&exe, first, &["libaeexec.so.1"], Knobs::DEFAULT);
        let native = run_native(&exe, first);
        assert_same_run(&name, &rec, &native.stdout, &native.stderr, Some(3));
        let mut whole = Vec::new();
        for (thread, args) in [("0", first), ("1", &["again"][..])] {
            // Lackey fails a run that never maps one of its modules.
            let loaded = &modules[..if args.is_empty() { 1 } else { 2 }];
            let run = lackey::run_with(&exe, args, loaded, LogMode::Pipe, Capture::Sequences);
            for (k, module) in modules.iter().enumerate() {
                let Some(lk) = run.modules.get(k) else {
                    let none =
                        regen_addresses(&trace, Some(thread), &["--module", "libaeexec.so.1"]);
                    assert!(none.is_empty(), "{name}: thread {thread} ran the library");
                    continue;
                };
                let seqs = &lk.sequences;
                assert!(
                    seqs.len() <= 1,
                    "lackey {args:?}: threads {:?}",
                    seqs.keys()
                );
                let lk: Vec<u64> = seqs.values().flatten().copied().collect();
                let only = ["--module", module.to_str().unwrap()];
                let rg = regen_addresses(&trace, Some(thread), &only);
                assert!(
                    lk == rg,
                    "{name}: thread {thread}, {} against lackey {args:?}: {}",
                    module.display(),
                    first_difference(&lk, &rg).unwrap_or_default()
                );
                if k == 1 {
                    whole.extend(rg);
                }
            }
        }
        assert!(!whole.is_empty(), "{name}: the library ran in no image");
        let lib_only = ["--module", "libaeexec.so.1"];
        assert_eq!(regen_addresses(&trace, None, &lib_only), whole, "{name}");
        let _ = std::fs::remove_file(&trace);
    }
}

/// `aetrace regen --format insn --relative ARGS` of `thread` (all when
/// `None`): its addresses.
fn regen_addresses(trace: &Path, thread: Option<&str>, args: &[&str]) -> Vec<u64> {
    let mut all = vec!["--format", "insn", "--relative"];
    if let Some(t) = thread {
        all.extend(["--thread", t]);
    }
    all.extend(args);
    common::regen::addresses(trace, &all)
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

/// Builds `traces/shlib_callback.c` against its own shared library
/// (`traces/shlib_callback_lib.c` as `libaecb.so.1`, found through an
/// absolute DT_RUNPATH, or with `origin` through `$ORIGIN`, as the loader
/// would).
fn build_shlib_callback(origin: bool) -> PathBuf {
    build_with_lib("shlib_callback", "libaecb.so.1", origin)
}

#[test]
fn shared_library_calling_back_into_the_program() {
    let exe = build_shlib_callback(false);
    check_libs(&exe, &["300"], &["libaecb.so.1"], LogMode::Pipe);
    // `all`: every library but ld.so (left alone with a note), libc
    // included: the executable and the library equal to lackey, and
    // libc's stream regenerated (before, 2026-11-30, regen stopped at the
    // ENTER of `malloc` after an import call of `main`).
    let info = check_libs(&exe, &["50"], &["all"], LogMode::Pipe);
    let modules = instrumented_modules(&info);
    assert!(
        modules.iter().any(|m| m.ends_with("libc.so.6")),
        "all: libc.so.6 traced: {modules:?}"
    );
}

/// The rewritten executable runs from the cache, so its `$ORIGIN` moves:
/// an untraced library found through a `$ORIGIN` DT_RUNPATH is linked into
/// the per-run library directory, under its name, and still loads.
#[test]
fn libraries_found_through_origin_still_load() {
    let exe = build_shlib_callback(true);
    check_libs(&exe, &["40"], &[], LogMode::Pipe);
    check_libs(&exe, &["40"], &["libaecb.so.1"], LogMode::Pipe);
}

/// C++ exceptions thrown from a traced libstdc++ (`__cxa_throw` and the
/// `std::__throw_*` helpers run in its copies), whose personality routine
/// runs traced too: the copies' FDEs name the wrapper personality
/// (`rewrite::personality`), which shows it the original return address,
/// LSDA and region start, so its walk of each call-site table is the
/// native one; equal to lackey instruction for instruction, executable
/// and libstdc++ (before the wrapper, 2026-11-29: libstdc++ ran 8,240
/// instructions against lackey's 7,970).
#[test]
fn cxx_exceptions_through_a_traced_libstdcxx() {
    let exe = build(
        "cxx_exceptions.cpp",
        Variant::new(Opt::O2, Link::Pie, false),
    );
    check_libs(&exe, &[], &["libstdc++.so.6"], LogMode::Pipe);
}

/// C++ exceptions thrown by the program's callbacks unwind through a
/// traced library's copies (`traces/cxx_callback.cpp` with
/// `cxx_callback_lib.cpp` as `libaecxx.so.1`: cleanups and a
/// catch-and-rethrow in the library). The library is detached (its
/// additions in no `PT_LOAD`, `DT_ADDITIONS` in its `.dynamic`), so
/// libgcc finds the copies' FDEs only through the `.eh_frame` the
/// executable's runtime registers (`__register_frame_info`); equal to
/// lackey instruction for instruction, executable and library.
#[test]
fn cxx_exceptions_through_a_detached_library() {
    let exe = build_with_lib("cxx_callback", "libaecxx.so.1", false);
    check_libs(&exe, &["5"], &["libaecxx.so.1"], LogMode::Pipe);
    // Detached: binutils' readelf finds the tag in the rewritten copy.
    let copy = rewritten_library(&exe, "libaecxx.so.1");
    let dynamic = Command::new("readelf")
        .arg("-d")
        .arg(&copy)
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&dynamic.stdout).contains("0x000000006ae70001"),
        "{} is not detached",
        copy.display()
    );
}

/// Records `exe` with `--libs soname` into a cache next to it; the
/// rewritten library there.
fn rewritten_library(exe: &Path, soname: &str) -> PathBuf {
    let dir = exe.parent().unwrap();
    let cache = dir.join("cache");
    let st = Command::new(common::aetrace())
        .env("AETRACE_CACHE", &cache)
        .arg("record")
        .arg("-o")
        .arg(dir.join("t.aet"))
        .args(["--libs", soname, "--"])
        .arg(exe)
        .output()
        .unwrap();
    assert!(
        st.status.success(),
        "{}",
        String::from_utf8_lossy(&st.stderr)
    );
    std::fs::read_dir(&cache)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| {
            let n = p.file_name().unwrap().to_string_lossy();
            n.starts_with(&format!("{soname}-")) && !n.ends_with(".meta")
        })
        .expect("the rewritten library is cached")
}

/// A rewritten library loaded by an executable that is not instrumented
/// (what a traced program's uninstrumented child would meet through the
/// inherited `LD_LIBRARY_PATH`) has no runtime to attach to: it stops at
/// its first traced code, never running untraced or writing a wrong
/// stream. A library loaded at start-up has detached additions
/// (`docs/runtime.md` section 5), which only the executable's runtime
/// maps: its first springboard faults (SIGSEGV). A library with attached
/// ones (dlopened) stops with a message and status 125.
#[test]
fn a_traced_library_without_a_traced_executable_stops_clearly() {
    let exe = build_shlib_callback(false);
    let dir = exe.parent().unwrap();
    let copy = rewritten_library(&exe, "libaecb.so.1");
    let libdir = dir.join("rewritten");
    std::fs::create_dir_all(&libdir).unwrap();
    let link = libdir.join("libaecb.so.1");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(&copy, &link).unwrap();
    let out = Command::new(&exe)
        .env("LD_LIBRARY_PATH", &libdir)
        .env("AETRACE_OUT", dir.join("standalone.out"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(out.status.signal(), Some(11), "stderr {stderr}");
    assert!(out.stdout.is_empty(), "it ran untraced: {:?}", out.stdout);
}

/// Builds `traces/dlopen.c` and its library `traces/dlopen_lib.c` as
/// `libaedl.so.1` ([`build_dlopening`]). Built once per test process: two
/// tests use it, and one test's `gcc` rewriting the executable while the
/// other runs it fails with "Text file busy".
fn build_dlopen() -> PathBuf {
    static EXE: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    EXE.get_or_init(|| build_dlopening("dlopen", "libaedl.so.1"))
        .clone()
}

/// Builds `traces/<name>.c` and its library `traces/<name>_lib.c` as
/// `soname`, which the program does not link: it opens it with
/// `dlopen(soname)`, found through the executable's DT_RUNPATH.
fn build_dlopening(name: &str, soname: &str) -> PathBuf {
    let dir = common::scratch("trace-oracle-builds").join(format!("{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let traces = common::repo_root().join("traces");
    let st = Command::new("gcc")
        .args(["-O2", "-shared", "-fPIC"])
        .arg(format!("-Wl,-soname,{soname}"))
        .arg("-o")
        .arg(dir.join(soname))
        .arg(traces.join(format!("{name}_lib.c")))
        .status()
        .unwrap();
    assert!(st.success(), "gcc -shared {name}_lib.c");
    let exe = dir.join(name);
    let st = Command::new("gcc")
        .args(["-O2", "-o"])
        .arg(&exe)
        .arg(traces.join(format!("{name}.c")))
        .arg(format!("-Wl,-rpath,{}", dir.display()))
        .status()
        .unwrap();
    assert!(st.success(), "gcc {name}.c");
    exe
}

/// A library loaded by `dlopen` (named in `--libs`, not in the DT_NEEDED
/// closure): its constructor, functions found with `dlsym`, a callback into
/// the program, its destructor at `dlclose`, then a second `dlopen` (at the
/// same address): equal to lackey in both modules.
#[test]
fn dlopened_library_closed_and_opened_again() {
    let exe = build_dlopen();
    let native = run_native(&exe, &[]);
    assert!(
        String::from_utf8_lossy(&native.stdout).contains("second load at the same address"),
        "the test expects the second dlopen at the first one's address"
    );
    check_libs(&exe, &[], &["libaedl.so.1"], LogMode::Pipe);
}

/// A second `dlopen` that maps the library at another address stops the
/// program with a message (the trace has one load address per module);
/// a dlopened library named by a path, which `dlopen` of that path would
/// load without searching, is refused before the run.
#[test]
fn dlopened_library_at_a_second_address_or_by_path_is_refused() {
    let exe = build_dlopen();
    let native = run_native(&exe, &["move"]);
    assert!(
        String::from_utf8_lossy(&native.stdout).contains("second load moved"),
        "natively the second load moves"
    );
    let trace = exe.with_extension("move.aet");
    exits_with(
        Command::new(common::aetrace())
            .arg("record")
            .arg("-o")
            .arg(&trace)
            .args(["--libs", "libaedl.so.1", "--"])
            .arg(&exe)
            .arg("move"),
        125,
        &["library was loaded again at another address"],
    );
    // Everything before the second load regenerates.
    aetrace_ok(&["regen", "--count"], &trace);
    let lib = exe.parent().unwrap().join("libaedl.so.1");
    exits_with(
        Command::new(common::aetrace())
            .arg("record")
            .arg("-o")
            .arg(&trace)
            .arg("--libs")
            .arg(&lib)
            .arg("--")
            .arg(&exe),
        1,
        &["a dlopen of a path bypasses the loader's search"],
    );
    // Profiling lost the second load's counts: refused.
    exits_with(
        Command::new(common::aetrace())
            .arg("profile")
            .arg("-o")
            .arg(exe.with_extension("aprof"))
            .args(["--libs", "libaedl.so.1", "--"])
            .arg(&exe),
        1,
        &["libraries loaded by dlopen are traced by `aetrace record`, not profiled"],
    );
}

/// `--libs all` on Debian's zstd (libz, liblzma and liblz4 besides glibc,
/// and worker threads, whose interleaving lackey's run would not repeat):
/// the recorded run's output equals the native one, every library is a
/// module of the trace, and the whole trace regenerates (each witness
/// fits its procedure's witness sets, or regeneration stops).
#[test]
fn debian_zstd_with_all_its_libraries() {
    let input = input("zstd-all");
    let exe = Path::new("/usr/bin/zstd");
    let args = ["-q", "-c", input.as_str()];
    let native = run_native(exe, &args);
    let trace =
        common::scratch("trace-oracle").join(format!("zstd-all-{}.aet", std::process::id()));
    let rec = Command::new(common::aetrace())
        .arg("record")
        .arg("-o")
        .arg(&trace)
        .args(["--libs", "all", "--"])
        .arg(exe)
        .args(args)
        .output()
        .unwrap();
    assert_eq!(rec.stdout, native.stdout, "zstd: stdout differs");
    assert_eq!(rec.stderr, native.stderr, "zstd: stderr differs");
    assert_eq!(rec.status.code(), native.status.code());
    let info = info_json(&trace);
    let libs: Vec<&str> = info["modules"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["main"] == false)
        .map(|m| m["path"].as_str().unwrap())
        .collect();
    for want in ["libz.so.1", "liblzma.so.5", "liblz4.so.1"] {
        assert!(
            libs.iter().any(|p| p.ends_with(want)),
            "{want} not in {libs:?}"
        );
    }
    assert!(info["regen_error"].is_null(), "{}", info["regen_error"]);
    aetrace_ok(&["regen", "--count"], &trace);
    let _ = std::fs::remove_file(&trace);
}

// Static executables. The whole libc is traced, so lackey cannot be the
// oracle (see `common::singlestep`): the program is single-stepped natively
// instead. What static glibc's startup reads about its own image must be
// the same in both runs: it walks the program headers (PT_TLS,
// PT_GNU_STACK), which rewriting adds to, and the path of
// `/proc/self/exe`. So the stepped binary is the rewritten one (from
// aetrace's cache, at its path) with the original code and entry point put
// back byte for byte: the same headers and path, none of our code. Both
// runs get the same environment (the recorder's variable included),
// `argv[0]` and length of the exec'd path (`singlestep::NativeName`: the
// stack's addresses), with address randomisation off, so that
// alignment-dependent paths of the string functions are the same too.

/// The environment of both runs.
fn static_env(cache: &Path) -> Vec<(String, String)> {
    vec![
        ("AETRACE_CACHE".to_string(), cache.display().to_string()),
        ("PATH".to_string(), "/usr/bin:/bin".to_string()),
    ]
}

/// [`check`] for a single-threaded static executable, against the native
/// single-stepped run (also one a signal ends, `tests/crashes.rs`). A
/// program that forks has `streams` > 1: only the
/// first process's stream is compared (the stepper follows one task).
/// Returns `aetrace info --json` of the trace.
pub(crate) fn check_static_streams(exe: &Path, args: &[&str], streams: usize) -> serde_json::Value {
    check_static_with(exe, (args, &[]), (Some(streams), &[]))
}

/// [`check_static_streams`]; `streams` None: the stepper follows the
/// processes the program forks too, and each child's stream, up to where
/// it leaves the program's image (an `exec`), is compared with the trace's
/// stream of the same number. The images of the execs the recorder
/// followed are no such streams: each against its program of `followed`
/// stepped natively ([`followed_against_stepped`]).
/// `record`: options of `aetrace record` (with `--data`, the data walk
/// must regenerate too: with `--check`, agreeing on every reference).
fn check_static_with(
    exe: &Path,
    (args, record): (&[&str], &[&str]),
    (streams, followed): (Option<usize>, &[Followed]),
) -> serde_json::Value {
    let name = exe.file_name().unwrap().to_string_lossy().into_owned();
    let dir = common::scratch("trace-oracle-static");
    let cache = dir.join(format!("cache-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&cache);
    let env = static_env(&cache);
    let native = common::singlestep::run(exe, None, args, &env);

    let trace = dir.join(format!("{name}-{}.aet", std::process::id()));
    let mut rec_args: Vec<&std::ffi::OsStr> =
        vec!["record".as_ref(), "-o".as_ref(), trace.as_os_str()];
    rec_args.extend(record.iter().map(std::ffi::OsStr::new));
    rec_args.extend(["--".as_ref(), exe.as_os_str()]);
    rec_args.extend(args.iter().map(std::ffi::OsStr::new));
    let recorded = common::aetrace_fixed(&rec_args, &env);
    // A death by a signal: the stepper's status is 128 + the signal.
    let status = {
        use std::os::unix::process::ExitStatusExt;
        let st = recorded.status;
        st.code().or(st.signal().map(|s| 128 + s))
    };
    assert_eq!(status, Some(native.status), "{name}: status differs");
    assert_same_run(
        &name,
        &recorded,
        &native.stdout,
        &native.stderr,
        recorded.status.code(),
    );

    // The rewritten program the recorder ran, restored in place.
    let inst = common::singlestep::cached_rewrite(&cache, exe);
    common::singlestep::restore_original_code(exe, &inst);
    // The same environment: the recorder adds nothing to it. By a name
    // of the native length: the stack where the native run's is.
    let by = common::singlestep::NativeName::new(&inst, exe);
    let (stepped, children) = match streams {
        Some(_) => (
            common::singlestep::run(&by.path, Some(exe), args, &env),
            Vec::new(),
        ),
        None => common::singlestep::run_tree(&by.path, Some(exe), args, &env),
    };
    drop(by);
    assert_eq!(
        stepped.stdout, native.stdout,
        "{name}: the restored program's stdout"
    );

    let elf = Elf::read(exe);
    let b = &elf.bytes;
    let entry = u64::from_le_bytes(b[0x18..0x20].try_into().unwrap());
    let bias = stepped.rips[0] - entry;
    let base = link_base(exe);
    let info = info_json(&trace);
    let alone = left_alone_ranges(exe, &info, 0);
    // The image's end: a child's stream past it ran another program.
    let end = elf.sections.iter().map(|s| s.addr + s.size).max().unwrap();
    // Link-time offsets of the traced instructions, a `rep` once.
    let expect = |rips: &[u64]| {
        let in_image = rips
            .iter()
            .map(|rip| rip.wrapping_sub(bias))
            .take_while(|a| (base..end).contains(a));
        let (expected, untraced) = traced_offsets(in_image, &elf, &alone, base);
        eprintln!(
            "{name}: {} instructions stepped, {untraced} in procedures left alone",
            rips.len()
        );
        expected
    };
    // The stepped tasks come in the order they were created, the
    // trace's threads in the order the recorder found them: by creation.
    let mut rg: Vec<(u32, Vec<u64>)> = (regen_threads_with_tids(&trace, None).into_iter())
        .enumerate()
        .filter(|(k, _)| common::recorded::image_of(&info, *k).is_none())
        .map(|(_, t)| t)
        .collect();
    let key = common::creation_key(rg[0].0);
    rg[1..].sort_by_key(|&(tid, _)| key(tid));
    let streams = streams.unwrap_or(1 + children.len());
    assert_eq!(rg.len(), streams, "{name}: streams");
    let join = find_symbol(exe, "pthread_join");
    let stepped_streams = std::iter::once(&stepped.rips).chain(&children);
    for (k, (rips, (_, ours))) in stepped_streams.zip(&rg).enumerate() {
        let (expected, ours) = match join {
            Some(j) => (
                without_calls_to(&expect(rips), j),
                without_calls_to(ours, j),
            ),
            None => (expect(rips), ours.clone()),
        };
        if let Some(d) = first_difference(&expected, &ours) {
            panic!("{name} stream {k} (expected: the stepped run): {d}");
        }
    }
    followed_against_stepped(&name, &trace, followed, &env);
    if record.contains(&"--data") {
        let data = common::aetrace_fixed(
            &[
                "regen".as_ref(),
                "--format".as_ref(),
                "lackey".as_ref(),
                trace.as_os_str(),
            ],
            &env,
        );
        let err = String::from_utf8_lossy(&data.stderr);
        assert!(data.status.success(), "{name}: the data walk: {err}");
    }
    let _ = std::fs::remove_file(&trace);
    let _ = std::fs::remove_dir_all(&cache);
    info
}

/// `offs` without what each call to `entry` (a 5-byte `call rel32`)
/// ran, from its first instruction to its return: how often
/// `pthread_join` waits for its thread's exit depends on how the threads
/// were scheduled (none when it has exited, else one futex wait or more).
fn without_calls_to(offs: &[u64], entry: u64) -> Vec<u64> {
    let mut kept = Vec::with_capacity(offs.len());
    let mut back = None;
    for &a in offs {
        match back {
            Some(r) if a != r => continue,
            Some(_) => back = None,
            None if a == entry => {
                back = kept.last().map(|&call| call + 5);
                continue;
            }
            None => {}
        }
        kept.push(a);
    }
    kept
}

pub(crate) fn check_static(exe: &Path, args: &[&str]) -> serde_json::Value {
    check_static_streams(exe, args, 1)
}

const O2_STATIC: Variant = Variant::new(Opt::O2, Link::Static, false);

/// No PLT stub of the program is left alone (static glibc's IRELATIVE
/// `*ABS*+0x...@plt` stubs, which its setjmp family calls; docs/rewrite.md
/// "IFUNC"), so their instructions are compared too.
fn no_stub_left_alone(info: &serde_json::Value) {
    none_left_alone_saying(info, "plt");
}

/// No procedure of the program is left alone whose line (name, reason)
/// holds `word`.
fn none_left_alone_saying(info: &serde_json::Value, word: &str) {
    let found: Vec<String> = left_alone(info, 0)
        .into_iter()
        .filter(|l| l.contains(word))
        .collect();
    assert_eq!(found, Vec::<String>::new(), "left alone ({word})");
}

#[test]
fn static_glibc() {
    // With data (`--check`: regen compares every rebuilt address with the
    // recorded one): static glibc holds `xsave` (`_dl_runtime_resolve_xsave`),
    // which refused the rewrite until only a run executing it was refused.
    let data = (&[][..], &["--data", "--check"][..]);
    no_stub_left_alone(&check_static_with(
        &build("loops.c", O2_STATIC),
        data,
        (Some(1), &[]),
    ));
    check_static(&build("switch.c", O2_STATIC), &[]);
    check_static(
        &build("fnptr.c", Variant::new(Opt::O0, Link::Static, true)),
        &[],
    );
    let info = check_static(&build("setjmp.c", O2_STATIC), &[]);
    no_stub_left_alone(&info);
    none_left_alone_saying(&info, "setjmp");
}

/// Nothing of static glibc's fork family is left alone: it is traced,
/// and the child claims its slot right after the system call
/// (docs/rewrite.md, "Static executables").
fn no_fork_left_alone(info: &serde_json::Value) {
    none_left_alone_saying(info, "fork");
}

/// Static glibc's traced fork family: `traces/fork.c`, `traces/vfork.c`
/// (the child runs in its parent's memory until `_exit`: its stream must
/// not touch the parent's slot) and `traces/atfork.c` (the child's
/// `pthread_atfork` handler runs after the system call, in the child's
/// stream), and `traces/fork.c` stripped (the system call is recognised
/// by its constants, not by a name), parent and every child against
/// their stepped runs. Before (2026-11-30), the family and the 340-odd
/// procedures it calls ran untraced and only the parent was compared
/// (stripped: regen stopped at the fork's DESYNC).
#[test]
fn static_fork_family_traced() {
    let stripped = Variant::new(Opt::O2, Link::Static, true);
    for (source, v) in [
        ("fork.c", O2_STATIC),
        ("vfork.c", O2_STATIC),
        ("atfork.c", O2_STATIC),
        ("fork.c", stripped),
    ] {
        no_fork_left_alone(&check_static_with(
            &build(source, v),
            (&[], &[]),
            (None, &[]),
        ));
    }
}

/// `traces/threads.c` built static: `pthread_create` reaches glibc's
/// traced `__clone3`, whose child claims its own slot (THREAD) right
/// after the system call, before any witness; regen starts each worker
/// there, from its creator's state. The main thread and its four workers,
/// each against its thread stepped in the native run (`pthread_join`'s
/// waits left out of the main thread's). Before (2026-11-30), regen
/// stopped at the clone's DESYNC in the main thread.
#[test]
fn static_threads() {
    let info = check_static_with(
        &build("threads_gated.c", O2_STATIC),
        (&[], &[]),
        (None, &[]),
    );
    none_left_alone_saying(&info, "clone");
}

/// `traces/raw_clone.c` built static: a process made through static
/// libc's traced `syscall()` (SYS_clone with SIGCHLD and no stack,
/// SYS_clone3 likewise), whose system call number is known only at run
/// time, claims its slot right after the system call (before, 2026-12-01:
/// DESYNC in its parent's stream); a thread made by inline `syscall`
/// instructions right after them; a thread on a stack of its own
/// (`clone`, `clone3`) right after the system call, which it leaves for
/// `child` with `syscall()`'s frame alone on its regenerated stack
/// (before, 2026-12-01: DESYNC). Every task against its stepped run.
#[test]
fn static_raw_clone_tasks() {
    let exe = build("raw_clone.c", O2_STATIC);
    for how in ["asm", "clone", "clone3", "clone-fork", "clone3-fork"] {
        check_static_with(&exe, (&[how], &[]), (None, &[]));
    }
}

/// `traces/spawn.c` built static: `posix_spawn` and `system()` reach
/// glibc's traced `__clone3` with CLONE_VM|CLONE_VFORK; the child, in its
/// parent's memory on a stack of its own, claims its own slot (FORK)
/// right after the system call, then execs, or exits 127 when the exec
/// fails. Every task against its stepped run, a child up to its
/// `execve`. Before (2026-12-01) the children were not compared:
/// single-stepped, a child found SIGTRAP unblocked (the kernel unblocks
/// the forced trap), so `__spawni_child`'s loop over the blocked signals
/// ran differently from a native run's; the stepper now blocks it again
/// while the program's mask does (`tests/common/singlestep.rs`).
#[test]
fn static_posix_spawn_and_system() {
    let info = check_static_with(&build("spawn.c", O2_STATIC), (&[], &[]), (None, SPAWNED));
    none_left_alone_saying(&info, "clone");
    no_fork_left_alone(&info);
}

/// `traces/fork_exec.c` built static: the forked child runs glibc's
/// traced `execve`, whose `syscall` never returns, so the child's stream
/// ends there, with no RETURN (before, regen refused it: "the witness
/// stream ends ... in procedure execve ..., where the program must have
/// written more"). Both processes against their stepped runs, the child's
/// up to its exec.
#[test]
fn static_fork_child_that_execs() {
    // The child's exec of /bin/true is followed: its image, a third
    // stream after the child's (same thread id), against /bin/true
    // stepped natively.
    no_fork_left_alone(&check_static_with(
        &build("fork_exec.c", O2_STATIC),
        (&[], &[]),
        (None, &[Some(("/bin/true", "true", &[]))]),
    ));
}

/// `traces/kernel_signals.c` built static: SIGCHLD (CLD_EXITED) and an
/// interval timer's SIGALRM (SI_KERNEL), caught inside `sigsuspend`. The
/// kernel sends them, no instruction raises them, so the instruction the
/// stepper stops before runs once, after the handler (before, the stepped
/// stream listed it twice for such signals). Parent and three children,
/// each against its stepped run.
#[test]
fn static_kernel_sent_signals() {
    let exe = build("kernel_signals.c", O2_STATIC);
    no_fork_left_alone(&check_static_with(&exe, (&[], &[]), (None, &[])));
}

/// A stripped static program has no setjmp/longjmp names: glibc's are
/// recognised by their use of the pointer guard (docs/rewrite.md); its
/// setjmp family is traced, as a named one is.
#[test]
fn static_glibc_stripped_setjmp_longjmp() {
    let info = check_static(
        &build("setjmp.c", Variant::new(Opt::O2, Link::Static, true)),
        &[],
    );
    none_left_alone_saying(&info, "setjmp");
}

#[test]
fn static_pie_glibc() {
    let exe = build_with("loops.c", "static-pie", &["-O2", "-static-pie", "-fPIE"]);
    no_stub_left_alone(&check_static(&exe, &[]));
}

/// `traces/multi_entry.c`: a procedure with two entry points (one range
/// running into the next, as glibc's `__mempcpy` into `__memmove`),
/// entered at both directly, through pointers and by a tail jump: traced,
/// the secondary entry's stub writes ENTER_AT; exact against lackey
/// (before: left alone, "2 entry points"). Static glibc's multi-entry
/// string functions are checked against the stepped run by
/// `static_glibc`.
#[test]
fn several_entry_points() {
    let info = check_libs(&build("multi_entry.c", O2_PIE), &[], &[], LogMode::Pipe);
    assert_eq!(left_alone(&info, 0), Vec::<String>::new());
}

/// `traces/abs_table.c`: a table of `&&label` addresses read with a
/// bounded index. In a PIE its entries are absolute addresses that
/// R_X86_64_RELATIVE relocations move (as glibc's `vfprintf`'s, which a
/// static-PIE's `printf` runs): traced, the copy's jump adds the load
/// bias. Exact against lackey (PIE) and the stepped run (static-PIE,
/// `vfprintf` included); before, both procedures were left alone.
#[test]
fn absolute_jump_tables_in_a_pie() {
    let info = check_libs(&build("abs_table.c", O2_PIE), &[], &[], LogMode::Pipe);
    assert_eq!(left_alone(&info, 0), Vec::<String>::new());
    let exe = build_with(
        "abs_table.c",
        "static-pie",
        &["-O2", "-static-pie", "-fPIE"],
    );
    let info = check_static(&exe, &[]);
    let tables: Vec<String> = left_alone(&info, 0)
        .into_iter()
        .filter(|l| l.contains("jump table"))
        .collect();
    assert_eq!(tables, Vec::<String>::new());
}

/// A program without libc: the whole process is the program, and lackey
/// sees what the CPU runs (no CPU-dependent libc code).
#[test]
fn static_without_libc() {
    let exe = build_with(
        "nolibc_icache.c",
        "nostdlib",
        &[
            "-O2",
            "-static",
            "-nostdlib",
            "-fno-builtin",
            "-fno-stack-protector",
        ],
    );
    check(&exe, &["300"]);
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

/// Handlers run inside `kill(getpid())`, `sigprocmask` and
/// `pthread_sigmask` (unblocking a pending signal), two such calls back to
/// back with no witness between: built `-fno-plt`, so no traced PLT stub
/// writes a witness between the calls and only their RETURN records place
/// each handler. Equal to lackey. Killed by `kill(getpid(), SIGKILL)`, the
/// trace regenerates up to the call that killed it and then says so.
#[test]
fn signals_delivered_by_kill_and_unblocking() {
    let exe = build_with("signal_unblock.c", "noplt", &["-O2", "-fno-plt"]);
    check(&exe, &[]);
    let (_, trace) = record_checked(&exe, &["die"], &[], Knobs::DEFAULT);
    let out = exits_with(
        Command::new(common::aetrace())
            .args(["regen", "--format", "insn", "--relative"])
            .arg(&trace),
        0,
        &[
            "was killed by signal",
            "inside the call of block",
            "in procedure main",
        ],
    );
    // What it printed ran: lackey's run, which may lose its last few
    // instructions to the kill, and ours are prefixes of one another.
    let ours: Vec<u64> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| u64::from_str_radix(l, 16).unwrap())
        .collect();
    let run = lackey::run_with(
        &exe,
        &["die"],
        std::slice::from_ref(&exe),
        LogMode::Pipe,
        Capture::Sequences,
    );
    let base = link_base(&exe);
    let theirs: Vec<u64> = run.modules[0]
        .sequences
        .values()
        .next()
        .unwrap()
        .iter()
        .map(|a| a - base)
        .collect();
    let n = ours.len().min(theirs.len());
    assert!(n > 600, "{} and {} instructions", ours.len(), theirs.len());
    if let Some(d) = first_difference(&theirs[..n], &ours[..n]) {
        panic!("killed run: {d}");
    }
    eprintln!(
        "killed run: {} instructions regenerated, lackey {}",
        ours.len(),
        theirs.len()
    );
    let _ = std::fs::remove_file(&trace);
}

#[test]
fn nested_signal_handlers() {
    traced("signal_nested.c", O2_PIE, &[]);
}

/// Link-time offset of symbol `sym` in `exe` (from `nm`).
pub(crate) fn symbol(exe: &Path, sym: &str) -> u64 {
    find_symbol(exe, sym).unwrap_or_else(|| panic!("no symbol {sym} in {}", exe.display()))
}

/// [`symbol`], `None` when `exe` has none of that name.
fn find_symbol(exe: &Path, sym: &str) -> Option<u64> {
    let out = Command::new("nm").arg(exe).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let addr = text.lines().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        (f.len() == 3 && f[2] == sym).then(|| u64::from_str_radix(f[0], 16).unwrap())
    })?;
    Some(addr - link_base(exe))
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
/// Runs `cmd`, which must exit with `code` and say each of `why` on
/// stderr; its output.
fn exits_with(cmd: &mut Command, code: i32, why: &[&str]) -> std::process::Output {
    let out = cmd.output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(code), "stderr {stderr}");
    for w in why {
        assert!(stderr.contains(w), "{w:?} not in {stderr}");
    }
    out
}

fn aetrace_ok(args: &[&str], trace: &Path) -> String {
    let out = common::build::run_checked(
        Command::new(common::aetrace()).args(args).arg(trace),
        &format!("aetrace {args:?}"),
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn asynchronous_timer_signals() {
    for v in [O2_PIE, Variant::new(Opt::O0, Link::NoPie, false)] {
        let exe = build("signal_alarm.c", v);
        let handler = (exe.as_path(), "on_alarm");
        check_timer(&exe, &[], &[], handler, (&exe, "step"), 0, Knobs::DEFAULT);
    }
}

/// Halves of 16 KiB (`AETRACE_HALF_SIZE`, the recorder's testing knob)
/// make the writer flush every 12 kB, and with a 20 us timer the signal
/// that becomes pending while `flush` has signals blocked is delivered as
/// it unblocks them, inside the runtime (before `signal_entry` reported
/// such a signal at the `call flush` of the buffer check, regen refused
/// every one of these traces): the program's handler and loop counts
/// still regenerate exactly. (The library's `flush`, interrupted with the
/// handler in either module: `signals_interrupting_a_traced_library`.)
#[test]
fn asynchronous_signals_inside_flush() {
    for v in [O2_PIE, Variant::new(Opt::O0, Link::NoPie, false)] {
        let exe = build("signal_alarm.c", v);
        let handler = (exe.as_path(), "on_alarm");
        check_timer(&exe, &[], &[], handler, (&exe, "step"), 0, SMALL_HALVES);
    }
}

/// Signals to threads that are just starting: each worker of
/// `traces/signal_threads.c` is sent SIGUSR1 right after its creation,
/// after a delay that sweeps across its start, so some land in the
/// runtime's `attach_thread` where it does not block signals (before,
/// regen refused those traces naming a runtime offset, or a thread
/// claimed two slots). Valgrind delivers signals at its own points, so
/// the oracle is the program's output: `on_usr1` and `step` entered
/// exactly as often as it counted, one SIGNAL per handler run.
#[test]
fn signals_to_starting_threads() {
    for v in [O2_PIE, Variant::new(Opt::O0, Link::NoPie, false)] {
        let exe = build("signal_threads.c", v);
        let (trace, stdout, signals) = record_signalled(&exe, &["150"]);
        let field = |key: &str| -> u64 {
            common::count_in(&stdout, key).unwrap_or_else(|| panic!("no {key} in {stdout:?}"))
        };
        let (handled, iterations) = (field("handled="), field("iterations="));
        assert_eq!(handled, 150, "{stdout}");
        assert_eq!(
            signals.iter().sum::<u64>(),
            handled,
            "SIGNAL records: {signals:?}"
        );
        assert_eq!(entries(&trace, &exe, "on_usr1"), handled);
        assert_eq!(entries(&trace, &exe, "step"), iterations);
        let _ = std::fs::remove_file(&trace);
    }
}

/// A child signalled right after fork (`traces/signal_fork.c`: the parent
/// sends SIGUSR1 after a delay that sweeps across the child's start): the
/// child's handler runs inside libc's fork, in the runtime's
/// `fork_child`, or later. Every child's stream holds its one SIGNAL and
/// its `on_usr1`, the parent's none (before, a handler that ran before
/// `fork_child` wrote into the parent's stream, and regen put the
/// children's handlers into the parent's trace).
#[test]
fn signals_to_fork_children_right_after_fork() {
    for v in [O2_PIE, Variant::new(Opt::O0, Link::NoPie, false)] {
        let exe = build("signal_fork.c", v);
        let (trace, stdout, signals) = record_signalled(&exe, &["60"]);
        assert!(stdout.starts_with("children=60 "), "{stdout}");
        assert_eq!(signals.len(), 61, "{signals:?}");
        assert_eq!(signals[0], 0, "the parent's stream holds no SIGNAL");
        assert!(
            signals[1..].iter().all(|&s| s == 1),
            "one SIGNAL per child: {signals:?}"
        );
        assert_eq!(entries(&trace, &exe, "on_usr1"), 60);
        let _ = std::fs::remove_file(&trace);
    }
}

/// Two signals delivered at once: `traces/signal_pair.c`'s sender thread
/// sends SIGUSR1 and SIGUSR2 back to back, so both are often pending when
/// the main thread, in its traced loop, returns to user mode, and the
/// second handler starts at the first one's entry (its springboard),
/// before the first SIGNAL is written (before, that SIGNAL named the
/// springboard, untraced code, and regen refused 50 of 50 traces).
/// Checked against the program's counts.
#[test]
fn two_signals_delivered_at_once() {
    for v in [O2_PIE, Variant::new(Opt::O0, Link::NoPie, false)] {
        let exe = build("signal_pair.c", v);
        let handler = (exe.as_path(), "on_signal");
        check_timer(&exe, &[], &[], handler, (&exe, "step"), 0, Knobs::DEFAULT);
    }
}

/// Records `exe args`; the trace, the program's stdout and the SIGNAL
/// records regen placed in each thread (`--count`), after checking that
/// the instruction trace regenerates with as many instructions.
fn record_signalled(exe: &Path, args: &[&str]) -> (PathBuf, String, Vec<u64>) {
    let (name, trace, rec) = record_ok(exe, args, &[], Knobs::DEFAULT);
    let count = aetrace_ok(&["regen", "--count"], &trace);
    let insns = aetrace_ok(&["regen", "--format", "insn"], &trace);
    let lines = insns.lines().filter(|l| !l.starts_with('#')).count() as u64;
    let mut total = 0;
    let mut signals = Vec::new();
    for l in count.lines().filter(|l| l.starts_with("thread ")) {
        // "thread T pid P tid T module PATH: I instructions, B blocks[, S signals (...)]"
        let totals = l.rsplit_once(": ").map_or("", |t| t.1);
        let nums: Vec<u64> = totals
            .split(|c: char| !c.is_ascii_digit())
            .filter_map(|w| w.parse().ok())
            .collect();
        total += nums[0];
        signals.push(if totals.contains(" signals (") {
            nums[2]
        } else {
            0
        });
    }
    assert_eq!(total, lines, "{name}: --count and the instruction trace");
    (trace, String::from_utf8(rec.stdout).unwrap(), signals)
}

/// Entries of `sym` in `exe`'s regenerated blocks, all threads.
fn entries(trace: &Path, exe: &Path, sym: &str) -> u64 {
    let blocks = aetrace_ok(&["regen", "--format", "block", "--relative"], trace);
    let at = format!("{:x} ", symbol(exe, sym));
    blocks.lines().filter(|l| l.starts_with(&at)).count() as u64
}

/// Recorder buffer halves of 16 KiB (`AETRACE_HALF_SIZE`): a flush every
/// 12 kB of a thread's witnesses.
const SMALL_HALVES: Knobs = Knobs {
    half: Some(16 << 10),
    ..Knobs::DEFAULT
};

/// A SIGNAL is placed in the signal map of the module whose code it
/// interrupted, whichever module's handler runs: a library's loop sends
/// itself signals with a `syscall` of its own (handled in the program)
/// and with `raise` (handled in the library), equal to lackey in both
/// modules; a timer interrupts the library's hot loop anywhere, the
/// handler in the program (calling back into the library) or in the
/// library, checked against the program's counts; again with small
/// buffer halves, so that signals interrupt the library's `flush` too.
#[test]
fn signals_interrupting_a_traced_library() {
    let exe = build_with_lib("signal_lib", "libaesig.so.1", false);
    let lib = exe.with_file_name("libaesig.so.1");
    check_libs(&exe, &["kill", "40"], &["libaesig.so.1"], LogMode::Pipe);
    let libs = ["libaesig.so.1"];
    let step = (lib.as_path(), "lib_step");
    // The program's handler calls `lib_step` once per run.
    check_timer(
        &exe,
        &["timer-exe", "300"],
        &libs,
        (&exe, "on_signal"),
        step,
        1,
        Knobs::DEFAULT,
    );
    check_timer(
        &exe,
        &["timer-lib", "300"],
        &libs,
        (&lib, "lib_on_signal"),
        step,
        0,
        Knobs::DEFAULT,
    );
    let (exe_handler, lib_handler) = (
        (exe.as_path(), "on_signal"),
        (lib.as_path(), "lib_on_signal"),
    );
    let args = ["timer-exe", "300"];
    check_timer(&exe, &args, &libs, exe_handler, step, 1, SMALL_HALVES);
    let args = ["timer-lib", "300"];
    check_timer(&exe, &args, &libs, lib_handler, step, 0, SMALL_HALVES);
}

/// Records `exe args` with `--libs LIBS`, a program interrupted by an
/// interval timer. Valgrind delivers asynchronous signals at its own
/// points, so the oracle is the program's output (`handled=H
/// iterations=I`): the regenerated trace enters procedure `handler` (of
/// module `.0`) H times and `step` I + `per_handler` × H times. The
/// instruction trace regenerates too, `--count` agrees with it, counts H
/// SIGNAL records, and some of them interrupted instrumentation. `knobs`:
/// the recorder's settings ([`Knobs`]).
fn check_timer(
    exe: &Path,
    args: &[&str],
    libs: &[&str],
    handler: (&Path, &str),
    step: (&Path, &str),
    per_handler: u64,
    knobs: Knobs,
) {
    let inside = timer_counts(exe, args, libs, handler, step, per_handler, knobs);
    assert!(
        inside > 0,
        "{} {args:?}: no signal interrupted instrumentation",
        exe.display()
    );
}

/// Records `exe args` ([`record_run`]), which must succeed; returns the
/// run's name, the trace, and the value of a `key=N` word of the program's
/// output (its own counts: the oracle for asynchronous signals).
fn record_counting(
    exe: &Path,
    args: &[&str],
    libs: &[&str],
    knobs: Knobs,
) -> (String, PathBuf, impl Fn(&str) -> u64) {
    let (name, trace, rec) = record_ok(exe, args, libs, knobs);
    let stdout = String::from_utf8(rec.stdout).unwrap();
    let who = name.clone();
    let field = move |key: &str| -> u64 {
        common::count_in(&stdout, key).unwrap_or_else(|| panic!("{who}: no {key} in {stdout:?}"))
    };
    (name, trace, field)
}

/// [`check_timer`] but for the check that some signals interrupted
/// instrumentation; returns how many did.
fn timer_counts(
    exe: &Path,
    args: &[&str],
    libs: &[&str],
    handler: (&Path, &str),
    step: (&Path, &str),
    per_handler: u64,
    knobs: Knobs,
) -> u64 {
    let (name, trace, field) = record_counting(exe, args, libs, knobs);
    let (handled, iterations) = (field("handled="), field("iterations="));
    // Entries of `sym` in `module`'s blocks (relative to its link base).
    let entries = |(module, sym): (&Path, &str)| {
        let mut args = vec!["regen", "--format", "block", "--relative"];
        let path = module.to_str().unwrap();
        if !libs.is_empty() {
            args.extend(["--module", path]);
        }
        let blocks = aetrace_ok(&args, &trace);
        let at = format!("{:x} ", symbol(module, sym));
        blocks.lines().filter(|l| l.starts_with(&at)).count() as u64
    };
    assert_eq!(entries(handler), handled, "{name}: handler entries");
    assert_eq!(
        entries(step),
        iterations + per_handler * handled,
        "{name}: loop iterations ({iterations}) and handler calls"
    );
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
    let _ = std::fs::remove_file(&trace);
    inside
}

/// Signals interrupting one of several transfers that wrote nothing since
/// the thread's last record, which the SIGNAL record's transfer count
/// places (docs/regen.md, "Placing a SIGNAL"; before it, regeneration
/// refused each of these traces): `kill(getpid(), s)` with the handler
/// inside `kill` after `getpid`'s call (built `-fno-plt`: no PLT stub
/// writes a witness between them), equal to lackey; a 20 us timer while a
/// loop calls `getppid` and `getpid` back to back, and while it calls a
/// branch-free procedure twice per iteration (the signal in its second
/// run or its first), against the program's counts.
#[test]
fn signals_between_record_free_transfers() {
    let exe = build_with("signal_gaps.c", "noplt", &["-O2", "-fno-plt"]);
    check(&exe, &["kill"]);
    let exe0 = build_with("signal_gaps.c", "noplt-O0", &["-O0", "-fno-plt", "-no-pie"]);
    check(&exe0, &["kill"]);
    let handler = (exe.as_path(), "on_signal");
    for (mode, step) in [("timer-calls", "calls"), ("timer-twice", "twice")] {
        timer_counts(
            &exe,
            &[mode, "300"],
            &[],
            handler,
            (&exe, step),
            0,
            Knobs::DEFAULT,
        );
    }
    twice_phases(&exe);
}

/// `signal_gaps timer-twice`: the program stores `phase` = 1 before the
/// first call of `twice` and 2 before the second, and its handler counts
/// the phase it interrupted. In the regenerated instruction trace, each
/// entry of the handler must follow the store of that same phase: a signal
/// in the second run placed in the first (what regen did before the
/// transfer count, silently) shows as a phase-1 entry too many.
fn twice_phases(exe: &Path) {
    let (_, trace, field) = record_counting(exe, &["timer-twice", "300"], &[], Knobs::DEFAULT);
    let got = handler_phases(exe, &trace, &field, "on_signal");
    eprintln!("timer-twice: handler entries by phase {got:?}");
    let _ = std::fs::remove_file(&trace);
}

/// `trace` records `exe`, a program whose handler `handler` counts the
/// value of its global `phase` (0, 1, 2) at each interruption and prints
/// them as `phase0= phase1= phase2=` (`field` reads its output): checks
/// that in the regenerated instruction trace as many entries of `handler`
/// follow the last store of each value to `phase` (none yet: 0), and
/// returns those counts.
fn handler_phases(
    exe: &Path,
    trace: &Path,
    field: &impl Fn(&str) -> u64,
    handler: &str,
) -> [u64; 3] {
    let name = exe.display();
    let want = [field("phase0="), field("phase1="), field("phase2=")];
    // The stores of `phase` in main, relative to the link base.
    let dump = Command::new("objdump")
        .args(["-d", "--no-show-raw-insn"])
        .arg(exe)
        .output()
        .unwrap();
    let base = link_base(exe);
    let stores = |value: &str| -> Vec<u64> {
        String::from_utf8_lossy(&dump.stdout)
            .lines()
            .filter(|l| l.contains("<phase>") && l.contains(&format!("movl   ${value},")))
            .filter_map(|l| u64::from_str_radix(l.trim().split(':').next()?, 16).ok())
            .map(|a| a - base)
            .collect()
    };
    let at = [stores("0x0"), stores("0x1"), stores("0x2")];
    assert!(
        !at[1].is_empty() && !at[2].is_empty(),
        "{name}: no stores of 1 and 2 to phase"
    );
    let handler = symbol(exe, handler);
    let insns = aetrace_ok(&["regen", "--format", "insn", "--relative"], trace);
    // Phase 0: a signal before the first store.
    let mut got = [0u64; 3];
    let mut phase = 0;
    for a in insns.lines().filter(|l| !l.starts_with('#')) {
        let a = u64::from_str_radix(a, 16).unwrap();
        if let Some(p) = at.iter().position(|s| s.contains(&a)) {
            phase = p;
        } else if a == handler {
            got[phase] += 1;
        }
    }
    assert_eq!(
        got, want,
        "{name}: handler entries after the stores of 0, 1 and 2 to phase"
    );
    got
}

/// A second signal inside the first handler's outside-entry stub, before
/// it writes the first SIGNAL (`traces/signal_stub.c`: a 25 us SIGUSR1
/// timer keeps the loop entering `on_usr1` while a 20 us SIGALRM timer
/// strikes anywhere, now and then in `on_usr1`'s stub). The runtime
/// reports it where SIGUSR1 struck, so the SIGALRM handler runs nested
/// before `on_usr1`, in the phase SIGUSR1 interrupted; before, it was
/// reported in the stub (untraced code), and regen refused the trace (70
/// of 100 runs under load) or could put it at the loop's call to `labs`,
/// which has the same transfer count. Against the program's counts:
/// handler entries, loop iterations, and the phase each SIGALRM
/// interrupted. The one other refusal known to hit this program (a
/// signal in glibc's restorer after an interrupted handler returned,
/// `docs/regen.md` section 3a: 9 of 500 runs under load) is gone since
/// the runtime reports where the restorer returns (0 of 500).
#[test]
fn a_signal_inside_a_handlers_entry_stub() {
    let exe = build_with("signal_stub.c", "noplt", &["-O2", "-fno-plt"]);
    let (_, trace, field) = record_counting(&exe, &["3000"], &[], Knobs::DEFAULT);
    aetrace_ok(&["regen", "--count"], &trace);
    assert_eq!(entries(&trace, &exe, "on_alarm"), field("handled="));
    assert_eq!(entries(&trace, &exe, "on_usr1"), field("usr1="));
    assert_eq!(entries(&trace, &exe, "step"), field("iterations="));
    let got = handler_phases(&exe, &trace, &field, "on_alarm");
    eprintln!("signal_stub: SIGALRM handler entries by phase {got:?}");
    let _ = std::fs::remove_file(&trace);
}

/// Paper 004's Section 4.1 cases, each ending a block: `rep movsb` /
/// `rep stosq` with counts 0, 1 and many (`aetrace verify` says exact on
/// the same programs, `tests/verify.rs`).
#[test]
fn rep_string_instructions_ending_blocks() {
    traced("rep_string.c", O2_PIE, &[]);
    traced("rep_string.c", O0_NOPIE, &[]);
}

/// Raw `syscall` instructions in the program's code, the last one
/// `exit_group`.
#[test]
fn raw_system_calls() {
    traced("raw_syscall.c", O2_PIE, &[]);
}

/// `clock_gettime` and `gettimeofday` run in the vDSO, outside every module.
#[test]
fn vdso_calls() {
    traced("vdso.c", O2_PIE, &[]);
}

/// The program's own `int3`, caught by a SIGTRAP handler that returns:
/// a trap, so the kernel reports the rip after the `int3`, which has
/// completed (lackey counts it once, then the handler's blocks). In
/// `int3.c` it ends a block (the rip is before the witness of its edge);
/// in `int3_after_call.c` it is the first instruction after a lazily bound
/// call returns, with no item written between the jump into the resolver
/// and the SIGNAL, and at a procedure's entry.
#[test]
fn own_int3_with_returning_handler() {
    traced("int3.c", O2_PIE, &[]);
    traced("int3.c", O0_NOPIE, &[]);
    traced("int3_after_call.c", O2_PIE, &[]);
    traced("int3_after_call.c", O0_NOPIE, &[]);
}

/// Handlers that move rip past the instruction that trapped
/// (`traces/trap_resume.c`: SIGILL skips `ud2`, then SIGTRAP returns after
/// `int3`, or with an argument SIGSEGV skips `hlt`): the traces equal
/// lackey's run (without the argument) and the native run single-stepped
/// (with it: valgrind raises SIGILL for `hlt`); the recorded program
/// prints what the native one prints, with and without `--data`, and
/// `--data --check` regenerates every address equal to the full one.
#[test]
fn handlers_resuming_after_traps() {
    for v in [O2_PIE, O0_NOPIE] {
        traced("trap_resume.c", v, &[]);
        let exe = build("trap_resume.c", v);
        let stepped = ["hlt"];
        let (_, trace) = record_checked(&exe, &stepped, &[], Knobs::DEFAULT);
        let rg = regen_threads(&trace, None).swap_remove(0);
        let _ = std::fs::remove_file(&trace);
        let base = link_base(&exe);
        let native: Vec<u64> = (crate::crashes::stepped(&exe, &stepped).iter())
            .map(|a| a - base)
            .collect();
        assert_eq!(rg.len(), native.len(), "{}: instructions", exe.display());
        assert!(
            rg == native,
            "{}: the trace is the stepped run",
            exe.display()
        );
        for args in [&[][..], &stepped[..]] {
            let (name, trace) = record_checked(&exe, args, &[], Knobs::DATA);
            let _ = std::fs::remove_file(&trace);
            let checked = trace.with_extension("check.aet");
            run_checked(
                Command::new(common::aetrace())
                    .args(["record", "--data", "--check", "-o"])
                    .arg(&checked)
                    .arg("--")
                    .arg(&exe)
                    .args(args),
                "aetrace record --data --check",
            );
            let out = Command::new(common::aetrace())
                .args(["regen", "--format", "lackey", "-o", "/dev/null"])
                .arg(&checked)
                .output()
                .unwrap();
            let _ = std::fs::remove_file(&checked);
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(out.status.success(), "{name} --check: {err}");
        }
    }
}

/// The `traces/` programs written for other topics (the interpreter's
/// computed goto, the cache-simulator and README examples, the call tree
/// of the inclusive-cost test, the procedure with 2^20 paths, threads in
/// branchy procedures at once): their traces are exact too.
#[test]
fn programs_of_the_other_topics() {
    traced("computed_goto.c", O2_PIE, &[]);
    traced("computed_goto.c", O0_NOPIE, &[]);
    traced("cache_mix.c", O2_PIE, &[]);
    traced("calltree.c", O2_PIE, &[]);
    traced("many_paths.c", O2_PIE, &[]);
    traced("threads_paths.c", O2_PIE, &[]);
    // valgrind runs a vfork child as a forked process: one log per process.
    check_with(&build("vfork.c", O2_PIE), &[], LogMode::PerProcessFiles);
    traced("demo.c", O2_PIE, &["b"]);
}

/// Where the lazy-binding half (`push n`) of `import`'s PLT stub starts,
/// relative to the link base.
fn plt_lazy_half(exe: &Path, import: &str) -> u64 {
    let stub = plt_stub(exe, import);
    let push = stub.iter().find(|(_, text)| text.contains("push"));
    push.unwrap_or_else(|| panic!("no lazy-binding half of {import}@plt in {}", exe.display()))
        .0
}

/// The instructions of `import`'s stub in `.plt`: each one's address
/// relative to the link base, and its text (`objdump`).
fn plt_stub(exe: &Path, import: &str) -> Vec<(u64, String)> {
    let out = Command::new("objdump")
        .args(["-d", "-j", ".plt", "--no-show-raw-insn"])
        .arg(exe)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let mut lines = text
        .lines()
        .skip_while(|l| !l.ends_with(&format!("<{import}@plt>:")));
    lines.next();
    let base = link_base(exe);
    lines
        .map_while(|l| {
            let (at, insn) = l.trim().split_once(':')?;
            Some((u64::from_str_radix(at, 16).ok()? - base, insn.to_owned()))
        })
        .collect()
}

/// PLT stubs whose bound outcome writes nothing and whose lazy one writes
/// LAZY (docs/rewrite.md, "PLT stubs"): imports bound lazily while the
/// program runs, a lazy resolution (an IFUNC resolver) calling the program
/// back, which binds `qsort`, `labs` and (in qsort's comparator) `strcmp`
/// inside it, and two threads that both find `twice`'s slot unbound, equal
/// to lackey; both threads' traces pass through `twice@plt`'s second half
/// and no later call does. A timer interrupting two calls in a row through
/// bound stubs (the second a tail jump to the stub), mostly in library
/// code right after a stub's jump, against the program's counts.
#[test]
fn lazy_binding_through_plt_stubs() {
    let exe = build_with_lib("lazy_plt", "liblazyplt.so.1", false);
    check(&exe, &["bind"]);
    let (_, trace) = record_checked(&exe, &["bind"], &[], Knobs::DEFAULT);
    let blocks = aetrace_ok(&["regen", "--format", "block", "--relative"], &trace);
    let ran = |a: u64| {
        let at = format!("{a:x} ");
        blocks.lines().filter(|l| l.starts_with(&at)).count()
    };
    assert_eq!(
        ran(plt_lazy_half(&exe, "twice")),
        2,
        "twice@plt's lazy half: {blocks}"
    );
    assert_eq!(ran(plt_lazy_half(&exe, "once")), 1, "once@plt's lazy half");
    assert_eq!(
        ran(plt_lazy_half(&exe, "strcmp")),
        1,
        "strcmp@plt's lazy half"
    );
    let _ = std::fs::remove_file(&trace);
    let handler = (exe.as_path(), "on_signal");
    timer_counts(
        &exe,
        &["timer", "300"],
        &[],
        handler,
        (&exe, "step"),
        0,
        Knobs::DEFAULT,
    );
    // The loop's calls through bound stubs write nothing: one witness per
    // iteration (main's loop test), where a witness per stub's jump made three.
    let (name, trace, field) = record_counting(&exe, &["timer", "100"], &[], Knobs::DEFAULT);
    let witnesses = info_json(&trace)["witnesses"].as_u64().unwrap();
    let iterations = field("iterations=");
    assert!(
        witnesses < 2 * iterations,
        "{name}: {witnesses} witnesses for {iterations} iterations"
    );
    let _ = std::fs::remove_file(&trace);
}

/// The IBT PLT layout (`-z ibtplt`): `.plt.sec` stubs whose lazy-binding
/// half is a `.plt` entry of its own, where the GOT slot points until
/// bound. Its LAZY piece enters that entry's copy; before it, the entry's
/// ENTER read like a callback put the caller's next blocks ahead of the
/// lazy binding (a misordered trace). Equal to lackey.
#[test]
fn ibt_plt_stubs_bind_lazily() {
    let flags = ["-O2", "-fcf-protection=full", "-Wl,-z,ibtplt"];
    let exe = build_with("qsort_callback.c", "ibtplt", &flags);
    let sections = Command::new("readelf")
        .arg("-SW")
        .arg(&exe)
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&sections.stdout).contains(".plt.sec"),
        "the linker made no .plt.sec: the test checks nothing"
    );
    check(&exe, &[]);
}

/// Each outside entry's `rsp` in the default recording (format 1.21: a
/// VALUE after ENTER, or ENTER_SAME where it repeats the thread's last)
/// against the program's own record of it (entry_rsp_signals.c): qsort's
/// comparator entered about 100,000 times from a few depths, most entries
/// ENTER_SAME, while a 20 us timer runs the traced SIGALRM handler
/// anywhere, between a stub's compare and its record included. Per
/// function and `rsp`, the values the regenerator's value reader gives
/// after its ENTERs equal the program's counts; the values a signal
/// separated from their ENTER (a handler between a stub's ENTER and its
/// VALUE) are counted with whichever function has that `rsp`.
#[test]
fn entry_rsps_of_callbacks_and_handlers_equal_the_programs() {
    use std::collections::BTreeMap;
    let exe = build(
        "entry_rsp_signals.c",
        Variant::new(Opt::O0, Link::Pie, false),
    );
    let (name, trace, rec) = record_ok(&exe, &[], &[], Knobs::DEFAULT);
    let stdout = String::from_utf8_lossy(&rec.stdout);
    let mut want: BTreeMap<(String, u64), u64> = BTreeMap::new();
    let mut handled = 0;
    for line in stdout.lines() {
        let f: Vec<&str> = line.split(' ').collect();
        match f[..] {
            ["handled", n] => handled = n.parse().unwrap(),
            [func, rsp, n] => {
                let rsp = u64::from_str_radix(rsp.trim_start_matches("0x"), 16).unwrap();
                want.insert((func.to_string(), rsp), n.parse().unwrap());
            }
            _ => panic!("{name}: unexpected line {line:?}"),
        }
    }
    let t = aetrace_format::TraceFile::open(&trace).unwrap();
    let db = t.program_database(aetrace_format::ModuleId(0)).unwrap();
    let db = aetrace_format::progdb::ProgramDb::decode(&db.decompress().unwrap()).unwrap();
    let raw = |f: &str| db.procs.iter().position(|p| p.name == f).unwrap() as u32;
    let (by_cmp, by_alarm) = (raw("cmp"), raw("on_alarm"));
    let thread = t.threads().next().unwrap().start.thread;
    let (values, _) = aetrace_regen::data_values_entered(&t, thread).unwrap();
    let mut got: BTreeMap<(String, u64), u64> = BTreeMap::new();
    let mut loose: BTreeMap<u64, u64> = BTreeMap::new();
    let mut marks = values.entered.iter().peekable();
    for (i, &v) in values.values.iter().enumerate() {
        let func = match marks.next_if(|m| m.0 == i) {
            Some(&(_, p)) if p == by_cmp => "cmp",
            Some(&(_, p)) if p == by_alarm => "on_alarm",
            Some(_) => continue,
            None => {
                *loose.entry(v).or_default() += 1;
                continue;
            }
        };
        *got.entry((func.to_string(), v)).or_default() += 1;
    }
    for (key, &n) in &want {
        let have = got.get(key).copied().unwrap_or(0);
        let free = loose.get_mut(&key.1).map_or(0, std::mem::take);
        assert!(
            have <= n && have + free >= n,
            "{name}: {} at {:#x}: {n} entries, the trace gives {have} (and {free} loose)",
            key.0,
            key.1
        );
        *loose.entry(key.1).or_default() = have + free - n;
    }
    assert!(
        got.keys().all(|k| want.contains_key(k)) && loose.values().all(|&n| n == 0),
        "{name}: entries the program did not see: {:?}, loose {loose:?}",
        got.keys()
            .filter(|k| !want.contains_key(k))
            .collect::<Vec<_>>()
    );
    let entries: u64 = want.values().sum();
    assert!(
        entries > 90_000 && handled > 10,
        "{name}: {entries} entries, {handled} signals"
    );
    let info = info_json(&trace);
    let repeated = info["entry_values_repeated"].as_u64().unwrap();
    assert!(
        repeated * 2 > entries,
        "{name}: {repeated} of {entries} ENTER_SAME"
    );
}
