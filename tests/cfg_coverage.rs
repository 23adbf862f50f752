//! Coverage of `aetrace cfg` on the machine's own stripped binaries (issue
//! 2): at least 99% of the executable-section bytes, PLT sections and
//! inter-procedure padding aside, lie inside recovered procedures, and at
//! least 95% of the indirect jumps are resolved. The figures are printed
//! (run with `--nocapture` to see them).
//!
//! The 95% target is met by gzip, bzip2, libbz2, liblzma and libc (glibc's
//! string functions index their tables by `bsf` results and ranges, see
//! docs/cfg.md section 5).
//!
//! The byte figures are computed here, not taken from aetrace's summary:
//! sections from our own ELF reader (`common/elf.rs`), padding recognised
//! byte by byte, procedure ranges from the JSON. `objdump -d` (GNU binutils'
//! linear sweep, exact on gcc output) is a second opinion: every instruction
//! the CFG lists must start an instruction in objdump's listing (or follow
//! a skipped `lock` prefix), every indirect `jmp` objdump sees inside a
//! recovered procedure must be one the CFG reports (as an indirect jump or
//! an indirect tail call), and every direct branch, jump, call and return
//! must end its block with the edges its target implies (`static_edges`;
//! this covers all code, not only what a run executes). Resolved jump
//! tables are re-read from the file and must give exactly the claimed
//! targets (`jump_tables`).
//!
//! "Resolved" indirect jumps: jump tables with their targets, plus jumps
//! aetrace classifies as indirect tail calls (they leave for a procedure
//! entry, which the recorder handles like an indirect call); both counts
//! are printed.

use crate::common;

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

use common::build::{build, Link, Opt, Variant};
use common::cfg::{Cfg, Index};
use common::elf::{is_padding, Elf};
use common::FastSet;

fn is_plt_section(name: &str) -> bool {
    name == ".plt" || name.starts_with(".plt.") || name == ".iplt"
}

/// What an instruction does to control flow, as objdump spells it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Flow {
    Other,
    /// `jmp *...`
    IndirectJump,
    /// `jmp T`
    Jump(u64),
    /// `jcc T`, `loop T`, `jrcxz T`, `xbegin T`: T or the next instruction.
    Branch(u64),
    Call,
    Ret,
}

/// objdump's view of one file: its instructions in address order, each
/// with its control-flow meaning and the index of its section.
struct Objdump {
    listing: Vec<(u64, Flow, usize)>,
    insns: FastSet<u64>,
    indirect_jumps: BTreeSet<u64>,
}

fn classify(text: &str) -> Flow {
    let mut words = text.split_whitespace().skip_while(|w| {
        matches!(
            *w,
            "notrack" | "bnd" | "rex.W" | "ds" | "cs" | "repz" | "rep" | "repnz" | "data16"
        )
    });
    let (Some(mnemonic), operand) = (words.next(), words.next()) else {
        return Flow::Other;
    };
    let direct = || operand.and_then(|o| u64::from_str_radix(o, 16).ok());
    match mnemonic {
        "ret" | "retq" => Flow::Ret,
        "call" | "callq" => Flow::Call,
        "jmp" | "jmpq" if operand.is_some_and(|o| o.starts_with('*')) => Flow::IndirectJump,
        "jmp" | "jmpq" => direct().map_or(Flow::Other, Flow::Jump),
        "loop" | "loope" | "loopne" | "jrcxz" | "jecxz" | "xbegin" => {
            direct().map_or(Flow::Other, Flow::Branch)
        }
        m if m.starts_with('j') => direct().map_or(Flow::Other, Flow::Branch),
        _ => Flow::Other,
    }
}

fn objdump(path: &Path) -> Objdump {
    let out = Command::new("objdump")
        .args(["-d", "--no-show-raw-insn", "-w"])
        .arg(path)
        .output()
        .expect("running objdump");
    assert!(out.status.success(), "objdump -d {}", path.display());
    let mut od = Objdump {
        listing: Vec::new(),
        insns: FastSet::default(),
        indirect_jumps: BTreeSet::new(),
    };
    let mut section = 0;
    for line in out.stdout.split(|&c| c == b'\n') {
        let Ok(line) = std::str::from_utf8(line) else {
            continue;
        };
        if line.starts_with("Disassembly of section") {
            section += 1;
            continue;
        }
        // "  4011a6:\tjmp    *%rax"
        let Some((addr, rest)) = line.split_once(":\t") else {
            continue;
        };
        let Ok(addr) = u64::from_str_radix(addr.trim(), 16) else {
            continue;
        };
        if rest.starts_with("(bad)") {
            continue;
        }
        let flow = classify(rest);
        od.insns.insert(addr);
        if flow == Flow::IndirectJump {
            od.indirect_jumps.insert(addr);
        }
        od.listing.push((addr, flow, section));
    }
    od
}

/// The static edge oracle: every direct branch, jump, call and return that
/// objdump shows inside an analysed procedure ends its block and has its
/// edges: a target inside the procedure is an edge to the block starting
/// there, a target outside is an EXIT edge of kind `tailcall`, the
/// fall-through of a conditional branch likewise, a call ends a `call`
/// block, a return has an EXIT edge of kind `return`. Returns the
/// violations.
fn static_edges(cfg: &Cfg, od: &Objdump, in_plt: impl Fn(u64) -> bool) -> Vec<String> {
    let ix = Index::new(cfg);
    let mut bad = Vec::new();
    let has_edge = |pi: usize, bi: usize, to: u64| {
        ix.block_start.get(&to).is_some_and(|bs| {
            bs.iter()
                .any(|&(p, b)| p == pi && ix.edges.contains(&(pi, bi, b)))
        })
    };
    let has_exit = |pi: usize, bi: usize, kind: &str| {
        ix.exit_kinds
            .get(&(pi, bi))
            .is_some_and(|ks| ks.iter().any(|k| k == kind))
    };
    for (i, &(a, flow, section)) in od.listing.iter().enumerate() {
        if flow == Flow::Other || flow == Flow::IndirectJump || in_plt(a) {
            continue;
        }
        let Some(loc) = ix.insn.get(&a).and_then(|l| l.first().copied()) else {
            continue;
        };
        let p = &cfg.procs[loc.proc];
        let block = ix.block(loc);
        let here = |t: u64| p.ranges.iter().any(|&(s, e)| s <= t && t < e);
        let name = format!("{a:#x} ({}+{:#x})", p.name, a.wrapping_sub(p.start));
        if loc.pos + 1 != block.insns.len() {
            bad.push(format!(
                "{name}: {flow:?} does not end its block [{:#x},{:#x})",
                block.start, block.end
            ));
            continue;
        }
        let next = od
            .listing
            .get(i + 1)
            .filter(|n| n.2 == section)
            .map(|n| n.0);
        let mut goes_to = |t: u64, what: &str| {
            if here(t) {
                if !has_edge(loc.proc, loc.block, t) {
                    bad.push(format!("{name}: no edge for the {what} to {t:#x}"));
                }
            } else if !has_exit(loc.proc, loc.block, "tailcall") {
                bad.push(format!(
                    "{name}: the {what} to {t:#x} leaves {} but there is no tail-call EXIT edge",
                    p.name
                ));
            }
        };
        match flow {
            Flow::Jump(t) => goes_to(t, "jump"),
            Flow::Branch(t) => {
                goes_to(t, "branch");
                if let Some(n) = next {
                    goes_to(n, "fall-through");
                }
            }
            Flow::Call if block.kind != "call" => bad.push(format!(
                "{name}: a call ends a block of kind {}",
                block.kind
            )),
            Flow::Ret if !has_exit(loc.proc, loc.block, "return") => {
                bad.push(format!("{name}: a return without a return EXIT edge"))
            }
            _ => {}
        }
    }
    bad
}

/// Whether `a` is one byte into an instruction objdump decodes with a
/// `lock` prefix: glibc jumps over the prefix (`je 1f; lock; 1: cmpxchg`)
/// in its single-thread fast paths, so `a` starts a real instruction that
/// a linear sweep cannot list.
fn after_lock_prefix(elf: &Elf, od: &Objdump, a: u64) -> bool {
    od.insns.contains(&(a - 1))
        && elf
            .sections
            .iter()
            .find(|s| s.exec && !s.nobits && s.addr < a && a <= s.addr + s.size)
            .is_some_and(|s| elf.bytes_of(s, a - 1, 1) == [0xf0])
}

/// Jump tables re-read from the file: for each resolved jump that names its
/// table and entry count, the targets must be exactly the table's entries
/// read as gcc emits them (`int32` offsets from the table, absolute 8-byte
/// addresses, or `int32` offsets from one label as in glibc's printf), each
/// an objdump instruction start inside the procedure. Returns (tables checked, violations).
fn jump_tables(cfg: &Cfg, elf: &Elf, od: &Objdump) -> (usize, Vec<String>) {
    let read = |addr: u64, len: u64| {
        elf.sections
            .iter()
            .find(|s| !s.nobits && s.addr <= addr && addr + len <= s.addr + s.size)
            .map(|s| elf.bytes_of(s, addr, len))
    };
    let (mut checked, mut bad) = (0, Vec::new());
    for p in &cfg.procs {
        for j in p.indirect_jumps.iter().filter(|j| j.resolved) {
            let Some((table, n)) = j.table else { continue };
            let mut claimed: Vec<u64> = j.targets.clone();
            claimed.sort_unstable();
            claimed.dedup();
            let rel: Option<Vec<u64>> = read(table, 4 * n).map(|b| {
                b.chunks(4)
                    .map(|c| {
                        table.wrapping_add(i32::from_le_bytes(c.try_into().unwrap()) as i64 as u64)
                    })
                    .collect()
            });
            // glibc's printf tables hold offsets from a label, not from
            // the table: accept a common base when one fits every entry.
            let offsets: Option<Vec<i64>> = read(table, 4 * n).map(|b| {
                b.chunks(4)
                    .map(|c| i64::from(i32::from_le_bytes(c.try_into().unwrap())))
                    .collect()
            });
            let based = offsets.as_ref().and_then(|o| {
                claimed.iter().find_map(|&c| {
                    let base = c.wrapping_sub(o[0] as u64);
                    let mut v: Vec<u64> = o.iter().map(|&e| base.wrapping_add(e as u64)).collect();
                    v.sort_unstable();
                    v.dedup();
                    (v == claimed).then_some(v)
                })
            });
            let abs: Option<Vec<u64>> = read(table, 8 * n).map(|b| {
                b.chunks(8)
                    .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
                    .collect()
            });
            let matches = |v: &Option<Vec<u64>>| {
                v.as_ref().is_some_and(|v| {
                    let mut v = v.clone();
                    v.sort_unstable();
                    v.dedup();
                    v == claimed
                })
            };
            checked += 1;
            let at = format!("{:#x} ({}), table {table:#x} x {n}", j.addr, p.name);
            if !matches(&rel) && !matches(&abs) && based.is_none() {
                bad.push(format!(
                    "{at}: targets {claimed:x?} are not the table's entries"
                ));
            }
            // A case may leave the procedure for another procedure's entry
            // (gcc sends impossible switch cases to a `.cold` abort; glibc's
            // `_authenticate` tables hold function entries): exact only as
            // a tail call, so the jump's block must have a tail-call EXIT.
            let tail_exit = p
                .edges
                .iter()
                .any(|e| e.from == j.block && e.to.is_none() && e.kind == "tailcall");
            for &t in &claimed {
                let inside = p.ranges.iter().any(|&(s, e)| s <= t && t < e);
                let entry_elsewhere = !inside
                    && cfg
                        .procs
                        .iter()
                        .any(|q| q.start == t || q.entries.contains(&t));
                if !od.insns.contains(&t) || !(inside || (entry_elsewhere && tail_exit)) {
                    bad.push(format!(
                        "{at}: target {t:#x} is no instruction of the procedure{}",
                        if entry_elsewhere {
                            " (another procedure's entry, but the block has no tail-call EXIT edge)"
                        } else {
                            ""
                        }
                    ));
                }
            }
        }
    }
    (checked, bad)
}

/// Merged [start, end) ranges of all procedures that have a CFG (a
/// procedure aetrace found but could not analyse recovers nothing).
fn merged_ranges(cfg: &Cfg) -> Vec<(u64, u64)> {
    let mut r: Vec<(u64, u64)> = cfg
        .procs
        .iter()
        .filter(|p| p.analysable && !p.blocks.is_empty())
        .flat_map(|p| p.ranges.iter().copied())
        .collect();
    r.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::new();
    for (s, e) in r {
        match out.last_mut() {
            Some(last) if s <= last.1 => last.1 = last.1.max(e),
            _ => out.push((s, e)),
        }
    }
    out
}

struct Figures {
    exec: u64,
    plt: u64,
    padding: u64,
    covered: u64,
    gaps: Vec<(u64, u64, String)>,
}

fn byte_figures(elf: &Elf, ranges: &[(u64, u64)]) -> Figures {
    let mut f = Figures {
        exec: 0,
        plt: 0,
        padding: 0,
        covered: 0,
        gaps: Vec::new(),
    };
    for s in elf
        .sections
        .iter()
        .filter(|s| s.exec && !s.nobits && s.size > 0)
    {
        if is_plt_section(&s.name) {
            f.plt += s.size;
            continue;
        }
        f.exec += s.size;
        let (lo, hi) = (s.addr, s.addr + s.size);
        let mut at = lo;
        let gap = |from: u64, to: u64, f: &mut Figures| {
            if from < to {
                if is_padding(elf.bytes_of(s, from, to - from)) {
                    f.padding += to - from;
                } else {
                    f.gaps.push((from, to, s.name.clone()));
                }
            }
        };
        for &(ps, pe) in ranges.iter().filter(|&&(ps, pe)| pe > lo && ps < hi) {
            let (ps, pe) = (ps.max(lo), pe.min(hi));
            gap(at, ps.max(at), &mut f);
            if pe > at {
                f.covered += pe - ps.max(at);
                at = pe;
            }
        }
        gap(at, hi, &mut f);
    }
    f
}

/// All figures and checks for one binary; returns its problems, empty when
/// it meets every target.
fn binary_problems(path: &Path, min_resolved_pct: f64) -> String {
    let name = path.display().to_string();
    let elf = Elf::read(path);
    let cfg = Cfg::load(path);
    let ranges = merged_ranges(&cfg);
    let f = byte_figures(&elf, &ranges);
    let considered = f.exec - f.padding;
    let pct = 100.0 * f.covered as f64 / considered.max(1) as f64;
    let uncovered: u64 = f.gaps.iter().map(|g| g.1 - g.0).sum();

    let plt_sections: Vec<(u64, u64)> = elf
        .sections
        .iter()
        .filter(|s| s.exec && is_plt_section(&s.name))
        .map(|s| (s.addr, s.addr + s.size))
        .collect();
    let in_plt = |a: u64| plt_sections.iter().any(|&(l, h)| l <= a && a < h);
    // "Resolved": a jump table with its targets, or an indirect jump
    // classified as a tail call (it leaves for a procedure entry, which the
    // recorder handles like an indirect call). Both are printed apart.
    let (mut ij_total, mut ij_tables, mut ij_tail) = (0usize, 0usize, 0usize);
    let mut reported: FastSet<u64> = FastSet::default();
    for p in cfg.procs.iter().filter(|p| p.kind != "plt") {
        for j in &p.indirect_jumps {
            ij_total += 1;
            if j.resolved {
                ij_tables += 1;
            } else if j.class.as_deref() == Some("tailcall") {
                ij_tail += 1;
            }
            reported.insert(j.addr);
        }
        for c in p.calls.iter().filter(|c| c.tail && c.kind != "direct") {
            if let Some(b) = p.blocks.iter().find(|b| b.id == c.block) {
                reported.extend(b.insns.last());
            }
        }
    }
    let ij_resolved = ij_tables + ij_tail;
    let ij_pct = if ij_total == 0 {
        100.0
    } else {
        100.0 * ij_resolved as f64 / ij_total as f64
    };

    let od = objdump(path);
    let in_proc = |a: u64| {
        let i = ranges.partition_point(|r| r.1 <= a);
        ranges.get(i).is_some_and(|r| r.0 <= a)
    };
    let missed_jumps: Vec<u64> = od
        .indirect_jumps
        .iter()
        .copied()
        .filter(|&a| !in_plt(a) && in_proc(a) && !reported.contains(&a))
        .collect();
    let mut off_boundary: Vec<(u64, &str)> = cfg
        .procs
        .iter()
        .filter(|p| p.kind != "plt")
        .flat_map(|p| {
            p.blocks
                .iter()
                .flat_map(move |b| b.insns.iter().map(move |&a| (a, p.name.as_str())))
        })
        .filter(|&(a, _)| !in_plt(a) && !od.insns.contains(&a) && !after_lock_prefix(&elf, &od, a))
        .collect();
    off_boundary.sort_unstable();

    eprintln!(
        "coverage {name}: {} procedures ({} not analysable); exec bytes {} (+{} PLT), padding {}, covered {} of {} = {pct:.3}%, \
         uncovered {uncovered} in {} gaps; indirect jumps {ij_resolved}/{ij_total} resolved = {ij_pct:.2}% \
         ({ij_tables} jump tables, {ij_tail} tail calls; objdump sees {} outside PLT); aetrace's own summary: exec_bytes {} covered_bytes {}",
        cfg.procs.len(),
        cfg.procs.iter().filter(|p| !p.analysable).count(),
        f.exec,
        f.plt,
        f.padding,
        f.covered,
        considered,
        f.gaps.len(),
        od.indirect_jumps.iter().filter(|&&a| !in_plt(a)).count(),
        cfg.summary.get("exec_bytes").map_or("-".into(), |v| v.to_string()),
        cfg.summary.get("covered_bytes").map_or("-".into(), |v| v.to_string()),
    );
    let mut gaps = f.gaps.clone();
    gaps.sort_by_key(|g| std::cmp::Reverse(g.1 - g.0));
    let gap_list: Vec<String> = gaps
        .iter()
        .take(8)
        .map(|(s, e, sec)| format!("[{s:#x},{e:#x}) {} bytes in {sec}", e - s))
        .collect();
    let mut problems = Vec::new();
    if pct < 99.0 {
        problems.push(format!(
            "byte coverage {pct:.3}% < 99%; largest gaps: {}",
            gap_list.join(", ")
        ));
    }
    if ij_pct < min_resolved_pct {
        problems.push(format!(
            "indirect jumps resolved {ij_pct:.2}% < {min_resolved_pct}%"
        ));
    }
    if !missed_jumps.is_empty() {
        let shown: Vec<String> = missed_jumps
            .iter()
            .take(10)
            .map(|a| format!("{a:#x}"))
            .collect();
        problems.push(format!(
            "{} indirect jumps inside procedures are not in the CFG: {}",
            missed_jumps.len(),
            shown.join(", ")
        ));
    }
    if !off_boundary.is_empty() {
        let shown: Vec<String> = off_boundary
            .iter()
            .take(10)
            .map(|(a, p)| format!("{a:#x} in {p}"))
            .collect();
        problems.push(format!(
            "{} CFG instructions are not instruction starts for objdump: {}",
            off_boundary.len(),
            shown.join(", ")
        ));
    }
    // Landing pads (from the LSDAs, read independently) are entered by the
    // unwinder, so each one inside an analysed procedure must start a block.
    let pads = common::lsda::landing_pads(path);
    let ix = Index::new(&cfg);
    let mut pad_bad: Vec<u64> = pads
        .iter()
        .copied()
        .filter(|&lp| in_proc(lp) && !ix.block_start.contains_key(&lp))
        .collect();
    pad_bad.sort_unstable();
    eprintln!(
        "coverage {name}: {} landing pads, {} not block starts",
        pads.len(),
        pad_bad.len()
    );
    if !pad_bad.is_empty() {
        let shown: Vec<String> = pad_bad.iter().take(10).map(|a| ix.describe(*a)).collect();
        problems.push(format!(
            "{} landing pads are not block starts: {}",
            pad_bad.len(),
            shown.join(", ")
        ));
    }
    let (tables, table_bad) = jump_tables(&cfg, &elf, &od);
    eprintln!("coverage {name}: {tables} jump tables re-read from the file");
    if !table_bad.is_empty() {
        problems.push(format!(
            "{} jump-table problems, first {}:\n    {}",
            table_bad.len(),
            table_bad.len().min(12),
            table_bad[..table_bad.len().min(12)].join("\n    ")
        ));
    }
    let edge_bad = static_edges(&cfg, &od, in_plt);
    if !edge_bad.is_empty() {
        problems.push(format!(
            "{} direct branches, calls or returns disagree with objdump, first {}:\n    {}",
            edge_bad.len(),
            edge_bad.len().min(12),
            edge_bad[..edge_bad.len().min(12)].join("\n    ")
        ));
    }
    if problems.is_empty() {
        String::new()
    } else {
        format!("\n{name}:\n  {}", problems.join("\n  "))
    }
}

/// The target share of indirect jumps resolved.
const TARGET_RESOLVED_PCT: f64 = 95.0;

/// Asserts that every binary of `paths` meets the targets, with at least
/// `min_resolved_pct` of its indirect jumps resolved, reporting all.
fn check_binaries(paths: &[&Path], min_resolved_pct: f64) {
    let problems: String = paths
        .iter()
        .map(|p| binary_problems(p, min_resolved_pct))
        .collect();
    assert!(problems.is_empty(), "coverage targets missed:{problems}");
}

#[test]
fn gzip() {
    check_binaries(&[Path::new("/usr/bin/gzip")], TARGET_RESOLVED_PCT);
}

#[test]
fn bzip2() {
    check_binaries(&[Path::new("/usr/bin/bzip2")], TARGET_RESOLVED_PCT);
}

#[test]
fn libbz2() {
    check_binaries(
        &[Path::new("/lib/x86_64-linux-gnu/libbz2.so.1.0")],
        TARGET_RESOLVED_PCT,
    );
}

/// Every indirect jump resolved: liblzma's range encoder switches on a
/// word compared through one address and read through another, xz on a
/// 32-bit global (docs/cfg.md, section 5).
#[test]
fn liblzma_and_xz() {
    check_binaries(
        &[
            Path::new("/lib/x86_64-linux-gnu/liblzma.so.5"),
            Path::new("/usr/bin/xz"),
        ],
        100.0,
    );
}

#[test]
fn libc() {
    check_binaries(
        &[Path::new("/lib/x86_64-linux-gnu/libc.so.6")],
        TARGET_RESOLVED_PCT,
    );
}

/// Our own programs, stripped: a static one (all of libc's startup code,
/// IFUNC PLT) and C++ with exception tables.
#[test]
fn own_stripped_programs() {
    let built = [
        build("switch.c", Variant::new(Opt::O2, Link::Static, true)),
        build("cxx_exceptions.cpp", Variant::new(Opt::O2, Link::Pie, true)),
        build("computed_goto.c", Variant::new(Opt::O3, Link::NoPie, true)),
    ];
    let paths: Vec<&Path> = built.iter().map(|p| p.as_path()).collect();
    // Floor below the 95% target: the static one (glibc's string functions,
    // non-PIC) resolves 136 of 158 today (see docs/cfg.md section 5).
    check_binaries(&paths, 85.0);
}

/// The static oracles must be able to fail: dropping a taken edge or a
/// return edge from gzip's real CFG is reported with the branch's address,
/// and a jump-table target moved by one byte is reported too.
#[test]
fn static_oracles_catch_broken_cfgs() {
    let path = Path::new("/usr/bin/gzip");
    let cfg = Cfg::load(path);
    let od = objdump(path);
    let no_plt = |_: u64| false;
    let before = static_edges(&cfg, &od, no_plt).len();
    for kind in ["taken", "return"] {
        let (pi, ei) = cfg
            .procs
            .iter()
            .enumerate()
            .filter(|(_, p)| p.kind != "plt")
            .find_map(|(pi, p)| {
                p.edges
                    .iter()
                    .position(|e| e.kind == kind)
                    .map(|ei| (pi, ei))
            })
            .unwrap_or_else(|| panic!("gzip's CFG has a {kind} edge"));
        let mut broken = cfg.clone();
        let e = broken.procs[pi].edges.remove(ei);
        let from = &broken.procs[pi]
            .blocks
            .iter()
            .find(|b| b.id == e.from)
            .unwrap();
        let last = *from.insns.last().unwrap();
        let after = static_edges(&broken, &od, no_plt);
        assert!(
            after.len() > before && after.iter().any(|m| m.starts_with(&format!("{last:#x} "))),
            "dropping the {kind} edge at {last:#x} went unnoticed: {after:?}"
        );
    }
    let elf = Elf::read(path);
    assert!(jump_tables(&cfg, &elf, &od).1.is_empty());
    let mut broken = cfg.clone();
    let j = broken
        .procs
        .iter_mut()
        .flat_map(|p| p.indirect_jumps.iter_mut())
        .find(|j| j.resolved && j.table.is_some())
        .expect("gzip has a resolved jump table");
    j.targets[0] += 1;
    let addr = j.addr;
    let (_, bad) = jump_tables(&broken, &elf, &od);
    assert!(
        bad.iter().any(|m| m.starts_with(&format!("{addr:#x} "))),
        "a wrong jump-table target at {addr:#x} went unnoticed: {bad:?}"
    );
}

/// The recovered CFG does not depend on the number of threads doing the
/// work: `aetrace cfg --json` on libc is byte-identical with one rayon
/// thread and with the default pool.
#[test]
fn cfg_json_does_not_depend_on_thread_count() {
    let json = |threads: Option<&str>| {
        let mut cmd = Command::new(common::aetrace());
        cmd.args(["cfg", "/lib/x86_64-linux-gnu/libc.so.6", "--json"]);
        if let Some(t) = threads {
            cmd.env("RAYON_NUM_THREADS", t);
        }
        let out = cmd.output().expect("running aetrace");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        out.stdout
    };
    let one = json(Some("1"));
    assert!(
        one == json(None),
        "aetrace cfg --json on libc differs between 1 thread and the default pool"
    );
    assert!(
        one == json(Some("3")),
        "aetrace cfg --json on libc differs between 1 and 3 threads"
    );
}

/// Procedure discovery terminates on a large stripped library whose code
/// holds starts that decode to nothing (it once looped forever on
/// libgcrypt). A watchdog turns a hang into a failure instead of a CI
/// time-out; 120 s is far above the ~0.05 s the run takes.
#[test]
fn discovery_terminates_on_libgcrypt() {
    let path = Path::new("/usr/lib/x86_64-linux-gnu/libgcrypt.so.20");
    assert!(
        path.exists(),
        "{}: .ci/deps installs libgcrypt20",
        path.display()
    );
    let mut child = Command::new(common::aetrace())
        .arg("cfg")
        .arg(path)
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("aetrace runs");
    let start = std::time::Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if start.elapsed() > std::time::Duration::from_secs(120) {
            child.kill().ok();
            panic!("aetrace cfg {} did not finish in 120 s", path.display());
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    assert!(status.success(), "aetrace cfg {}: {status}", path.display());
}
