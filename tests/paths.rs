//! `aetrace paths` against valgrind lackey (DESIGN.md, oracles): the
//! profiled run's stdout and exit status equal the native run's; then the
//! test rebuilds every Ball-Larus path from lackey's instruction sequence of
//! the native program and requires the same paths with the same counts.
//!
//! The oracle shares no code with aetrace. It takes from our profile only
//! the *structure* (each procedure's block start addresses, its entry, its
//! edges and which of them are back edges), walks lackey's sequence of
//! block starts keeping a stack of activations (a new procedure entry that
//! is not a local successor pushes one; leaving through an edge to EXIT
//! ends one), cuts each activation's blocks at the back edges, and counts
//! each distinct `(procedure, start, blocks, end)`. Frames still active when
//! the process ends count as paths ending `active` at their call block.
//! Our side is the path ids counted by the instrumented program, turned
//! back into blocks by the profile (paper 001's regeneration): any wrong
//! increment, register or counter shows as a difference.

use crate::common;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use common::build::{build, run_native, Link, Opt, Variant};
use common::elf::Elf;
use common::lackey::{self, Capture, LogMode};

const O2_PIE: Variant = Variant::new(Opt::O2, Link::Pie, false);
const O0_NOPIE: Variant = Variant::new(Opt::O0, Link::NoPie, false);

/// One procedure's structure as the profile gives it.
struct Proc {
    name: String,
    mode: String,
    entry: usize,
    starts: Vec<u64>,
    /// Local successors of each block (blocks, not EXIT).
    succ: Vec<HashSet<usize>>,
    /// Blocks with an edge to EXIT.
    exits: Vec<bool>,
    back: HashSet<(usize, usize)>,
}

/// `(procedure, start, block addresses, end)`.
type Key = (String, String, Vec<u64>, String);

/// One `--libs` section: DT_NEEDED name, file, procedures, paths.
type LibSection = (String, PathBuf, Vec<Proc>, BTreeMap<Key, u64>);

struct Profile {
    procs: Vec<Proc>,
    paths: BTreeMap<Key, u64>,
    /// The `--libs` sections.
    libs: Vec<LibSection>,
    json: serde_json::Value,
}

fn read_profile(path: &Path) -> Profile {
    let v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(path).expect("path profile")).expect("JSON");
    let (procs, paths) = read_section(&v["procs"]);
    let libs = v["libs"]
        .as_array()
        .map(|ls| {
            ls.iter()
                .map(|l| {
                    let (procs, paths) = read_section(&l["procs"]);
                    (
                        l["name"].as_str().unwrap().to_string(),
                        PathBuf::from(l["path"].as_str().unwrap()),
                        procs,
                        paths,
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    Profile {
        procs,
        paths,
        libs,
        json: v,
    }
}

/// One module's procedures and paths.
fn read_section(section: &serde_json::Value) -> (Vec<Proc>, BTreeMap<Key, u64>) {
    let mut procs = Vec::new();
    let mut paths = BTreeMap::new();
    for p in section.as_array().unwrap() {
        let mode = p["mode"].as_str().unwrap().to_string();
        if mode.is_empty() {
            continue; // left alone: untraced code, like a library
        }
        let name = p["name"].as_str().unwrap().to_string();
        let starts: Vec<u64> = p["blocks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b["start"].as_u64().unwrap())
            .collect();
        let n = starts.len();
        let mut succ = vec![HashSet::new(); n];
        let mut exits = vec![false; n];
        for e in p["edges"].as_array().unwrap() {
            let (f, t) = (
                e[0].as_u64().unwrap() as usize,
                e[1].as_u64().unwrap() as usize,
            );
            if t == n {
                exits[f] = true;
            } else {
                succ[f].insert(t);
            }
        }
        let back = p["back_edges"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| {
                (
                    e[0].as_u64().unwrap() as usize,
                    e[1].as_u64().unwrap() as usize,
                )
            })
            .collect();
        for q in p["paths"].as_array().unwrap() {
            let blocks = q["blocks"]
                .as_array()
                .unwrap()
                .iter()
                .map(|b| starts[b.as_u64().unwrap() as usize])
                .collect();
            let key = (
                name.clone(),
                q["start"].as_str().unwrap().to_string(),
                blocks,
                q["end"].as_str().unwrap().to_string(),
            );
            let old = paths.insert(key, q["count"].as_u64().unwrap());
            assert!(old.is_none(), "{name}: a path listed twice");
        }
        procs.push(Proc {
            name,
            mode,
            entry: p["entry"].as_u64().unwrap() as usize,
            starts,
            succ,
            exits,
            back,
        });
    }
    (procs, paths)
}

/// One activation of the oracle's stack.
struct Act {
    proc: usize,
    start: &'static str,
    blocks: Vec<usize>,
}

/// The paths of lackey's per-thread sequences (link-time addresses).
fn oracle(procs: &[Proc], seqs: &[Vec<u64>], elf: &Elf) -> BTreeMap<Key, u64> {
    let mut at: HashMap<u64, Vec<(usize, usize)>> = HashMap::new();
    for (i, p) in procs.iter().enumerate() {
        for (b, &s) in p.starts.iter().enumerate() {
            at.entry(s).or_default().push((i, b));
        }
    }
    let mut out: BTreeMap<Key, u64> = BTreeMap::new();
    let mut emit = |a: &Act, end: &str| {
        let p = &procs[a.proc];
        let key = (
            p.name.clone(),
            a.start.to_string(),
            a.blocks.iter().map(|&b| p.starts[b]).collect(),
            end.to_string(),
        );
        *out.entry(key).or_default() += 1;
    };
    let mut rep: HashMap<u64, bool> = HashMap::new();
    for seq in seqs {
        let mut stack: Vec<Act> = Vec::new();
        let mut prev = None;
        for &a in seq {
            // Valgrind runs each iteration of a `rep` instruction apart.
            let again = prev == Some(a) && *rep.entry(a).or_insert_with(|| elf.is_rep(a));
            prev = Some(a);
            let Some(cands) = at.get(&a).filter(|_| !again) else {
                continue;
            };
            loop {
                if let Some(top) = stack.last_mut() {
                    let p = &procs[top.proc];
                    let b = *top.blocks.last().unwrap();
                    let local = cands
                        .iter()
                        .find(|&&(q, t)| q == top.proc && p.succ[b].contains(&t));
                    if let Some(&(_, t)) = local {
                        if p.back.contains(&(b, t)) {
                            let done = std::mem::replace(
                                top,
                                Act {
                                    proc: top.proc,
                                    start: "loop",
                                    blocks: vec![t],
                                },
                            );
                            emit(&done, "back");
                        } else {
                            top.blocks.push(t);
                        }
                        break;
                    }
                    if p.exits[b] {
                        let done = stack.pop().unwrap();
                        emit(&done, "exit");
                        continue;
                    }
                }
                let Some(&(q, t)) = cands.iter().find(|&&(q, t)| procs[q].entry == t) else {
                    let top = stack.last().map(|t| {
                        let p = &procs[t.proc];
                        format!(
                            "{} block {:#x}",
                            p.name,
                            p.starts[*t.blocks.last().unwrap()]
                        )
                    });
                    panic!("oracle: {a:#x} is neither a successor of {top:?} nor an entry");
                };
                stack.push(Act {
                    proc: q,
                    start: "entry",
                    blocks: vec![t],
                });
                break;
            }
        }
        // The process ended: the innermost frame left through an edge to
        // EXIT (exit, abort) when its block has one, the others are active.
        let mut innermost = true;
        while let Some(a) = stack.pop() {
            let b = *a.blocks.last().unwrap();
            let end = if innermost && procs[a.proc].exits[b] {
                "exit"
            } else {
                "active"
            };
            emit(&a, end);
            innermost = false;
        }
    }
    out
}

/// Runs `aetrace paths [--libs L] -- exe args`; checks stdout and status
/// against the native run; returns the profile file.
fn run_paths(exe: &Path, args: &[&str], tag: &str, libs: &[&str]) -> PathBuf {
    let file = common::scratch("paths").join(format!("{tag}.apath"));
    let report = common::scratch("paths").join(format!("{tag}.txt"));
    let native = run_native(exe, args);
    let mut cmd = Command::new(common::aetrace());
    cmd.arg("paths")
        .arg("-o")
        .arg(&file)
        .arg("--report")
        .arg(&report);
    if !libs.is_empty() {
        cmd.args(["--libs", &libs.join(",")]);
    }
    let out = cmd
        .arg("--")
        .arg(exe)
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert_eq!(
        out.stdout,
        native.stdout,
        "{tag}: stdout differs; stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        out.status.code(),
        native.status.code(),
        "{tag}: exit status; stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(&report).unwrap();
    assert!(text.starts_with("program: "), "{tag}: report: {text}");
    file
}

/// Our paths equal the oracle's, path for path and count for count.
fn check(exe: &Path, args: &[&str], tag: &str) -> Profile {
    check_with(exe, args, tag, &[], false)
}

/// [`check`] with `--libs libs`, each library's section against lackey's
/// sequences of that library; `killed`: the process died by a signal, so
/// frames it left are not compared (only frames at a call that may `exit`
/// are counted).
fn check_with(exe: &Path, args: &[&str], tag: &str, libs: &[&str], killed: bool) -> Profile {
    let file = run_paths(exe, args, tag, libs);
    let prof = read_profile(&file);
    assert_eq!(
        prof.libs.iter().map(|l| l.0.as_str()).collect::<Vec<_>>(),
        libs,
        "{tag}: library sections"
    );
    let files: Vec<PathBuf> = std::iter::once(exe.to_path_buf())
        .chain(prof.libs.iter().map(|l| l.1.clone()))
        .collect();
    let run = lackey::run_with(exe, args, &files, LogMode::Pipe, Capture::Sequences);
    let sections =
        std::iter::once((&prof.procs, &prof.paths)).chain(prof.libs.iter().map(|l| (&l.2, &l.3)));
    for (m, (procs, paths)) in sections.enumerate() {
        let seqs: Vec<Vec<u64>> = run.modules[m].sequences.values().cloned().collect();
        let tag = format!("{tag} {}", files[m].display());
        compare(procs, paths, &seqs, &Elf::read(&files[m]), killed, &tag);
    }
    prof
}

/// One module's paths against the oracle's from lackey's sequences.
fn compare(
    procs: &[Proc],
    paths: &BTreeMap<Key, u64>,
    seqs: &[Vec<u64>],
    elf: &Elf,
    killed: bool,
    tag: &str,
) {
    let mut want = oracle(procs, seqs, elf);
    // Edge-profiled procedures have no paths to compare.
    let edges: HashSet<&str> = procs
        .iter()
        .filter(|p| p.mode == "edges")
        .map(|p| p.name.as_str())
        .collect();
    let ignored = |k: &Key| killed && k.3 == "active";
    want.retain(|k, _| !edges.contains(k.0.as_str()) && !ignored(k));
    let mut diffs = Vec::new();
    for (k, &n) in &want {
        match paths.get(k) {
            Some(&m) if m == n => {}
            m => diffs.push(format!("{k:x?}: lackey {n}, ours {m:?}")),
        }
    }
    for (k, &m) in paths {
        if !want.contains_key(k) && !ignored(k) {
            diffs.push(format!("{k:x?}: lackey none, ours {m}"));
        }
    }
    assert!(
        diffs.is_empty(),
        "{tag}: {} of {} paths differ, e.g.:\n{}",
        diffs.len(),
        want.len(),
        diffs[..diffs.len().min(8)].join("\n")
    );
    assert!(!want.is_empty(), "{tag}: no paths at all");
}

fn traced(source: &str, v: Variant, args: &[&str]) -> Profile {
    let exe = build(source, v);
    let tag = format!("{}-{}", source.replace('.', "_"), v.tag());
    check(&exe, args, &tag)
}

#[test]
fn loops() {
    let p = traced("loops.c", O2_PIE, &["12"]);
    // Loops: paths after back edges, ending at back edges.
    assert!(p.paths.keys().any(|k| k.1 == "loop" && k.3 == "back"));
    traced("loops.c", O0_NOPIE, &["7"]);
}

#[test]
fn nested_if_and_switch() {
    traced("nested_if.c", O2_PIE, &[]);
    traced("nested_if.c", O0_NOPIE, &["x"]);
    traced("switch.c", O2_PIE, &[]);
}

#[test]
fn recursion_and_tail_calls() {
    traced("recursion.c", O2_PIE, &[]);
    traced("recursion.c", O0_NOPIE, &[]);
    traced("tailcall.c", O2_PIE, &[]);
}

#[test]
fn callbacks_from_libc() {
    traced("qsort_callback.c", O2_PIE, &[]);
    traced("fnptr.c", O2_PIE, &[]);
}

/// exit() with frames active: their paths end `active` at the call.
#[test]
fn exit_with_frames_active() {
    let p = traced("exit_nested.c", O2_PIE, &[]);
    assert!(
        p.paths.keys().any(|k| k.3 == "active"),
        "no active frame at exit"
    );
    traced("exit_nested.c", O0_NOPIE, &[]);
}

#[test]
fn debian_gzip() {
    check(
        Path::new("/usr/bin/gzip"),
        &["-c", common::text_20k()],
        "gzip",
    );
}

/// `--libs`: a library's paths (its own section, against lackey's
/// sequence of the library), callbacks into the executable included; and
/// Debian's bzip2 with libbz2, where gcc's -fipa-ra keeps r11 live across
/// a local call (a path entry that took r11 for dead broke bzip2).
#[test]
fn libraries() {
    let exe = common::build::build_with_lib("shlib_callback", "libaecb.so.1", false);
    let p = check_with(&exe, &["300"], "shlib_callback", &["libaecb.so.1"], false);
    assert!(p.libs[0]
        .3
        .keys()
        .any(|k| k.0 == "lib_sort" && k.3 == "back"));
    let input = common::scratch("inputs").join("paths-bzip2");
    std::fs::write(&input, common::text_input(5_000)).unwrap();
    check_with(
        Path::new("/usr/bin/bzip2"),
        &["-c", input.to_str().unwrap()],
        "bzip2-libs",
        &["libbz2.so.1.0"],
        false,
    );
}

/// A procedure with more paths than the limit is edge-profiled, as
/// documented, and the profile says so; its block counts equal lackey's.
#[test]
fn too_many_paths_falls_back_to_edges() {
    let exe = build("many_paths.c", O2_PIE);
    let p = check(&exe, &["5"], "many_paths");
    let q = p.json["procs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|q| q["name"] == "main")
        .unwrap();
    assert_eq!(q["mode"], "edges", "main has 2^20 paths");
    assert!(q["num_paths"].as_u64() == Some(0) && q["paths"].as_array().unwrap().is_empty());
    let counts = q["edge_counts"]["blocks"].as_array().unwrap();
    let starts: Vec<u64> = q["blocks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["start"].as_u64().unwrap())
        .collect();
    let run = lackey::run_with(
        &exe,
        &["5"],
        std::slice::from_ref(&exe),
        LogMode::Pipe,
        Capture::Sequences,
    );
    let mut seen: HashMap<u64, u64> = HashMap::new();
    for s in run.modules[0].sequences.values() {
        for &a in s {
            *seen.entry(a).or_default() += 1;
        }
    }
    for (s, n) in starts.iter().zip(counts) {
        assert_eq!(
            seen.get(s).copied().unwrap_or(0),
            n.as_u64().unwrap(),
            "block {s:#x} of main"
        );
    }
    let report = std::fs::read_to_string(common::scratch("paths").join("many_paths.txt")).unwrap();
    assert!(
        report.contains("edge-profiled") && report.contains("main"),
        "{report}"
    );
}

/// A program killed by SIGKILL leaves a readable path profile with the
/// paths it completed.
#[test]
fn sigkill_leaves_the_profile() {
    let exe = build("self_kill.c", O2_PIE);
    let p = check_with(&exe, &[], "self_kill", &[], true);
    assert_eq!(p.json["status"], "killed by signal 9");
    let main_loop: u64 = p
        .paths
        .iter()
        .filter(|(k, _)| k.0 == "main" && k.3 == "back")
        .map(|(_, n)| n)
        .sum();
    assert!(main_loop >= 1233, "main's loop paths: {main_loop}");
}

/// Threads: each gets its own path register stack at its first outside
/// entry; counters are shared (`lock add`).
#[test]
fn threads() {
    traced("threads.c", O2_PIE, &[]);
    traced("threads.c", O0_NOPIE, &[]);
    // Workers in traced procedures at the same time (a shared register
    // gives wrong paths here: measured with the owner check disabled).
    traced("threads_paths.c", O2_PIE, &["20000"]);
}

/// A static glibc program: its libc, startup and `exit` included, is
/// path-profiled (procedures with too many paths edge-profiled). The
/// oracle (`oracle`, on the native run single-stepped: valgrind's CPUID
/// would send the libc down other paths) is compared on the program's own
/// procedures, those `nm -l` places in the `traces/` source: the libc's
/// startup code walks the program headers and reads `/proc/self/exe`,
/// which rewriting changes, so its paths are the rewritten program's.
/// Every other procedure's paths still pass through the oracle's stack
/// walk, which fails on any block it cannot place.
#[test]
fn static_executable() {
    let exe = common::scratch("paths").join("calltree-static-g");
    common::build::run_checked(
        Command::new("gcc")
            .args(["-O2", "-g", "-static", "-o"])
            .arg(&exe)
            .arg(common::repo_root().join("traces").join("calltree.c")),
        "gcc -static calltree.c",
    );
    let prof = check_own(&exe, &["40"], "calltree-static");
    // The libc is profiled too.
    assert!(
        prof.paths.keys().any(|k| k.0 == "__libc_start_call_main"),
        "no libc paths"
    );
    // Threads: the first thread is not known at a static program's entry
    // point (no TLS yet), so its path registers could not be told apart.
    let exe = build("threads.c", Variant::new(Opt::O2, Link::Static, false));
    refused(&exe, "static executable that can start threads");
}

/// `aetrace paths` refuses `exe` before running it, with exit status 1 and
/// a message containing `why`.
fn refused(exe: &Path, why: &str) {
    let out = Command::new(common::aetrace())
        .args(["paths", "--"])
        .arg(exe)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{}: {err}", exe.display());
    assert!(
        err.contains(why) && out.stdout.is_empty(),
        "{}: {err}",
        exe.display()
    );
}

/// [`check`] restricted to the procedures `nm -l` places in `traces/`,
/// against the native run single-stepped.
fn check_own(exe: &Path, args: &[&str], tag: &str) -> Profile {
    let file = run_paths(exe, args, tag, &[]);
    let prof = read_profile(&file);
    let nm = common::build::run_checked(
        Command::new("nm").args(["-l", "--defined-only"]).arg(exe),
        "nm -l",
    );
    let own: HashSet<String> = String::from_utf8_lossy(&nm.stdout)
        .lines()
        .filter(|l| l.contains("/traces/"))
        .filter_map(|l| l.split_whitespace().nth(2).map(str::to_string))
        .collect();
    assert!(own.contains("main"), "{tag}: own procedures {own:?}");
    let stepped = common::singlestep::run(exe, None, args, &[]);
    let elf = Elf::read(exe);
    let mut want = oracle(&prof.procs, &[stepped.rips], &elf);
    want.retain(|k, _| own.contains(&k.0));
    let ours: BTreeMap<&Key, u64> = prof
        .paths
        .iter()
        .filter(|(k, _)| own.contains(&k.0))
        .map(|(k, &n)| (k, n))
        .collect();
    let mut diffs = Vec::new();
    for (k, &n) in &want {
        if ours.get(k) != Some(&n) {
            diffs.push(format!("{k:x?}: stepped {n}, ours {:?}", ours.get(k)));
        }
    }
    for (k, &m) in &ours {
        if !want.contains_key(*k) {
            diffs.push(format!("{k:x?}: stepped none, ours {m}"));
        }
    }
    assert!(
        diffs.is_empty(),
        "{tag}: {} paths differ:\n{}",
        diffs.len(),
        diffs[..diffs.len().min(8)].join("\n")
    );
    assert!(!want.is_empty(), "{tag}: no paths of the program's own");
    eprintln!(
        "{tag}: {} paths of {} own procedures compared; {} paths in all",
        want.len(),
        own.len(),
        prof.paths.len()
    );
    prof
}

/// Programs whose shadow stack could not stay exact (frames abandoned by
/// longjmp or C++ exceptions, a vfork child in its parent's memory) are
/// refused with a message naming why,
/// before the program runs.
#[test]
fn longjmp_exceptions_and_vfork_are_refused() {
    for (src, why) in [
        ("setjmp.c", "setjmp/longjmp"),
        ("cxx_exceptions.cpp", "landing pad"),
        ("vfork.c", "vfork"),
        ("fork.c", "fork"),
    ] {
        refused(&build(src, O2_PIE), why);
    }
}

/// `--json --top K`: the hottest procedures and paths, each block with its
/// `file:line` from DWARF (a `-g` build), counts as in the profile.
#[test]
fn json_report_with_source_lines() {
    let dir = common::scratch("paths");
    let exe = dir.join("loops-g");
    let src = common::repo_root().join("traces/loops.c");
    let ok = Command::new("gcc")
        .args(["-O2", "-g", "-o"])
        .arg(&exe)
        .arg(&src)
        .status()
        .unwrap();
    assert!(ok.success());
    let (file, report) = (dir.join("loops-g.apath"), dir.join("loops-g.json"));
    let out = Command::new(common::aetrace())
        .args(["paths", "--json", "--top", "2", "-o"])
        .arg(&file)
        .arg("--report")
        .arg(&report)
        .arg("--")
        .arg(&exe)
        .arg("9")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: serde_json::Value = serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
    let procs = r["procedures"].as_array().unwrap();
    assert!(!procs.is_empty() && procs.len() <= 2);
    let prof = read_profile(&file);
    for p in procs {
        let name = p["name"].as_str().unwrap();
        let paths = p["paths"].as_array().unwrap();
        assert!(!paths.is_empty() && paths.len() <= 2, "{name}");
        for q in paths {
            let blocks: Vec<u64> = q["blocks"]
                .as_array()
                .unwrap()
                .iter()
                .map(|b| b["address"].as_u64().unwrap())
                .collect();
            let key = (
                name.to_string(),
                q["start"].as_str().unwrap().to_string(),
                blocks,
                q["end"].as_str().unwrap().to_string(),
            );
            assert_eq!(
                prof.paths.get(&key),
                q["count"].as_u64().as_ref(),
                "{key:x?}"
            );
            if name == "main" {
                let src = q["blocks"][0]["source"].as_str().unwrap_or("");
                assert!(src.contains("loops.c:"), "{name}: {src}");
            }
        }
    }
    assert!(procs.iter().any(|p| p["name"] == "main"), "{r}");
}
