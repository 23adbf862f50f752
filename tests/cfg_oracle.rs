//! The CFG oracle (issue 2): for runs of our `traces/` programs and of
//! `/usr/bin/gzip -c` and `/usr/bin/bzip2 -c` (with `libbz2.so.1.0`) on a
//! 20 kB input (xz with liblzma: `trace_oracle::debian_xz_with_liblzma`,
//! whose exact trace with no procedure left alone needs every transfer of
//! the run in the CFG), every instruction valgrind lackey reports inside a module is
//! an instruction of the CFG `aetrace cfg --json` recovers from the file,
//! and every transfer between two of its instructions is an edge, a call, a
//! return or a tail call that the CFG knows (rules in `common/oracle.rs`).
//! Each run's stdout and exit status under valgrind must also equal the
//! native run's (the program's output is an oracle too).
//!
//! Matrix: all fifteen programs of `traces/` in eight variants (-O2 PIE,
//! -O0 PIE, -O3 PIE, -O2 non-PIE, -O2 static, -O2 PIE stripped, -O2
//! non-PIE stripped, -O3 static stripped); the programs are small, so a run under lackey takes about a
//! second. About 3 minutes on 2 cores in a debug build.
//!
//! A failure lists, per run and module, the first violations (12, or
//! `AETRACE_ORACLE_SHOW=N`), each naming addresses, procedures and the
//! block's known successors. The harness itself is tested: synthetic CFGs
//! and logs, address normalisation against `nm`, and a real CFG with an
//! edge or instruction deleted must fail.

use crate::common;

use std::path::PathBuf;

use common::build::{build, run_native, Link, Opt, Variant};
use common::cfg::{Cfg, Index};
use common::lackey::{self, LogMode};
use common::oracle::{self, Landmarks};

const VARIANTS: &[Variant] = &[
    Variant::new(Opt::O2, Link::Pie, false),
    Variant::new(Opt::O0, Link::Pie, false),
    Variant::new(Opt::O3, Link::Pie, false),
    Variant::new(Opt::O2, Link::NoPie, false),
    Variant::new(Opt::O2, Link::Static, false),
    Variant::new(Opt::O2, Link::Pie, true),
    Variant::new(Opt::O2, Link::NoPie, true),
    Variant::new(Opt::O3, Link::Static, true),
];

/// Violations shown per module in a failure message (12, or the value of
/// the environment variable `AETRACE_ORACLE_SHOW`).
fn show() -> usize {
    std::env::var("AETRACE_ORACLE_SHOW")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(12)
}

struct Program {
    source: &'static str,
    mode: LogMode,
}

impl Program {
    const fn plain(source: &'static str) -> Program {
        Program {
            source,
            mode: LogMode::Pipe,
        }
    }
}

/// A native run's stdout and exit status.
type Native = (Vec<u8>, Option<i32>);

/// Runs one variant of a program natively and under lackey, checks its
/// output and its CFG; returns the failure text (empty when clean) and the
/// native stdout and exit status.
fn check_variant(p: &Program, v: Variant) -> (String, Native) {
    let exe = build(p.source, v);
    let label = format!("{} {}", p.source, v.tag());
    let native = run_native(&exe, &[]);
    let modules = std::slice::from_ref(&exe);
    let pattern = lackey::symtab_pattern(modules);
    let run = lackey::run(&exe, &[], modules, &pattern, p.mode);
    let mut failures = String::new();
    if run.stdout != native.stdout || run.status.code() != native.status.code() {
        failures.push_str(&format!(
            "\n{label}: under valgrind the output/status differ: {:?} {:?} vs native {:?} {:?}",
            run.status,
            String::from_utf8_lossy(&run.stdout),
            native.status,
            String::from_utf8_lossy(&native.stdout)
        ));
    }
    if run.modules[0].executed == 0 {
        failures.push_str(&format!(
            "\n{label}: valgrind saw nothing executed in the program"
        ));
    }
    let cfg = Cfg::load(&exe);
    let ix = Index::new(&cfg);
    let (stats, bad) = oracle::check(&ix, &run.modules[0], &Landmarks::of(&exe));
    eprintln!("{label}: {stats}");
    if !bad.is_empty() {
        failures.push_str(&format!(
            "\n{label}: {} violations, first {}:",
            bad.len(),
            show().min(bad.len())
        ));
        for b in bad.iter().take(show()) {
            failures.push_str("\n  ");
            failures.push_str(b);
        }
    }
    (failures, (native.stdout, native.status.code()))
}

/// Checks every variant; all of them must also print the same output and
/// exit with the same status natively.
fn check_program(p: Program) {
    let mut failures = String::new();
    let mut first: Option<(Variant, Native)> = None;
    for &v in VARIANTS {
        let (f, native) = check_variant(&p, v);
        failures.push_str(&f);
        match &first {
            None => first = Some((v, native)),
            Some((v0, n0)) if *n0 != native => failures.push_str(&format!(
                "\n{}: {} prints {:?} (status {:?}) but {} prints {:?} (status {:?})",
                p.source,
                v.tag(),
                String::from_utf8_lossy(&native.0),
                native.1,
                v0.tag(),
                String::from_utf8_lossy(&n0.0),
                n0.1
            )),
            Some(_) => {}
        }
    }
    assert!(failures.is_empty(), "CFG oracle failed:{failures}");
}

macro_rules! program_tests {
    ($($name:ident: $program:expr,)*) => {
        $(
            #[test]
            fn $name() {
                check_program($program);
            }
        )*
    };
}

program_tests! {
    loops: Program::plain("loops.c"),
    nested_if: Program::plain("nested_if.c"),
    switch_jump_table: Program::plain("switch.c"),
    recursion: Program::plain("recursion.c"),
    function_pointers: Program::plain("fnptr.c"),
    tail_calls: Program::plain("tailcall.c"),
    noreturn_calls: Program::plain("noreturn.c"),
    setjmp_longjmp: Program::plain("setjmp.c"),
    computed_goto: Program::plain("computed_goto.c"),
    cxx_exceptions_virtual_calls: Program::plain("cxx_exceptions.cpp"),
    exit_with_frames_active: Program::plain("exit_nested.c"),
    qsort_callbacks: Program::plain("qsort_callback.c"),
    // Delivery and return followed through valgrind's signal log.
    signal_handlers: Program::plain("signal.c"),
    fork_child: Program { mode: LogMode::PerProcessFiles, ..Program::plain("fork.c") },
    // Pairs per thread, from valgrind's scheduler log.
    threads: Program::plain("threads.c"),
}

/// Runs a system program on the 20 kB input (`common::text_20k`, lackey's
/// log kept for the other tests of it) under lackey and checks each of
/// `modules` against its CFG.
fn check_system(exe: &str, args: &[&str], modules: &[&str]) {
    let mut full_args: Vec<&str> = args.to_vec();
    full_args.push(common::text_20k());
    let exe = PathBuf::from(exe);
    let native = run_native(&exe, &full_args);
    assert!(native.status.success(), "{} failed natively", exe.display());
    let modules: Vec<PathBuf> = modules.iter().map(PathBuf::from).collect();
    let pattern = lackey::symtab_pattern(&modules);
    let run = lackey::run(&exe, &full_args, &modules, &pattern, LogMode::Pipe);
    assert_eq!(
        run.status.code(),
        native.status.code(),
        "exit status under valgrind"
    );
    assert!(
        run.stdout == native.stdout,
        "{}: output under valgrind differs",
        exe.display()
    );
    let mut results = Vec::new();
    for (m, trace) in modules.iter().zip(&run.modules) {
        let cfg = Cfg::load(m);
        let ix = Index::new(&cfg);
        let (stats, bad) = oracle::check(&ix, trace, &Landmarks::of(m));
        assert!(
            stats.executed > 0,
            "{}: valgrind saw nothing executed in {}",
            exe.display(),
            m.display()
        );
        results.push((m.display().to_string(), stats, bad));
    }
    oracle::assert_clean(&exe.display().to_string(), &results, show());
}

#[test]
fn gzip_20k() {
    check_system("/usr/bin/gzip", &["-c"], &["/usr/bin/gzip"]);
}

#[test]
fn bzip2_20k_with_libbz2() {
    check_system(
        "/usr/bin/bzip2",
        &["-c"],
        &["/usr/bin/bzip2", "/lib/x86_64-linux-gnu/libbz2.so.1.0"],
    );
}

/// The oracle must be able to fail: on a real trace and CFG, deleting an
/// edge the run took, or an instruction it executed, must produce a
/// violation naming those addresses.
#[test]
fn oracle_catches_a_dropped_edge_and_instruction() {
    let exe = build("loops.c", Variant::new(Opt::O2, Link::Pie, false));
    let run = lackey::run(
        &exe,
        &[],
        std::slice::from_ref(&exe),
        &exe.display().to_string(),
        LogMode::Pipe,
    );
    let trace = &run.modules[0];
    let none = Landmarks::default();
    let cfg = Cfg::load(&exe);
    let (_, before) = oracle::check(&Index::new(&cfg), trace, &none);

    // An intra-procedure edge taken by the run, (last insn of A, start of
    // B), and the only edge from A to B.
    let (pi, ei, a, b) = cfg
        .procs
        .iter()
        .enumerate()
        .flat_map(|(pi, p)| {
            p.edges
                .iter()
                .enumerate()
                .map(move |(ei, e)| (pi, ei, p, e))
        })
        .find_map(|(pi, ei, p, e)| {
            let from = p.blocks.iter().find(|x| x.id == e.from)?;
            let to = p.blocks.iter().find(|x| Some(x.id) == e.to)?;
            let a = *from.insns.last()?;
            let parallel = p
                .edges
                .iter()
                .filter(|f| f.from == e.from && f.to == e.to)
                .count();
            (parallel == 1 && trace.pairs.contains(&(a, to.start))).then_some((pi, ei, a, to.start))
        })
        .expect("the loops run takes some edge of the CFG");
    let mut broken = cfg.clone();
    broken.procs[pi].edges.remove(ei);
    let (_, after) = oracle::check(&Index::new(&broken), trace, &none);
    let needle = format!("transfer {a:#x} ");
    assert!(
        after
            .iter()
            .any(|m| m.starts_with(&needle) && m.contains(&format!("-> {b:#x}"))),
        "dropping edge {a:#x} -> {b:#x} went unnoticed: {after:?}"
    );
    assert!(after.len() > before.len());

    // An executed instruction that is not a block's first one.
    let (pi, bi, x) = cfg
        .procs
        .iter()
        .enumerate()
        .flat_map(|(pi, p)| {
            p.blocks
                .iter()
                .enumerate()
                .map(move |(bi, bl)| (pi, bi, bl))
        })
        .find_map(|(pi, bi, bl)| {
            bl.insns
                .iter()
                .skip(1)
                .find(|x| trace.pairs.iter().any(|&(_, y)| y == **x))
                .map(|&x| (pi, bi, x))
        })
        .expect("the loops run executes some block with two instructions");
    let mut broken = cfg.clone();
    broken.procs[pi].blocks[bi].insns.retain(|&y| y != x);
    let (_, after) = oracle::check(&Index::new(&broken), trace, &none);
    assert!(
        after
            .iter()
            .any(|m| m.starts_with(&format!("executed address {x:#x} "))),
        "dropping instruction {x:#x} went unnoticed: {after:?}"
    );
}

/// The harness keeps lackey's logs for the runs of other tests
/// (`common::lackey_cache`) by content, not by name: `cat FILE` after FILE
/// changed is a new run and prints the new text; with the first text
/// again, the first run's kept log serves it. Two valgrind runs of cat
/// (about 1.5 s of CPU).
#[test]
fn a_kept_lackey_log_is_found_by_content() {
    let cat = PathBuf::from("/usr/bin/cat");
    let file = common::scratch("lackey-cache-test").join(std::process::id().to_string());
    let arg = file.display().to_string();
    let run = |text: &str| {
        std::fs::write(&file, text).unwrap();
        let modules = std::slice::from_ref(&cat);
        let pattern = lackey::symtab_pattern(modules);
        let r = lackey::run(&cat, &[&arg], modules, &pattern, LogMode::Pipe);
        assert!(r.status.success() && r.modules[0].executed > 0);
        String::from_utf8(r.stdout).unwrap()
    };
    assert_eq!(run("first\n"), "first\n");
    assert_eq!(run("second\n"), "second\n");
    assert_eq!(run("first\n"), "first\n");
    let _ = std::fs::remove_file(&file);
}

/// The rules themselves, on a hand-written CFG and hand-written traces:
/// every legal kind of transfer passes, and each illegal one is reported.
#[test]
fn oracle_rules_on_a_synthetic_cfg() {
    let json = serde_json::json!({
        "path": "synthetic", "elf_type": "pie", "summary": {},
        "procedures": [
            {"id": 0, "name": "f", "start": 0x100, "end": 0x112, "kind": "function",
             "blocks": [
                {"id": 0, "start": 0x100, "end": 0x108, "insns": [0x100, 0x104], "kind": "call"},
                {"id": 1, "start": 0x108, "end": 0x10c, "insns": [0x108], "kind": "plain"},
                {"id": 2, "start": 0x10c, "end": 0x10e, "insns": [0x10c], "kind": "plain"},
                {"id": 3, "start": 0x110, "end": 0x112, "insns": [0x110], "kind": "plain"}],
             "edges": [
                {"from": 0, "to": 1, "kind": "callreturn"},
                {"from": 1, "to": 2, "kind": "fallthrough"},
                {"from": 1, "to": 3, "kind": "taken"},
                {"from": 2, "to": "exit", "kind": "return"},
                {"from": 3, "to": "exit", "kind": "tailcall"}],
             "calls": [
                {"block": 0, "kind": "direct", "target": 0x200, "name": "g", "returns": true, "tail": false},
                {"block": 3, "kind": "direct", "target": 0x200, "name": "g", "returns": true, "tail": true}],
             "indirect_jumps": []},
            {"id": 1, "name": "g", "start": 0x200, "end": 0x204, "kind": "function",
             "blocks": [
                {"id": 0, "start": 0x200, "end": 0x202, "insns": [0x200], "kind": "plain"},
                {"id": 1, "start": 0x202, "end": 0x204, "insns": [0x202], "kind": "plain"}],
             "edges": [
                {"from": 0, "to": 1, "kind": "fallthrough"},
                {"from": 1, "to": "exit", "kind": "return"}],
             "calls": [], "indirect_jumps": []},
            {"id": 2, "name": "h", "start": 0x300, "end": 0x301, "kind": "function",
             "blocks": [{"id": 0, "start": 0x300, "end": 0x301, "insns": [0x300], "kind": "plain"}],
             "edges": [{"from": 0, "to": "exit", "kind": "return"}],
             "calls": [], "indirect_jumps": []}
        ]
    });
    let cfg = Cfg::from_json(&json);
    let ix = Index::new(&cfg);
    let none = Landmarks::default();
    let trace = |entries: &[u64], pairs: &[(u64, u64)]| lackey::ModuleTrace {
        entries: entries.iter().copied().collect(),
        pairs: pairs.iter().copied().collect(),
        ..Default::default()
    };
    let good = [
        (0x100, 0x104), // in block
        (0x104, 0x200), // call
        (0x200, 0x202), // fall-through edge (after a 2-byte `syscall`)
        (0x202, 0x108), // return to the callreturn successor
        (0x108, 0x10c), // fall-through edge
        (0x108, 0x110), // taken edge
        (0x110, 0x200), // tail call
        (0x10c, 0x10c), // rep self-transfer
    ];
    let (stats, bad) = oracle::check(&ix, &trace(&[0x100, 0x108], &good), &none);
    assert!(bad.is_empty(), "{bad:?}");
    assert_eq!(
        (
            stats.in_block,
            stats.calls,
            stats.returns,
            stats.edges,
            stats.tailcalls,
            stats.rep_self
        ),
        (1, 1, 1, 3, 1, 1)
    );
    // (entries, pairs, the start of the expected violation)
    type Case<'a> = (&'a [u64], &'a [(u64, u64)], &'a str);
    let cases: &[Case] = &[
        (&[0x100], &[(0x108, 0x104)], "transfer 0x108 "), // into a block's middle
        (&[0x100], &[(0x100, 0x108)], "transfer 0x100 "), // skips an instruction
        (&[0x100], &[(0x202, 0x10c)], "transfer 0x202 "), // return to no return address
        (&[0x100], &[(0x10c, 0x200)], "transfer 0x10c "), // return block jumping to a procedure
        (&[0x100], &[(0x110, 0x202)], "transfer 0x110 "), // tail call into a procedure's middle
        (&[0x100], &[(0x104, 0x106)], "executed address 0x106 "), // off boundary
        (&[0x104], &[], "entry into the module from outside at 0x104"),
        (&[0x100], &[(0x104, 0x300)], "transfer 0x104 "), // call to the wrong procedure
        (&[0x100], &[(0x110, 0x300)], "transfer 0x110 "), // tail call to the wrong procedure
        (&[0x400], &[], "executed address 0x400 "),
    ];
    // A landing pad (block start, after no call) is an entry only when the
    // LSDAs say so.
    let landing = trace(&[0x100, 0x110], &[]);
    let (_, bad) = oracle::check(&ix, &landing, &none);
    assert!(
        bad.iter()
            .any(|m| m.starts_with("entry into the module from outside at 0x110")),
        "{bad:?}"
    );
    let pads = Landmarks {
        landing_pads: [0x110].into_iter().collect(),
        ..Landmarks::default()
    };
    let (stats, bad) = oracle::check(&ix, &landing, &pads);
    assert!(bad.is_empty() && stats.landing_pads == 1, "{bad:?}");
    // A thread or child process resumes right after a system call.
    let resumed = |r: u64| lackey::ModuleTrace {
        entries: [0x100].into_iter().collect(),
        resumes: [r].into_iter().collect(),
        ..Default::default()
    };
    assert!(oracle::check(&ix, &resumed(0x202), &none).1.is_empty());
    let (_, bad) = oracle::check(&ix, &resumed(0x104), &none);
    assert!(
        bad.iter()
            .any(|m| m.starts_with("a new thread or process starts at 0x104")),
        "{bad:?}"
    );
    for (entries, pairs, needle) in cases {
        let (_, bad) = oracle::check(&ix, &trace(entries, pairs), &none);
        assert!(
            bad.iter().any(|m| m.starts_with(needle)),
            "{needle:?} not reported: {bad:?}"
        );
    }
}

/// The harness's address normalisation, checked against `nm`: in PIE,
/// non-PIE and static builds, the link-time addresses of `main` and of the
/// entry point `_start` are among the executed addresses, `_start` being the
/// module's first entry.
#[test]
fn lackey_addresses_normalise_to_link_time() {
    for link in [Link::Pie, Link::NoPie, Link::Static] {
        let exe = build("recursion.c", Variant::new(Opt::O0, link, false));
        let nm = std::process::Command::new("nm")
            .arg(&exe)
            .output()
            .expect("nm");
        let sym = |name: &str| -> u64 {
            String::from_utf8_lossy(&nm.stdout)
                .lines()
                .find_map(|l| {
                    let mut w = l.split_whitespace();
                    let (a, _, n) = (w.next()?, w.next()?, w.next()?);
                    (n == name).then(|| u64::from_str_radix(a, 16).unwrap())
                })
                .unwrap_or_else(|| panic!("nm: no {name} in {}", exe.display()))
        };
        let run = lackey::run(
            &exe,
            &[],
            std::slice::from_ref(&exe),
            &exe.display().to_string(),
            LogMode::Pipe,
        );
        let t = &run.modules[0];
        let executed = t.executed_addrs();
        for f in ["main", "_start", "fib", "ack", "msort"] {
            assert!(
                executed.contains(&sym(f)),
                "{link:?}: {f} at {:#x} not executed",
                sym(f)
            );
        }
        assert!(
            t.entries.contains(&sym("_start")),
            "{link:?}: _start is no entry"
        );
        assert!(
            t.executed > 1000,
            "{link:?}: only {} instructions",
            t.executed
        );
    }
}

/// The log reducer on a hand-written valgrind log: the load bias comes from
/// the symbol-table trace, instructions outside the module break the chain,
/// pairs are taken per thread across scheduler switches, a new thread
/// resumes from clone, and a signal handler is a chain of its own.
#[test]
fn lackey_log_reduction() {
    let log = "\
==1== Lackey, an example Valgrind tool
------ start ELF OBJECT -------------------------------------------------------
------ name = /usr/bin/true
rx_map:  avma 0x10a000   size 16384  foff 8192
PT_LOAD[3]:   acquired as rx, bias 0x108000
------ end ELF OBJECT -------------------------------------------------------
--1--   SCHED[1]:  acquired lock (thread_wrapper(starting new thread))
I  0010a000,4
 L 1ffefff000,8
I  0010a004,2
I  04001000,3
I  0010a010,1
--1--   SCHED[1]: releasing lock (VG_(client_syscall)[async]) -> VgTs_WaitSys
--1--   SCHED[2]:  acquired lock (thread_wrapper(starting new thread))
I  0010a100,2
I  0010a102,2
--1--   SCHED[2]: releasing lock (VG_(vg_yield)) -> VgTs_Yielding
--1--   SCHED[1]:  acquired lock (VG_(client_syscall)[async])
I  0010a011,2
--1-- delivering signal 10 (SIGUSR1):-6 to thread 1
--1-- push_signal_frame (thread 1): signal 10
I  0010a200,1
I  0010a201,1
I  0010a300,2
--1-- VG_(signal_return) (thread 1): isRT=1 valid magic; RIP=0x10a013
I  0010a013,2
--1--   SCHED[2]:  acquired lock (VG_(vg_yield))
I  0010a104,1
";
    let t = &lackey::reduce(log.as_bytes(), &[PathBuf::from("/usr/bin/true")])[0];
    assert_eq!(t.bias, Some(0x108000));
    assert_eq!(t.executed, 11);
    let mut pairs: Vec<(u64, u64)> = t.pairs.iter().copied().collect();
    pairs.sort_unstable();
    assert_eq!(
        pairs,
        [
            (0x2000, 0x2004),
            (0x2010, 0x2011),
            (0x2011, 0x2013),
            (0x2100, 0x2102),
            (0x2102, 0x2104),
            (0x2200, 0x2201),
            (0x2201, 0x2300),
        ]
    );
    let mut entries: Vec<u64> = t.entries.iter().copied().collect();
    entries.sort_unstable();
    assert_eq!(entries, [0x2000, 0x2010, 0x2200]);
    // Thread 2 starts by returning from clone.
    assert_eq!(t.resumes.iter().copied().collect::<Vec<_>>(), [0x2100]);
}
