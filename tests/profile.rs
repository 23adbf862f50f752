//! `aetrace profile` against callgrind (DESIGN.md, oracles): the profiled
//! run's stdout, stderr and exit status equal the native run's; then, for
//! every instruction of the executable's own code (`.text`: callgrind
//! charges `.plt*` and `.init` to an unnamed object), the recovered
//! execution count equals callgrind's Ir, every conditional jump's taken
//! count equals callgrind's `jcnd` count, and `callgrind_annotate` prints
//! the same per-function totals for our callgrind-format output as for
//! callgrind's own. Counts come from counters on the chords of a maximum
//! spanning tree only (paper 003 Section 3), so each equality exercises
//! count recovery, the early-exit correction and the counter placement.

use crate::common;

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use common::build::{build, run_native, Link, Opt, Variant};
use common::callgrind;
use common::elf::Elf;

const O2_PIE: Variant = Variant::new(Opt::O2, Link::Pie, false);
const O0_NOPIE: Variant = Variant::new(Opt::O0, Link::NoPie, false);

/// Our counts from a profile: Ir per instruction, taken count per
/// conditional jump, and the instructions of procedures left alone.
struct Ours {
    ir: HashMap<u64, u64>,
    taken: HashMap<u64, u64>,
    left_alone: Vec<String>,
    placement_counters: u64,
    /// The procedure of each counted instruction.
    proc_of: HashMap<u64, String>,
    /// Blocks executed and invocations, over all profiled procedures.
    blocks: u64,
    calls: u64,
}

fn read_profile(path: &Path) -> Ours {
    read_module(path, None)
}

/// The profile file's section of library `lib` (its DT_NEEDED name), or of
/// the executable.
fn section(path: &Path, lib: Option<&str>) -> serde_json::Value {
    let v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(path).expect("profile file")).expect("JSON");
    match lib {
        None => v,
        Some(l) => v["libs"]
            .as_array()
            .expect("libs in the profile")
            .iter()
            .find(|s| s["name"] == l)
            .unwrap_or_else(|| panic!("no section for {l}"))
            .clone(),
    }
}

/// [`read_profile`] for the executable (`None`) or a library.
fn read_module(path: &Path, lib: Option<&str>) -> Ours {
    let v = section(path, lib);
    let mut ours = Ours {
        ir: HashMap::new(),
        taken: HashMap::new(),
        left_alone: Vec::new(),
        placement_counters: 0,
        proc_of: HashMap::new(),
        blocks: 0,
        calls: 0,
    };
    for p in v["procs"].as_array().unwrap() {
        let name = p["name"].as_str().unwrap();
        if let Some(why) = p.get("left_alone") {
            ours.left_alone.push(format!("{name}: {why}"));
            continue;
        }
        assert!(
            p.get("error").is_none(),
            "{name}: counts not recovered: {}",
            p["error"]
        );
        ours.placement_counters += p["counters"].as_array().unwrap().len() as u64;
        let counts = &p["counts"];
        ours.calls += counts["invocations"].as_u64().unwrap();
        let blocks = p["blocks"].as_array().unwrap();
        for (b, n) in blocks.iter().zip(counts["blocks"].as_array().unwrap()) {
            let n = n.as_u64().unwrap();
            ours.blocks += n;
            let start = b["start"].as_u64().unwrap();
            for off in b["insns"].as_array().unwrap() {
                let a = start + off.as_u64().unwrap();
                *ours.ir.entry(a).or_default() += n;
                ours.proc_of.insert(a, name.to_string());
            }
        }
        let kinds: Vec<(u64, &str)> = p["edges"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| (e[0].as_u64().unwrap(), e[2].as_str().unwrap()))
            .collect();
        // A conditional jump: a block with a taken and a fall-through edge
        // (callgrind's `jcnd`; unconditional jumps are `jump=`).
        let conditional = |b: u64| {
            kinds.iter().any(|&(f, k)| f == b && k == "taken")
                && kinds.iter().any(|&(f, k)| f == b && k == "fall")
        };
        let Some(edges) = counts["edges"].as_array() else {
            continue;
        };
        for (e, n) in p["edges"].as_array().unwrap().iter().zip(edges) {
            if e[2] == "taken" && conditional(e[0].as_u64().unwrap()) {
                let b = &blocks[e[0].as_u64().unwrap() as usize];
                let last = b["start"].as_u64().unwrap()
                    + b["insns"]
                        .as_array()
                        .unwrap()
                        .last()
                        .unwrap()
                        .as_u64()
                        .unwrap();
                *ours.taken.entry(last).or_default() += n.as_u64().unwrap();
            }
        }
    }
    ours
}

/// Address ranges of the executable's code callgrind charges to it.
fn text_ranges(exe: &Path) -> Vec<(u64, u64)> {
    Elf::read(exe)
        .sections
        .iter()
        .filter(|s| s.exec && !s.name.starts_with(".plt") && s.name != ".init" && s.name != ".fini")
        .map(|s| (s.addr, s.addr + s.size))
        .collect()
}

fn profile(exe: &Path, args: &[&str], tag: &str, extra: &[&str]) -> (PathBuf, PathBuf) {
    let dir = common::scratch("profile");
    let prof = dir.join(format!("{tag}.aprof"));
    let cg = dir.join(format!("{tag}.aetrace.cg"));
    let native = run_native(exe, args);
    let out = Command::new(common::aetrace())
        .arg("profile")
        .arg("-o")
        .arg(&prof)
        .arg("--callgrind")
        .arg(&cg)
        .args(extra)
        .arg("--")
        .arg(exe)
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&native.stdout),
        "{tag}: stdout"
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&native.stderr),
        "{tag}: stderr"
    );
    assert_eq!(
        out.status.code(),
        native.status.code(),
        "{tag}: exit status"
    );
    (prof, cg)
}

/// Profiles `exe args` and checks it against callgrind (module comment).
/// Returns the number of inclusive costs compared.
fn check(exe: &Path, args: &[&str], tag: &str) -> usize {
    check_libs(exe, args, tag, &[]).compared
}

/// What [`check_libs`] measured besides its checks.
struct Checked {
    /// Inclusive costs compared.
    compared: usize,
    /// Callgrind's Ir in the profiled modules' `.text` (a `rep`
    /// instruction of a counted procedure counted once per execution, as
    /// `aetrace count` counts it), left-alone procedures included.
    callgrind_text_ir: u64,
    /// Our instruction count outside `.text` (PLT stubs, `.init`,
    /// `.fini`), which callgrind charges to no object.
    outside_text: u64,
    /// `aetrace count --event insns` with the same `--libs`.
    insns: u64,
}

/// [`check`] with `--libs LIBS`: every module, the executable and each
/// library, against callgrind's costs for that object; `count --libs`
/// against the sum over the modules.
fn check_libs(exe: &Path, args: &[&str], tag: &str, libs: &[&str]) -> Checked {
    let extra: Vec<String> = if libs.is_empty() {
        Vec::new()
    } else {
        vec!["--libs".into(), libs.join(",")]
    };
    let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
    let (prof, cg) = profile(exe, args, tag, &extra);
    let vg = common::scratch("profile").join(format!("{tag}.callgrind.out"));
    callgrind::run(exe, args, &vg);
    let mut totals = (0u64, 0u64, 0u64);
    let (mut callgrind_text_ir, mut outside_text) = (0, 0);
    let mut modules = Vec::new();
    for lib in std::iter::once(None).chain(libs.iter().map(|l| Some(*l))) {
        let ours = read_module(&prof, lib);
        // Callgrind names a library by its file (symlinks resolved), as
        // the profile does.
        let file = match lib {
            None => exe.canonicalize().unwrap(),
            Some(l) => PathBuf::from(section(&prof, Some(l))["path"].as_str().unwrap()),
        };
        let tag = format!("{tag} {}", lib.unwrap_or("(executable)"));
        let (reps, theirs, outside) = check_module(&file, &ours, &cg, &vg, &tag);
        callgrind_text_ir += theirs;
        outside_text += outside;
        let alone: HashSet<String> = ours
            .left_alone
            .iter()
            .map(|l| l.split(": ").next().unwrap().to_string())
            .collect();
        modules.push((file, reps, alone));
        totals.0 += ours.ir.values().sum::<u64>();
        totals.1 += ours.blocks;
        totals.2 += ours.calls;
    }
    let compared = check_inclusive(&cg, &vg, &modules, tag);
    // `aetrace count` (one counter per module, chord increments, paper
    // 002) gives the totals of the profile, itself equal to callgrind's.
    let mut insns = 0;
    for (event, want) in [
        ("insns", totals.0),
        ("blocks", totals.1),
        ("calls", totals.2),
    ] {
        let n = count(exe, args, event, tag, &extra);
        assert_eq!(n, want, "{tag}: aetrace count --event {event} {extra:?}");
        if event == "insns" {
            insns = n;
        }
    }
    Checked {
        compared,
        callgrind_text_ir,
        outside_text,
        insns,
    }
}

/// A profiled module: its file, callgrind's extra `rep` iterations per
/// function, the procedures the profile left alone.
type Module = (PathBuf, HashMap<String, u64>, HashSet<String>);

/// `callgrind_annotate --inclusive=yes` on our file and on callgrind's
/// agree on the inclusive cost of every function of the profiled `modules`
/// (each with its `rep` extras) where both are exact: callgrind's call
/// graph below it stays in the profiled modules (PLT stubs included: both
/// count their instructions; not an IFUNC's, whose target the profile
/// cannot know), has no recursion, and each function in it costs the same
/// per call at every call site callgrind saw (an edge profile shares a
/// callee's cost among its call sites in proportion to their counts, which
/// is exact then), with no indirect call or jump (the profile does not
/// know their callees). Functions that call nothing are compared by
/// [`check_module`].
fn check_inclusive(cg: &Path, vg: &Path, modules: &[Module], tag: &str) -> usize {
    use callgrind::Func;
    let calls = callgrind::calls(vg);
    let profiled = |f: &Func| {
        modules.iter().any(|(m, _, alone)| {
            m.to_str() == Some(f.0.as_str()) && !alone.contains(&callgrind::normal_name(&f.1))
        })
    };
    let mut into: HashMap<&Func, Vec<(u64, u64)>> = HashMap::new();
    let mut succ: HashMap<&Func, Vec<&Func>> = HashMap::new();
    // Functions with an indirect call or jump callgrind followed: the
    // profile does not know where those go.
    let mut indirect: HashSet<&Func> = HashSet::new();
    let mut elves: HashMap<&str, Elf> = HashMap::new();
    for c in &calls {
        if profiled(&c.caller) {
            let elf = elves
                .entry(c.caller.0.as_str())
                .or_insert_with(|| Elf::read(Path::new(&c.caller.0)));
            if elf.branch_at(c.site).1 {
                indirect.insert(&c.caller);
            }
        }
        into.entry(&c.callee)
            .or_default()
            .push((c.count, c.inclusive));
        succ.entry(&c.caller).or_default().push(&c.callee);
    }
    // Every call to `g` costs the same.
    let uniform = |g: &Func| {
        let lines = into.get(g).map_or(&[][..], Vec::as_slice);
        lines.iter().all(|&(n, c)| {
            u128::from(c) * u128::from(lines[0].0) == u128::from(lines[0].1) * u128::from(n)
        })
    };
    let plt_to_named = |g: &Func| {
        g.1.ends_with("[PLT]")
            && succ
                .get(g)
                .into_iter()
                .flatten()
                .all(|h| !h.1.starts_with("0x"))
    };
    // The functions below `f`, if its inclusive cost is exact (a
    // depth-first search: a vertex met again on the path is recursion).
    let below = |f: &Func| -> Option<Vec<Func>> {
        if indirect.contains(f) {
            return None;
        }
        let mut done: HashSet<&Func> = HashSet::new();
        let mut path: Vec<(&Func, usize)> = vec![(f, 0)];
        while let Some((g, i)) = path.last_mut() {
            let Some(&h) = succ.get(*g).and_then(|s| s.get(*i)) else {
                done.insert(*g);
                path.pop();
                continue;
            };
            *i += 1;
            if path.iter().any(|(p, _)| *p == h) {
                return None;
            }
            if done.contains(h) {
                continue;
            }
            if !(profiled(h) || plt_to_named(h)) || !uniform(h) || indirect.contains(h) {
                return None;
            }
            path.push((h, 0));
        }
        done.remove(f);
        Some(done.into_iter().cloned().collect())
    };
    // Self costs per (object, function), callgrind's with its `rep`
    // extras taken off: both files must cut the code into the same
    // functions (callgrind's are guesses in stripped code).
    let mut selves: HashMap<(String, String), (u64, u64)> = HashMap::new();
    for (file, reps, _) in modules {
        let module = file.file_name().unwrap().to_str().unwrap();
        let object = file.to_str().unwrap().to_string();
        let ours = callgrind::annotate(cg, module);
        for (f, t) in callgrind::annotate(vg, module) {
            let o = ours.get(&f).copied().unwrap_or(0);
            let r = reps.get(&f).copied().unwrap_or(0);
            selves.insert((object.clone(), f), (o, t.saturating_sub(r)));
        }
    }
    let same_self = |g: &Func| {
        g.1.ends_with("[PLT]")
            || selves
                .get(&(g.0.clone(), callgrind::normal_name(&g.1)))
                .is_some_and(|(o, t)| o == t)
    };
    let (mut compared, mut cut_apart) = (0, 0);
    let mut diffs = Vec::new();
    for (file, _, _) in modules {
        let module = file.file_name().unwrap().to_str().unwrap();
        let ours = callgrind::annotate_with(cg, module, true);
        let theirs = callgrind::annotate_with(vg, module, true);
        let mut callers: Vec<&Func> = succ
            .keys()
            .copied()
            .filter(|f| f.0 == file.to_str().unwrap())
            .collect();
        callers.sort();
        for f in callers {
            let Some(below) = below(f) else { continue };
            if !std::iter::once(f).chain(below.iter()).all(same_self) {
                cut_apart += 1;
                continue;
            }
            let name = callgrind::normal_name(&f.1);
            let (Some(&o), Some(&t)) = (ours.get(&name), theirs.get(&name)) else {
                continue;
            };
            // Callgrind counts `rep` iterations, we count starts.
            let reps: u64 = std::iter::once(f)
                .chain(below.iter())
                .filter_map(|g| {
                    let (_, r, _) = modules
                        .iter()
                        .find(|(m, _, _)| m.to_str() == Some(g.0.as_str()))?;
                    r.get(&callgrind::normal_name(&g.1))
                })
                .sum();
            compared += 1;
            if o + reps != t {
                diffs.push(format!(
                    "{name} ({module}): ours {o} (+{reps} rep), callgrind {t}"
                ));
            }
        }
    }
    assert!(
        diffs.is_empty(),
        "{tag}: inclusive costs differ:\n{}",
        diffs.join("\n")
    );
    // Every call line of ours counts the calls callgrind saw at that site.
    let mut at_site: HashMap<(&str, u64), u64> = HashMap::new();
    for c in &calls {
        *at_site.entry((c.caller.0.as_str(), c.site)).or_default() += c.count;
    }
    let mut sites = 0;
    for c in callgrind::calls(cg) {
        // Callgrind puts PLT stubs in no object, at run-time addresses.
        // Our calls from outside the profiled code have no site.
        if c.caller.1.ends_with("@plt")
            || c.caller.1 == "<plt0>"
            || !modules
                .iter()
                .any(|(m, _, _)| m.to_str() == Some(c.caller.0.as_str()))
        {
            continue;
        }
        let Some(&t) = at_site.get(&(c.caller.0.as_str(), c.site)) else {
            // Callgrind sees every `call`; a tail `jmp` only where it
            // knows the target's start.
            assert!(
                !Elf::read(Path::new(&c.caller.0)).branch_at(c.site).0,
                "{tag}: {} calls at {:#x} in {}, callgrind saw none",
                c.count,
                c.site,
                c.caller.1
            );
            continue;
        };
        sites += 1;
        assert_eq!(
            c.count, t,
            "{tag}: calls at {:#x} in {}",
            c.site, c.caller.1
        );
    }
    eprintln!(
        "{tag}: {sites} call sites' counts and {compared} inclusive costs compared ({cut_apart} more where the two cut the code into different functions)"
    );
    compared
}

/// One module (`file`, the executable or a library) of our profile
/// against callgrind's costs of that object: instructions, conditional
/// jumps, and `callgrind_annotate`'s per-function totals of both files.
/// Returns callgrind's extra `rep` iterations per function (see below).
/// Returns callgrind's extra `rep` iterations per procedure, its
/// instruction total in the module's `.text` (those iterations aside,
/// procedures left alone included), and our count outside `.text`.
fn check_module(
    file: &Path,
    ours: &Ours,
    cg: &Path,
    vg: &Path,
    tag: &str,
) -> (HashMap<String, u64>, u64, u64) {
    let module = file.file_name().unwrap().to_str().unwrap();
    let theirs = callgrind::parse(vg, module);
    let ranges = text_ranges(file);
    let elf = Elf::read(file);
    let in_text = |a: u64| ranges.iter().any(|&(s, e)| s <= a && a < e);
    let mut addrs: Vec<u64> = ours
        .ir
        .keys()
        .chain(theirs.ir.keys())
        .copied()
        .filter(|&a| in_text(a))
        .collect();
    addrs.sort_unstable();
    addrs.dedup();
    // Callgrind charges a block's instructions when the next block starts,
    // so the block whose `syscall` ended the process (`exit_group` in the
    // program's own code, traces/raw_syscall.c) is never charged: one run
    // of consecutive instructions of one procedure, ours 1 and callgrind
    // 0, ending at a `syscall`, is taken as run once.
    let missing: Vec<usize> = (0..addrs.len())
        .filter(|&i| {
            ours.ir.get(&addrs[i]) == Some(&1)
                && theirs.ir.get(&addrs[i]).copied().unwrap_or(0) == 0
        })
        .collect();
    let is_syscall = |a: u64| {
        elf.sections
            .iter()
            .find(|s| s.exec && !s.nobits && s.addr <= a && a + 2 <= s.addr + s.size)
            .is_some_and(|s| elf.bytes_of(s, a, 2) == [0x0f, 0x05])
    };
    let final_block: HashSet<u64> = match missing.last() {
        Some(&last)
            if is_syscall(addrs[last])
                && missing.windows(2).all(|w| {
                    w[1] == w[0] + 1 && ours.proc_of[&addrs[w[0]]] == ours.proc_of[&addrs[w[1]]]
                }) =>
        {
            missing.iter().map(|&i| addrs[i]).collect()
        }
        _ => HashSet::new(),
    };
    if !final_block.is_empty() {
        eprintln!(
            "{tag}: the block ending at the process's last syscall ({} instructions) is uncharged by callgrind",
            final_block.len()
        );
    }
    let mut diffs = Vec::new();
    let (mut total_ours, mut total_theirs, mut uncounted) = (0u64, 0u64, 0u64);
    // Per procedure, callgrind's extra `rep` iterations.
    let mut rep_extra: HashMap<String, u64> = HashMap::new();
    let mut reps = 0;
    for &a in &addrs {
        let mut t = theirs.ir.get(&a).copied().unwrap_or(0);
        match ours.ir.get(&a) {
            None => uncounted += t,
            Some(&o) => {
                if o != t && elf.is_rep(a) && o <= t && (o > 0) == (t > 0) {
                    // Started o times, iterated t times in all.
                    *rep_extra.entry(ours.proc_of[&a].clone()).or_default() += t - o;
                    reps += 1;
                    t = o;
                }
                if final_block.contains(&a) {
                    t = o;
                }
                total_ours += o;
                if o != t {
                    diffs.push(format!("{a:#x}: ours {o}, callgrind {t}"));
                }
            }
        }
        total_theirs += t;
    }
    assert!(
        diffs.is_empty(),
        "{tag}: {} instruction counts differ:\n{}",
        diffs.len(),
        diffs[..diffs.len().min(20)].join("\n")
    );
    // Instructions outside every profiled block are those of procedures
    // left alone (named by the profile); without any, there are none.
    assert!(
        uncounted == 0 || !ours.left_alone.is_empty(),
        "{tag}: {uncounted} executed instructions are in no profiled block"
    );
    assert_eq!(
        total_ours + uncounted,
        total_theirs,
        "{tag}: instruction totals"
    );
    let mut jdiffs = Vec::new();
    for (&a, &o) in ours.taken.iter().filter(|(a, _)| in_text(**a)) {
        // A conditional jump into another function (a `.cold` part of the
        // same procedure) is a call for callgrind.
        let t =
            theirs.taken.get(&a).copied().unwrap_or(0) + theirs.calls.get(&a).copied().unwrap_or(0);
        if o != t {
            jdiffs.push(format!("{a:#x}: ours {o} taken, callgrind {t}"));
        }
    }
    for (&a, &t) in &theirs.taken {
        // Valgrind runs a `rep` instruction as a jump back to itself.
        if in_text(a)
            && t > 0
            && !ours.taken.contains_key(&a)
            && ours.ir.contains_key(&a)
            && !elf.is_rep(a)
        {
            jdiffs.push(format!(
                "{a:#x}: callgrind {t} taken, no taken edge in our CFG"
            ));
        }
    }
    assert!(
        jdiffs.is_empty(),
        "{tag}: taken counts differ:\n{}",
        jdiffs.join("\n")
    );
    // callgrind_annotate reads our file, with every counted instruction;
    // with symbols it agrees with callgrind's on every function both name.
    // (Without symbols, callgrind invents a function at each call target
    // and the per-function split is not comparable.)
    // Our file names procedures by symbol, callgrind demangles them.
    let a_ours = demangled(callgrind::annotate(cg, module));
    let mut a_theirs = callgrind::annotate(vg, module);
    // A `.cold` part our CFG made a range of its procedure (no procedure of
    // its own) counts for the procedure, where callgrind names it apart.
    let cold: Vec<(String, u64)> = a_theirs
        .iter()
        .filter(|(f, _)| cold_part_of(f).is_some() && !a_ours.contains_key(*f))
        .map(|(f, &n)| (f.clone(), n))
        .collect();
    for (f, n) in cold {
        a_theirs.remove(&f);
        let hot = cold_part_of(&f).expect("filtered").to_string();
        *a_theirs.entry(hot).or_default() += n;
    }
    assert_eq!(
        a_ours.values().sum::<u64>(),
        ours.ir.values().sum::<u64>(),
        "{tag}: callgrind_annotate's total of our file"
    );
    assert!(
        a_ours.contains_key("main") || !a_theirs.contains_key("main"),
        "{tag}: no main in {a_ours:?}"
    );
    let mut fdiffs = Vec::new();
    let symbols = a_theirs.contains_key("main");
    for (f, &n) in a_ours.iter().filter(|_| symbols) {
        if let Some(&m) = a_theirs.get(f) {
            let uncharged = final_block
                .iter()
                .filter(|a| ours.proc_of[*a] == *f)
                .count() as u64;
            if n + rep_extra.get(f).copied().unwrap_or(0) != m + uncharged {
                fdiffs.push(format!("{f}: ours {n}, callgrind {m}"));
            }
        }
    }
    assert!(
        fdiffs.is_empty(),
        "{tag}: callgrind_annotate totals differ:\n{}",
        fdiffs.join("\n")
    );
    eprintln!(
        "{tag}: {} instructions executed in .text ({reps} rep-prefixed counted once per start), {} counted ({} counters, {} left alone), {} conditional jumps, {} functions compared",
        total_theirs,
        total_ours,
        ours.placement_counters,
        ours.left_alone.len(),
        ours.taken.len(),
        a_ours
            .keys()
            .filter(|f| symbols && a_theirs.contains_key(*f))
            .count()
    );
    // Outside `.text` (PLT stubs, `.init`, `.fini`) callgrind charges the
    // code to no object (`ob=???`, at run-time addresses): our counts.
    let outside: u64 = ours
        .ir
        .iter()
        .filter(|(a, _)| !in_text(**a))
        .map(|(_, n)| n)
        .sum();
    (rep_extra, total_theirs, outside)
}

/// The function a `.cold` part belongs to, by callgrind's name of the part
/// (`f.cold`, or demangled `f(args) [clone .cold]`).
fn cold_part_of(name: &str) -> Option<&str> {
    name.strip_suffix(" [clone .cold]")
        .or_else(|| name.strip_suffix(".cold"))
}

/// Per-function totals with C++ names demangled by binutils' c++filt (as
/// callgrind prints them).
fn demangled(totals: HashMap<String, u64>) -> HashMap<String, u64> {
    let (names, n): (Vec<String>, Vec<u64>) = totals.into_iter().unzip();
    let mut m = HashMap::new();
    for (d, n) in demangle(&names).into_iter().zip(n) {
        *m.entry(d).or_default() += n;
    }
    m
}

/// `names` demangled by binutils' c++filt, in order.
fn demangle(names: &[String]) -> Vec<String> {
    let mut child = Command::new("c++filt")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("c++filt");
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().unwrap();
        for n in names {
            writeln!(stdin, "{n}").unwrap();
        }
    }
    let out = child.wait_with_output().expect("c++filt");
    let text = String::from_utf8(out.stdout).unwrap();
    let plain: Vec<String> = text.lines().map(str::to_string).collect();
    assert_eq!(plain.len(), names.len(), "c++filt: one line per name");
    plain
}

/// Sums `counts.FIELD` (`active`, `landed`, `resumed`: `[block, n]` lists)
/// over the procedures of the profile of run `tag`.
fn virtual_total(tag: &str, field: &str) -> u64 {
    let path = common::scratch("profile").join(format!("{tag}.aprof"));
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    v["procs"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| p["counts"][field].as_array())
        .flatten()
        .map(|e| e[1].as_u64().unwrap())
        .sum()
}

/// `aetrace count --event EVENT -o FILE -- exe args`: the count; stdout and
/// exit status as the native run's.
fn count(exe: &Path, args: &[&str], event: &str, tag: &str, extra: &[&str]) -> u64 {
    let file = common::scratch("profile").join(format!("{tag}.{event}.count"));
    let native = run_native(exe, args);
    let out = Command::new(common::aetrace())
        .args(["count", "--event", event, "-o"])
        .arg(&file)
        .args(extra)
        .arg("--")
        .arg(exe)
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.stdout == native.stdout,
        "{tag}: count: stdout differs; stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        out.status.code(),
        native.status.code(),
        "{tag}: count: exit status"
    );
    let text = std::fs::read_to_string(&file).unwrap();
    let (n, unit) = text.trim().split_once(' ').unwrap();
    assert_eq!(unit, event);
    n.parse().unwrap()
}

fn traced(source: &str, v: Variant, args: &[&str]) -> usize {
    let exe = build(source, v);
    let tag = format!("{}-{}", source.replace('.', "_"), v.tag());
    check(&exe, args, &tag)
}

#[test]
fn nested_if() {
    traced("nested_if.c", O2_PIE, &[]);
    traced("nested_if.c", O0_NOPIE, &["x"]);
}

/// `calls=` lines: call counts per site and `callgrind_annotate
/// --inclusive=yes` against callgrind's (`check_inclusive`) on a call tree
/// where the proportional split is exact: twice and mid (top calls
/// `uneven`, whose two calls cost differently, so it is not compared).
#[test]
fn inclusive_costs() {
    let compared = traced("calltree.c", O2_PIE, &["40"]);
    assert!(compared >= 2, "{compared} inclusive costs compared");
}

#[test]
fn loops_and_switch() {
    traced("loops.c", O2_PIE, &[]);
    traced("switch.c", O2_PIE, &[]);
    // liblzma's range-encoder switch and a 4-byte procedure: counted too.
    traced("rc_switch.c", O2_PIE, &[]);
}

#[test]
fn recursion_and_tail_calls() {
    traced("recursion.c", O2_PIE, &[]);
    traced("tailcall.c", O2_PIE, &[]);
}

#[test]
fn function_pointers_and_callbacks() {
    traced("fnptr.c", O2_PIE, &[]);
    traced("qsort_callback.c", O2_PIE, &[]);
}

/// exit() with frames active (paper 003 Figure 4): the virtual exit edges
/// derive the frames left at each call.
#[test]
fn exit_with_frames_active() {
    traced("exit_nested.c", O2_PIE, &[]);
    traced("exit_nested.c", O0_NOPIE, &[]);
    traced("noreturn.c", O2_PIE, &[]);
}

/// C++ exceptions (paper 003's counted graph with virtual edges): frames
/// unwound by a throw leave their calls by `c -> EXIT`, landing pads are
/// entered by `R0 -> pad`; caught in the thrower, several frames up,
/// rethrown, `catch (...)`, a throw from a handler, `std::exception_ptr`.
#[test]
fn cxx_exceptions() {
    for v in [O2_PIE, O0_NOPIE] {
        traced("cxx_exceptions.cpp", v, &[]);
        let tag = format!("cxx_exceptions_cpp-{}", v.tag());
        assert!(virtual_total(&tag, "landed") > 0, "{tag}: no landing");
        assert!(virtual_total(&tag, "active") > 0, "{tag}: no frame unwound");
    }
}

#[test]
fn cxx_unwind_deep() {
    for v in [O2_PIE, O0_NOPIE] {
        traced("cxx_unwind_deep.cpp", v, &[]);
        let tag = format!("cxx_unwind_deep_cpp-{}", v.tag());
        assert!(virtual_total(&tag, "landed") > 0, "{tag}: no landing");
        assert!(virtual_total(&tag, "active") > 0, "{tag}: no frame unwound");
    }
}

/// longjmp across frames (abandoned at their calls) back to a setjmp that
/// returns again (its return edge split: `R0 -> S` derived), and a
/// siglongjmp within one frame.
#[test]
fn setjmp_longjmp() {
    for v in [O2_PIE, O0_NOPIE] {
        traced("setjmp.c", v, &[]);
        // The program's own logic: 5 rounds of longjmp to `setjmp(env)`
        // (it prints rounds=5), and one siglongjmp to `sigsetjmp`.
        let tag = format!("setjmp_c-{}", v.tag());
        assert_eq!(virtual_total(&tag, "resumed"), 6, "{tag}: setjmp returns");
    }
}

#[test]
fn threads_count_atomically() {
    traced("threads.c", O2_PIE, &[]);
}

fn input(name: &str, len: usize) -> String {
    let p = common::scratch("inputs").join(format!("profile-{name}"));
    std::fs::write(&p, common::text_input(len)).unwrap();
    p.display().to_string()
}

#[test]
fn debian_gzip() {
    check(
        Path::new("/usr/bin/gzip"),
        &["-c", &input("gzip", 20_000)],
        "gzip",
    );
}

/// Feedback: a profile's counts as the weights of the next run's spanning
/// trees give the same counts, with no more increments.
#[test]
fn feedback_weights() {
    let exe = build("nested_if.c", O2_PIE);
    let (first, _) = profile(&exe, &[], "feedback-1", &[]);
    let w = first.display().to_string();
    let (second, _) = profile(&exe, &[], "feedback-2", &["--weights", &w]);
    let (a, b) = (read_profile(&first), read_profile(&second));
    assert_eq!(a.ir, b.ir);
    assert_eq!(a.taken, b.taken);
    let incs = |p: &Path| {
        let v: serde_json::Value = serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap();
        v["increments"].as_u64().unwrap()
    };
    assert!(
        incs(&second) <= incs(&first),
        "feedback: {} > {}",
        incs(&second),
        incs(&first)
    );
}

#[test]
fn debian_bzip2_and_xz() {
    check(
        Path::new("/usr/bin/bzip2"),
        &["-c", &input("bzip2", 20_000)],
        "bzip2",
    );
    check(
        Path::new("/usr/bin/xz"),
        &["-c", &input("xz", 20_000)],
        "xz",
    );
}

/// `--libs`: bzip2 and xz run almost entirely in libbz2 and liblzma; both
/// modules of each run against callgrind, and `count --libs` against the
/// sum over them, which is callgrind's Ir over the `.text` of both (plus
/// the PLT stubs' instructions, which callgrind charges to no object): no
/// procedure that runs is left alone (liblzma's range encoder with its switch on a reloaded
/// word, its 4-byte `lzma_index_stream_count`, xz's switch on a global).
#[test]
fn debian_bzip2_and_xz_with_their_libraries() {
    for (exe, tag, lib) in [
        ("/usr/bin/bzip2", "bzip2-libs", "libbz2.so.1.0"),
        ("/usr/bin/xz", "xz-libs", "liblzma.so.5"),
    ] {
        let c = check_libs(Path::new(exe), &["-c", &input(tag, 20_000)], tag, &[lib]);
        assert_eq!(
            c.insns,
            c.callgrind_text_ir + c.outside_text,
            "{tag}: count --event insns against callgrind's Ir in .text \
             ({} outside .text)",
            c.outside_text
        );
    }
}

/// Feedback weights with `--libs`: each module's spanning trees weighted
/// by its own section of the previous profile; the same counts in the
/// library, with no more increments.
#[test]
fn feedback_weights_with_libraries() {
    let exe = Path::new("/usr/bin/bzip2");
    let data = input("bzip2-feedback", 20_000);
    let args = ["-c", data.as_str()];
    let libs = ["--libs", "libbz2.so.1.0"];
    let (first, _) = profile(exe, &args, "feedback-libs-1", &libs);
    let w = first.display().to_string();
    let mut extra = libs.to_vec();
    extra.extend(["--weights", &w]);
    let (second, _) = profile(exe, &args, "feedback-libs-2", &extra);
    for lib in [None, Some("libbz2.so.1.0")] {
        let (a, b) = (read_module(&first, lib), read_module(&second, lib));
        assert_eq!(a.ir, b.ir, "{lib:?}");
        assert_eq!(a.taken, b.taken, "{lib:?}");
    }
    let incs = |p: &Path| section(p, None)["increments"].as_u64().unwrap();
    assert!(
        incs(&second) <= incs(&first),
        "feedback: {} > {}",
        incs(&second),
        incs(&first)
    );
}

/// Every-block placement ("slow" QP, pixie) counts the same blocks with
/// more increments.
#[test]
fn every_block_placement() {
    let exe = build("loops.c", O2_PIE);
    let (quick, _) = profile(&exe, &[], "quick", &[]);
    let (slow, _) = profile(&exe, &[], "slow", &["--placement", "every-block"]);
    let (a, b) = (read_profile(&quick), read_profile(&slow));
    assert_eq!(a.ir, b.ir);
    let incs = |p: &Path| {
        let v: serde_json::Value = serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap();
        v["increments"].as_u64().unwrap()
    };
    assert!(
        incs(&quick) < incs(&slow),
        "{} >= {}",
        incs(&quick),
        incs(&slow)
    );
}

/// A program that SIGKILLs itself: `aetrace profile` ends with the same
/// signal and the profile is readable, with the counts made before the
/// kill (the counters live in the recorder's memfd) and main's frame
/// left active at the call that killed it.
#[test]
fn sigkill_leaves_a_readable_profile() {
    use std::os::unix::process::ExitStatusExt;
    let exe = build("self_kill.c", O2_PIE);
    let prof = common::scratch("profile").join("self_kill.aprof");
    let _ = std::fs::remove_file(&prof);
    let out = Command::new(common::aetrace())
        .arg("profile")
        .arg("-o")
        .arg(&prof)
        .arg("--")
        .arg(&exe)
        .output()
        .unwrap();
    assert_eq!(out.status.signal(), Some(9), "{:?}", out.status);
    assert!(
        !out.stdout.is_empty(),
        "the program printed before the kill"
    );
    let report = Command::new(common::aetrace())
        .args(["report", "--format", "json"])
        .arg(&prof)
        .output()
        .unwrap();
    assert!(
        report.status.success(),
        "{}",
        String::from_utf8_lossy(&report.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&report.stdout).unwrap();
    assert_eq!(v["status"], "killed by signal 9");
    let main = v["procedures"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "main")
        .expect("main profiled");
    let counts = &main["counts"];
    let blocks: Vec<u64> = counts["blocks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_u64().unwrap())
        .collect();
    assert!(blocks.contains(&1234), "loop body count 1234 in {blocks:?}");
    assert_eq!(counts["invocations"], 1);
    assert_eq!(
        counts["active"].as_array().map(|a| a.len()),
        Some(1),
        "main's frame active at raise: {counts}"
    );
}

/// sort: it imports pthread_create (`lock add` counters), and a procedure
/// calls itself and also tail-jumps to its own entry (the invocation
/// counter must see the recursive call, not the jump).
#[test]
fn debian_sort() {
    let p = common::scratch("inputs").join("profile-sort");
    let lines: String = (0..20_000u64)
        .map(|i| format!("{}\n", i.wrapping_mul(2_654_435_761) % 1_000_003))
        .collect();
    std::fs::write(&p, lines).unwrap();
    check(
        Path::new("/usr/bin/sort"),
        // `-S`: sort otherwise sizes its buffer from the free memory of
        // the moment, a branch that can differ from callgrind's run.
        &["-S", "64M", &p.display().to_string()],
        "sort",
    );
}

/// The text report's hottest blocks carry `file:line` from DWARF, equal to
/// binutils' addr2line for the same addresses.
#[test]
fn text_report_source_lines() {
    let exe = common::scratch("profile").join("nested_if-g");
    common::build::run_checked(
        Command::new("gcc")
            .args(["-O2", "-g", "-o"])
            .arg(&exe)
            .arg(common::repo_root().join("traces/nested_if.c")),
        "gcc -g nested_if.c",
    );
    let (prof, _) = profile(&exe, &[], "lines", &[]);
    let out = Command::new(common::aetrace())
        .args(["report", "--top", "5"])
        .arg(&prof)
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let rows: Vec<&str> = text
        .lines()
        .skip_while(|l| !l.starts_with("hottest blocks"))
        .skip(2)
        .take(5)
        .collect();
    assert_eq!(rows.len(), 5, "{text}");
    for row in rows {
        let f: Vec<&str> = row.split_whitespace().collect();
        let (addr, src) = (f[2], f[5]);
        let a2l = Command::new("addr2line")
            .arg("-e")
            .arg(&exe)
            .arg(addr)
            .output()
            .unwrap();
        let want = String::from_utf8(a2l.stdout).unwrap();
        let want = want
            .trim()
            .rsplit('/')
            .next()
            .unwrap()
            .split(' ')
            .next()
            .unwrap()
            .to_string();
        assert_eq!(src, want, "{row}");
    }
}

/// Source files in the callgrind output, from the DWARF line tables of
/// programs built with `-g`: every instruction has callgrind's file and
/// line; `callgrind_annotate` names the same `file:function`s (inlined
/// header code under its header's name: `fi=`/`fe=`) with the same totals,
/// and `--auto=yes` annotates the same source lines with the same costs.
#[test]
fn source_files() {
    let dir = common::scratch("profile");
    for (src, compiler, opt) in [
        ("cxx_sort.cpp", "g++", "-O2"),
        ("loops.c", "gcc", "-O0"),
        ("qsort_callback.c", "gcc", "-O2"),
    ] {
        let tag = format!("{}-g{opt}", src.replace('.', "_"));
        let exe = dir.join(&tag);
        common::build::run_checked(
            Command::new(compiler)
                .args([opt, "-g", "-o"])
                .arg(&exe)
                .arg(common::repo_root().join("traces").join(src)),
            &format!("{compiler} -g {src}"),
        );
        check(&exe, &[], &tag);
        let cg = dir.join(format!("{tag}.aetrace.cg"));
        let vg = dir.join(format!("{tag}.callgrind.out"));
        let (ours, theirs) = (callgrind::parse(&cg, &tag), callgrind::parse(&vg, &tag));
        let mut diffs = Vec::new();
        let mut compared = 0;
        for (a, t) in &theirs.source {
            if let Some(o) = ours.source.get(a) {
                compared += 1;
                if o != t {
                    diffs.push(format!("{a:#x}: ours {o:?}, callgrind {t:?}"));
                }
            }
        }
        assert!(
            diffs.is_empty(),
            "{tag}: source lines differ:\n{}",
            diffs.join("\n")
        );
        assert!(
            theirs.source.values().any(|(f, _)| f.ends_with(src)),
            "{tag}: callgrind names no {src}"
        );
        // Per `file:function`, for code with line information (callgrind
        // charges the PLT, `???`, to another object).
        let by_file = |file: &Path| -> HashMap<(String, String), u64> {
            let a = callgrind::annotate_files(file, &tag, false);
            let (keys, n): (Vec<_>, Vec<u64>) =
                a.into_iter().filter(|((f, _), _)| f != "???").unzip();
            let names: Vec<String> = keys.iter().map(|(_, func)| func.clone()).collect();
            let mut m = HashMap::new();
            for (((f, _), func), n) in keys.into_iter().zip(demangle(&names)).zip(n) {
                let func = cold_part_of(&func).map_or(func.clone(), str::to_string);
                *m.entry((f, func)).or_default() += n;
            }
            m
        };
        let (a_ours, a_theirs) = (by_file(&cg), by_file(&vg));
        assert!(a_theirs.len() > 1, "{tag}: {a_theirs:?}");
        assert_eq!(
            a_ours, a_theirs,
            "{tag}: callgrind_annotate's file:function totals"
        );
        // The annotated sources: each line's cost (shares and the calls'
        // `=>` lines aside: callgrind's include the C library).
        let annotated = |file: &Path| -> Vec<(String, Vec<String>)> {
            let mut v: Vec<(String, Vec<String>)> = callgrind::annotated_sources(file)
                .into_iter()
                .map(|(f, text)| {
                    let lines = text
                        .lines()
                        .filter(|l| !l.contains("=> ") && !l.contains("<= "))
                        .map(|l| {
                            let l = match l.split_once(" (") {
                                Some((cost, rest)) if rest.contains("%)") => {
                                    format!("{cost} {}", rest.split_once("%)").unwrap().1)
                                }
                                _ => l.to_string(),
                            };
                            l.split_whitespace().collect::<Vec<_>>().join(" ")
                        })
                        .collect();
                    (f, lines)
                })
                .collect();
            v.sort();
            v
        };
        let (s_ours, s_theirs) = (annotated(&cg), annotated(&vg));
        assert!(
            s_ours.iter().any(|(f, _)| f.ends_with(src)),
            "{tag}: {src} not annotated from our file"
        );
        assert_eq!(s_ours, s_theirs, "{tag}: callgrind_annotate --auto=yes");
        eprintln!(
            "{tag}: {compared} instructions' source lines, {} file:function totals, {} annotated files equal",
            a_ours.len(),
            s_ours.len()
        );
    }
}

/// `traces/SOURCE` built by gcc with `flags` (a variant `build` has no
/// name for).
fn build_with(source: &str, tag: &str, flags: &[&str]) -> PathBuf {
    let out = common::scratch("profile-builds").join(format!("{source}-{tag}"));
    common::build::run_checked(
        Command::new("gcc")
            .args(flags)
            .arg("-o")
            .arg(&out)
            .arg(common::repo_root().join("traces").join(source)),
        &format!("gcc {source} {flags:?}"),
    );
    out
}

/// Programs that jump through computed addresses, trap, make raw system
/// calls (and end by one), call the vDSO, run `rep` string instructions,
/// ask for their CPU affinity, or have 2^20 paths.
#[test]
fn assorted_programs() {
    traced("computed_goto.c", O2_PIE, &[]);
    traced("computed_goto.c", O0_NOPIE, &[]);
    traced("int3.c", O2_PIE, &[]);
    traced("int3_after_call.c", O2_PIE, &[]);
    traced("raw_syscall.c", O2_PIE, &[]);
    traced("vdso.c", O2_PIE, &[]);
    traced("rep_string.c", O2_PIE, &[]);
    traced("rep_string.c", O0_NOPIE, &[]);
    traced("affinity.c", O2_PIE, &[]);
    traced("cache_mix.c", O2_PIE, &[]);
    traced("demo.c", O2_PIE, &["b"]);
    traced("many_paths.c", O2_PIE, &[]);
}

/// Signal handlers run by `raise`, calling traced code, nested, in a
/// thread, and delivered inside `kill`/`sigprocmask` (built `-fno-plt`).
/// (A fault handler that `siglongjmp`s: `inexact_programs_are_named`.)
#[test]
fn signal_handlers() {
    traced("signal.c", O2_PIE, &[]);
    traced("signal.c", O0_NOPIE, &[]);
    traced("signal_calls.c", O2_PIE, &[]);
    traced("signal_nested.c", O2_PIE, &[]);
    traced("signal_thread.c", O2_PIE, &[]);
    let exe = build_with("signal_unblock.c", "noplt", &["-O2", "-fno-plt"]);
    check(&exe, &[], "signal_unblock-noplt");
}

#[test]
fn threads_in_traced_procedures_at_once() {
    traced("threads_paths.c", O2_PIE, &[]);
}

/// A program that forks (or vforks, which valgrind runs as a fork): the
/// counters are shared by the process tree, so the profile is the sum over
/// its processes. Callgrind writes one file per process, and a child's
/// file starts from the costs its parent had at the fork (checked: without
/// a dump its `dl_main` is there), so callgrind runs with
/// `--dump-before=FORK_FN`: the parent dumps (and zeroes) its costs on
/// entering the fork, the child starts from zero, and the sum of every
/// file is every instruction each process ran once. Our counts equal that
/// sum per instruction and per conditional jump, and `count --event
/// insns` equals our total. The same dump, before `execv`, gives
/// callgrind's costs of an image that execs (which it never writes
/// otherwise: the exec replaces the process, its file stays empty).
/// `files`: the callgrind files expected; `children`: the children's
/// returns through split return edges (fork calls and calls to
/// procedures that fork), summed.
fn check_dumped(exe: &Path, tag: &str, fork_fn: &str, files: usize, children: u64) {
    let (prof, _) = profile(exe, &[], tag, &[]);
    let ours = read_profile(&prof);
    let dir = common::scratch("profile").join(format!("{tag}-callgrind"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let dump = format!("--dump-before={fork_fn}");
    let flags = ["--compress-strings=no", "--compress-pos=no", &dump];
    let o = callgrind::command(&flags, &dir.join("out.%p"))
        .arg(exe)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let want = files;
    let files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(
        files.len(),
        want,
        "{tag}: callgrind files {files:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let module = exe.file_name().unwrap().to_str().unwrap();
    let (mut ir, mut taken) = (HashMap::<u64, u64>::new(), HashMap::<u64, u64>::new());
    // Callgrind's name and position compression spans a process's dumps
    // and is inherited by its children (a part names an object by an id,
    // or a position relative to one, that an earlier part defined: before,
    // fork_helper.c read wrong): each file self-contained instead.
    for f in &files {
        let part = callgrind::parse(f, module);
        for (a, n) in part.ir {
            *ir.entry(a).or_default() += n;
        }
        for (a, n) in part.taken.into_iter().chain(part.calls) {
            *taken.entry(a).or_default() += n;
        }
    }
    let ranges = text_ranges(exe);
    let in_text = |a: u64| ranges.iter().any(|&(s, e)| s <= a && a < e);
    let mut diffs = Vec::new();
    for (&a, &t) in ir.iter().filter(|(a, _)| in_text(**a)) {
        let o = ours.ir.get(&a).copied().unwrap_or(0);
        if o != t {
            diffs.push(format!("{a:#x}: ours {o}, callgrind (sum) {t}"));
        }
    }
    for (&a, &o) in ours.ir.iter().filter(|(a, _)| in_text(**a)) {
        if o > 0 && !ir.contains_key(&a) {
            diffs.push(format!("{a:#x}: ours {o}, callgrind none"));
        }
    }
    for (&a, &o) in ours.taken.iter().filter(|(a, _)| in_text(**a)) {
        let t = taken.get(&a).copied().unwrap_or(0);
        if o != t {
            diffs.push(format!("{a:#x}: ours {o} taken, callgrind (sum) {t}"));
        }
    }
    diffs.sort();
    assert!(
        diffs.is_empty(),
        "{tag}: counts differ:\n{}",
        diffs.join("\n")
    );
    let text: u64 = ir
        .iter()
        .filter(|(a, _)| in_text(**a))
        .map(|(_, n)| n)
        .sum();
    assert!(text > 0, "{tag}: callgrind saw nothing of {module}");
    let total: u64 = ours.ir.values().sum();
    assert_eq!(count(exe, &[], "insns", tag, &[]), total, "{tag}: count");
    // The fork's return edge is split (`R0 -> S` derived): one child.
    assert_eq!(
        virtual_total(tag, "resumed"),
        children,
        "{tag}: fork returns"
    );
    eprintln!("{tag}: {text} instructions in .text over the process tree, equal");
}

#[test]
fn fork_and_vfork() {
    // The parent's two parts and the child's file.
    check_dumped(&build("fork.c", O2_PIE), "fork-O2", "fork", 3, 1);
    check_dumped(&build("fork.c", O0_NOPIE), "fork-O0", "fork", 3, 1);
    check_dumped(&build("vfork.c", O2_PIE), "vfork-O2", "vfork", 3, 1);
    // fork in a helper, called directly and through a tail call: two
    // forks, the parent's three parts and two children's files; each
    // child returns from `fork` in `spawn` and from main's call (-O2,
    // where `spawn_tail` tail-calls `spawn`), or also from `spawn_tail`'s
    // call of `spawn` (-O0): 2 + 2, or 2 + 3.
    for (v, tag, n) in [
        (O2_PIE, "fork_helper-O2", 4),
        (O0_NOPIE, "fork_helper-O0", 5),
    ] {
        check_dumped(&build("fork_helper.c", v), tag, "fork", 5, n);
    }
}

/// exec: callgrind, like the profile, sees the first image only (the
/// exec'd one counts privately, docs/profile.md); its costs are dumped on
/// entering `execv`.
#[test]
fn exec_counts_the_first_image() {
    check_dumped(&build("exec.c", O2_PIE), "exec-O2", "execv", 2, 0);
}

/// Runs `aetrace profile -o PROF EXTRA -- exe args` without comparing its
/// output with the native run's: (stdout, stderr, exit status, profile).
fn profile_raw(
    exe: &Path,
    args: &[&str],
    tag: &str,
    extra: &[&str],
) -> (String, String, Option<i32>, PathBuf) {
    let prof = common::scratch("profile").join(format!("{tag}.aprof"));
    let _ = std::fs::remove_file(&prof);
    let out = Command::new(common::aetrace())
        .arg("profile")
        .arg("-o")
        .arg(&prof)
        .args(extra)
        .arg("--")
        .arg(exe)
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        out.status.code(),
        prof,
    )
}

/// The count of the block at `sym`'s address (`module`'s symbol, a
/// procedure entry) in profile section `lib`: its invocations plus any
/// loop back to it, i.e. the times its first instruction ran.
fn entry_count(prof: &Path, lib: Option<&str>, module: &Path, sym: &str) -> u64 {
    // Link-time address from binutils' nm, as the profile's addresses.
    let out = Command::new("nm").arg(module).output().unwrap();
    let at = String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() == 3 && f[2] == sym).then(|| u64::from_str_radix(f[0], 16).unwrap())
        })
        .unwrap_or_else(|| panic!("no symbol {sym} in {}", module.display()));
    let ours = read_module(prof, lib);
    ours.ir
        .get(&at)
        .copied()
        .unwrap_or_else(|| panic!("{sym} at {at:#x} not profiled"))
}

/// Asynchronous timer signals: how many times the handler runs differs
/// between runs, so callgrind's separate run is no oracle. The program's
/// own output is (`handled=H iterations=I`): the profile must recover
/// (no procedure in error) with the handler's entry run H times and
/// `step`'s I + `per_handler` × H times.
fn check_timer(
    exe: &Path,
    args: &[&str],
    lib: Option<&str>,
    handler: (&Path, &str),
    step: (&Path, &str),
    per_handler: u64,
) {
    let name = exe.file_name().unwrap().to_string_lossy();
    let tag = format!("timer-{name}-{}", args.join("-"));
    let extra: Vec<&str> = lib.map(|l| vec!["--libs", l]).unwrap_or_default();
    let (stdout, stderr, status, prof) = profile_raw(exe, args, &tag, &extra);
    assert_eq!(status, Some(0), "{tag}: {stderr}");
    assert!(!stderr.contains("aetrace"), "{tag}: {stderr}");
    let field = |key: &str| -> u64 {
        common::count_in(&stdout, key).unwrap_or_else(|| panic!("{tag}: no {key} in {stdout:?}"))
    };
    let (handled, iterations) = (field("handled="), field("iterations="));
    assert!(handled > 0, "{tag}: no signal handled");
    let module_of = |m: &Path| if m == exe { None } else { lib };
    // read_module asserts every procedure recovered (flow conserved).
    assert_eq!(
        entry_count(&prof, module_of(handler.0), handler.0, handler.1),
        handled,
        "{tag}: handler entries"
    );
    assert_eq!(
        entry_count(&prof, module_of(step.0), step.0, step.1),
        iterations + per_handler * handled,
        "{tag}: {} entries",
        step.1
    );
    eprintln!("{tag}: handled={handled} iterations={iterations}, equal in the profile");
}

#[test]
fn asynchronous_timer_signals() {
    for v in [O2_PIE, O0_NOPIE] {
        let exe = build("signal_alarm.c", v);
        check_timer(&exe, &[], None, (&exe, "on_alarm"), (&exe, "step"), 0);
    }
}

/// Shared libraries with `--libs` (both modules against callgrind): a
/// library calling back into the program, and a library's loop sending
/// itself signals handled in both modules; its timer modes against the
/// program's own counts.
#[test]
fn shared_libraries_calling_back_and_signalled() {
    let exe = common::build::build_with_lib("shlib_callback", "libaecb.so.1", false);
    check_libs(&exe, &["300"], "shlib_callback", &["libaecb.so.1"]);
    let exe = common::build::build_with_lib("signal_lib", "libaesig.so.1", false);
    let lib = exe.with_file_name("libaesig.so.1");
    let libs = ["libaesig.so.1"];
    check_libs(&exe, &["kill", "40"], "signal_lib-kill", &libs);
    let l = Some(libs[0]);
    let step = (lib.as_path(), "lib_step");
    // The program's handler calls `lib_step` once per run.
    check_timer(&exe, &["timer-exe", "300"], l, (&exe, "on_signal"), step, 1);
    check_timer(
        &exe,
        &["timer-lib", "300"],
        l,
        (&lib, "lib_on_signal"),
        step,
        0,
    );
}

/// `dlopen`: the executable is profiled and compared (the library runs
/// uncounted); `--libs` naming the dlopened library is refused (a
/// `dlclose` and a second `dlopen` would lose counts).
#[test]
fn dlopen_executable_only() {
    let dir = common::scratch("profile-builds").join("dlopen");
    std::fs::create_dir_all(&dir).unwrap();
    let traces = common::repo_root().join("traces");
    common::build::run_checked(
        Command::new("gcc")
            .args(["-O2", "-shared", "-fPIC", "-Wl,-soname,libaedl.so.1", "-o"])
            .arg(dir.join("libaedl.so.1"))
            .arg(traces.join("dlopen_lib.c")),
        "gcc -shared dlopen_lib.c",
    );
    let exe = dir.join("dlopen");
    common::build::run_checked(
        Command::new("gcc")
            .args(["-O2", "-o"])
            .arg(&exe)
            .arg(traces.join("dlopen.c"))
            .arg(format!("-Wl,-rpath,{}", dir.display())),
        "gcc dlopen.c",
    );
    check(&exe, &[], "dlopen");
    let (_, stderr, status, _) = profile_raw(&exe, &[], "dlopen-libs", &["--libs", "libaedl.so.1"]);
    assert_eq!(status, Some(1), "{stderr}");
    assert!(
        stderr.contains("libaedl.so.1 is not a DT_NEEDED library"),
        "{stderr}"
    );
}

/// What cannot be exact is said: a signal handler that `siglongjmp`s out
/// of a fault, or calls `exit`, abandons the frame it interrupted inside a
/// block (the profile warns, naming the handler, and keeps the note).
#[test]
fn inexact_programs_are_named() {
    for v in [O2_PIE, O0_NOPIE] {
        let exe = build("signal_fault.c", v);
        let native = run_native(&exe, &[]);
        let (stdout, stderr, status, prof) = profile_raw(&exe, &[], "signal_fault", &[]);
        assert_eq!(stdout.as_bytes(), native.stdout, "signal_fault: stdout");
        assert_eq!(status, native.status.code());
        assert!(
            stderr.contains("aetrace: warning: counts may be inexact")
                && stderr.contains("longjmp is called by on_fault"),
            "{stderr}"
        );
        let notes = section(&prof, None)["notes"].to_string();
        assert!(notes.contains("on_fault"), "{notes}");
    }
    // A timer's handler that calls `exit` abandons main mid-block (its
    // output, the iterations, differs from run to run).
    let exe = build("signal_exit.c", O2_PIE);
    let (stdout, stderr, status, prof) = profile_raw(&exe, &[], "signal_exit", &[]);
    assert!(stdout.starts_with("iters="), "{stdout}");
    assert_eq!(status, Some(7), "{stderr}");
    assert!(
        stderr.contains("aetrace: warning: counts may be inexact: signal handlers ran and did not return: on_alarm (signal_exit-O2-pie), installed by main"),
        "{stderr}"
    );
    let notes = section(&prof, None)["notes"].to_string();
    assert!(notes.contains("on_alarm"), "{notes}");
}

const O2_STATIC: Variant = Variant::new(Opt::O2, Link::Static, false);

/// The target of the conditional jump at `a` and the address after it,
/// decoded from the original file (`jcc rel8`, `jcc rel32`, `jrcxz`,
/// `loop*`, after branch-hint and `bnd` prefixes); `None` for anything
/// else.
fn conditional_jump(elf: &Elf, a: u64) -> Option<(u64, u64)> {
    let s = elf
        .sections
        .iter()
        .find(|s| s.exec && !s.nobits && s.addr <= a && a < s.addr + s.size)?;
    let b = elf.bytes_of(s, a, 8.min(s.addr + s.size - a));
    let p = b
        .iter()
        .take_while(|x| matches!(x, 0x2e | 0x3e | 0xf2 | 0x67))
        .count();
    let rel = |at: usize, n: usize| -> Option<i64> {
        let v = b.get(at..at + n)?;
        Some(match n {
            1 => i64::from(v[0] as i8),
            _ => i64::from(i32::from_le_bytes(v.try_into().ok()?)),
        })
    };
    let (len, r) = match (b.get(p)?, b.get(p + 1)) {
        (0x70..=0x7f | 0xe0..=0xe3, _) => (p + 2, rel(p + 1, 1)?),
        (0x0f, Some(0x80..=0x8f)) => (p + 6, rel(p + 2, 4)?),
        _ => return None,
    };
    let next = a + len as u64;
    Some((next.wrapping_add_signed(r), next))
}

/// A static glibc executable against its native run single-stepped
/// (`common::singlestep`, which shares no code with aetrace). Callgrind
/// cannot be the oracle here: the libc's startup code is part of the
/// executable, and under valgrind's CPUID (another vendor, fewer features)
/// `init_cpu_features`, the cache-size code and the IFUNC resolvers take
/// other paths. The program's startup also reads its own program headers
/// (which rewriting adds to), `/proc/self/exe` and its environment, so the
/// stepped program is the profiled one from aetrace's cache, at its path,
/// with the original code and entry point put back, run with the
/// environment the profiled run had (its counter variable as the entry
/// point renamed it). Every instruction of every counted procedure then
/// ran as often as the profile says, every conditional jump of one was
/// taken as often; instructions of procedures left alone are the only
/// ones the profile does not count; `count --event insns|blocks|calls`
/// gives the profile's totals. Returns the profile.
fn check_static(exe: &Path, args: &[&str], tag: &str) -> PathBuf {
    let dir = common::scratch("profile-static");
    let cache = dir.join(format!("cache-{tag}"));
    let _ = std::fs::remove_dir_all(&cache);
    // One variable: `aetrace profile` adds its own after it (and the entry
    // renames that one `_ETRACE_...`), so the stepper's sorted environment
    // has the profiled run's order.
    let env = vec![("AETRACE_CACHE".to_string(), cache.display().to_string())];
    let run = |what: &[&str], out: &Path| {
        let mut a: Vec<&std::ffi::OsStr> = what.iter().map(|s| s.as_ref()).collect();
        a.extend([
            "-o".as_ref(),
            out.as_os_str(),
            "--".as_ref(),
            exe.as_os_str(),
        ]);
        a.extend(args.iter().map(std::ffi::OsStr::new));
        common::aetrace_fixed(&a, &env)
    };
    let prof = dir.join(format!("{tag}.aprof"));
    let cg = dir.join(format!("{tag}.aetrace.cg"));
    let profiled = run(&["profile", "--callgrind", cg.to_str().unwrap()], &prof);
    // The variable as the profiled program sees it.
    let shown = common::aetrace_fixed(
        &[
            "profile".as_ref(),
            "-o".as_ref(),
            dir.join("env.aprof").as_os_str(),
            "--".as_ref(),
            "/usr/bin/env".as_ref(),
        ],
        &env,
    );
    let shown = String::from_utf8(shown.stdout).unwrap();
    let var = shown
        .lines()
        .find_map(|l| l.strip_prefix("_ETRACE_COUNTERS_FD="))
        .unwrap_or_else(|| panic!("no renamed counter variable in {shown:?}"));
    // The rewritten program (beside it: its `.skeleton`).
    let inst = common::singlestep::cached_rewrite(&cache, exe);
    common::singlestep::restore_original_code(exe, &inst);
    let mut stepped_env = env.clone();
    stepped_env.push(("_ETRACE_COUNTERS_FD".to_string(), var.to_string()));
    // A program that forks: every process, as the shared counters sum them.
    let (stepped, children) = common::singlestep::run_tree(&inst, Some(exe), args, &stepped_env);
    assert_eq!(
        String::from_utf8_lossy(&profiled.stdout),
        String::from_utf8_lossy(&stepped.stdout),
        "{tag}: stdout"
    );
    assert_eq!(
        String::from_utf8_lossy(&profiled.stderr),
        String::from_utf8_lossy(&stepped.stderr),
        "{tag}: stderr"
    );
    assert_eq!(
        profiled.status.code(),
        Some(stepped.status),
        "{tag}: status"
    );

    let ours = read_profile(&prof);
    let elf = Elf::read(exe);
    let entry = u64::from_le_bytes(elf.bytes[0x18..0x20].try_into().unwrap());
    let bias = stepped.rips[0] - entry;
    let mut ir: HashMap<u64, u64> = HashMap::new();
    let mut taken: HashMap<u64, u64> = HashMap::new();
    let mut stepped_total = 0;
    for stream in std::iter::once(&stepped.rips).chain(&children) {
        // Link-time addresses, a `rep` instruction once per execution.
        let mut rips = Vec::with_capacity(stream.len());
        for &r in stream {
            let a = r - bias;
            if rips.last() != Some(&a) || !elf.is_rep(a) {
                rips.push(a);
            }
        }
        for (i, &a) in rips.iter().enumerate() {
            *ir.entry(a).or_default() += 1;
            if let (Some((target, next)), Some(&b)) = (conditional_jump(&elf, a), rips.get(i + 1)) {
                if b == target && target != next {
                    *taken.entry(a).or_default() += 1;
                }
            }
        }
        stepped_total += rips.len() as u64;
    }
    let mut diffs = Vec::new();
    let mut uncounted = 0u64;
    for (&a, &n) in &ir {
        match ours.ir.get(&a) {
            Some(&o) if o != n => diffs.push(format!(
                "{a:#x} ({}): ours {o}, stepped {n}",
                ours.proc_of[&a]
            )),
            Some(_) => {}
            None => uncounted += n,
        }
    }
    for (&a, &o) in &ours.ir {
        if o != 0 && !ir.contains_key(&a) {
            diffs.push(format!(
                "{a:#x} ({}): ours {o}, stepped 0",
                ours.proc_of[&a]
            ));
        }
    }
    diffs.sort();
    assert!(
        diffs.is_empty(),
        "{tag}: {} instruction counts differ:\n{}",
        diffs.len(),
        diffs[..diffs.len().min(30)].join("\n")
    );
    let counted: u64 = ours.ir.values().sum();
    assert!(
        uncounted == 0 || !ours.left_alone.is_empty(),
        "{tag}: {uncounted} executed instructions are in no profiled block"
    );
    assert_eq!(
        counted + uncounted,
        stepped_total,
        "{tag}: instruction totals"
    );
    let mut jdiffs = Vec::new();
    for (&a, &o) in &ours.taken {
        let t = taken.get(&a).copied().unwrap_or(0);
        if o != t {
            jdiffs.push(format!("{a:#x}: ours {o} taken, stepped {t}"));
        }
    }
    for (&a, &t) in &taken {
        // Taken inside a counted procedure: our CFG has that edge.
        let (target, _) = conditional_jump(&elf, a).unwrap();
        let inside = ours
            .proc_of
            .get(&a)
            .is_some_and(|p| ours.proc_of.get(&target) == Some(p));
        if inside && !ours.taken.contains_key(&a) {
            jdiffs.push(format!(
                "{a:#x}: stepped {t} taken, no taken edge in our CFG"
            ));
        }
    }
    assert!(
        jdiffs.is_empty(),
        "{tag}: taken counts differ:\n{}",
        jdiffs.join("\n")
    );
    eprintln!(
        "{tag}: {stepped_total} instructions stepped in {} process(es), {counted} counted, {uncounted} in {} procedures left alone; {} conditional jumps in counted procedures",
        1 + children.len(),
        ours.left_alone.len(),
        ours.taken.len()
    );
    // callgrind_annotate reads our callgrind output: per function, the
    // stepped run's instructions in that procedure (same-named ones
    // summed, as it sums them).
    let mut per_proc: HashMap<String, u64> = HashMap::new();
    for (a, &n) in &ir {
        if let Some(p) = ours.proc_of.get(a) {
            *per_proc.entry(p.clone()).or_default() += n;
        }
    }
    per_proc.retain(|_, n| *n > 0);
    let module = exe.file_name().unwrap().to_str().unwrap();
    let annotated = demangled(callgrind::annotate(&cg, module));
    let mut adiffs: Vec<String> = per_proc
        .iter()
        .filter(|(f, n)| annotated.get(*f) != Some(n))
        .map(|(f, n)| {
            format!(
                "{f}: stepped {n}, callgrind_annotate {:?}",
                annotated.get(f)
            )
        })
        .chain(
            annotated
                .iter()
                .filter(|(f, _)| !per_proc.contains_key(*f))
                .map(|(f, n)| format!("{f}: callgrind_annotate {n}, not stepped")),
        )
        .collect();
    adiffs.sort();
    assert!(
        adiffs.is_empty(),
        "{tag}: callgrind_annotate's totals differ:\n{}",
        adiffs.join("\n")
    );
    for (event, want) in [
        ("insns", counted),
        ("blocks", ours.blocks),
        ("calls", ours.calls),
    ] {
        let file = dir.join(format!("{tag}.{event}.count"));
        let out = run(&["count", "--event", event], &file);
        assert_eq!(
            out.stdout, stepped.stdout,
            "{tag}: count --event {event}: stdout"
        );
        let text = std::fs::read_to_string(&file).unwrap();
        assert_eq!(
            text.trim(),
            format!("{want} {event}"),
            "{tag}: aetrace count --event {event}"
        );
    }
    let _ = std::fs::remove_dir_all(&cache);
    prof
}

/// Static executables (`-static`, `-static-pie`, and one without libc):
/// the counters are mapped from a new entry point, before the libc's
/// startup code (static-PIE self-relocation, IRELATIVE resolvers, TLS
/// setup), which is counted with the program.
#[test]
fn static_executables() {
    // Without libc every instruction is the program's: callgrind is the
    // oracle.
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
    check(&exe, &["300"], "nolibc");
    check_static(&build("nested_if.c", O2_STATIC), &[], "nested_if-static");
    let exe = build_with("calltree.c", "static-pie", &["-O2", "-static-pie"]);
    check_static(&exe, &["40"], "calltree-static-pie");
    for f in [
        "fork.c",
        "vfork.c",
        "fork_helper.c",
        "setjmp.c",
        "exit_nested.c",
        "qsort_callback.c",
        "rep_string.c",
        "raw_syscall.c",
        "computed_goto.c",
        "signal.c",
    ] {
        check_static(&build(f, O2_STATIC), &[], &format!("{f}-static"));
    }
}

/// A program whose path depends on its own code addresses (paper 004,
/// Figure 2): under the profile it runs from the relocated copies and
/// takes the collision path on every insertion but the first, unlike
/// natively and under callgrind, so callgrind is no oracle; its own output
/// is (`collisions = 199`, every key after the first in one bucket), with
/// `hash_insert` and `hash_value` entered 200 times and every procedure
/// recovered.
#[test]
fn own_address_against_its_output() {
    let exe = build("own_address.c", O2_PIE);
    let (stdout, stderr, status, prof) = profile_raw(&exe, &[], "own_address", &[]);
    assert_eq!(status, Some(0), "{stderr}");
    assert_eq!(stdout, "collisions = 199\n", "the relocated run");
    for f in ["hash_insert", "hash_value"] {
        assert_eq!(entry_count(&prof, None, &exe, f), 200, "{f} entries");
    }
}
