//! The `aetrace cfg` report: a module summary (counts, indirect jumps,
//! coverage of executable bytes with the reason for every gap), and per
//! procedure Graphviz DOT or JSON (`docs/cfg.md`, and the JSON contract the
//! integration tests consume).
//!
//! Invariant: `covered_bytes + sum(gaps.bytes) == exec_bytes`; every figure
//! is computed from the recovered CFGs, nothing is estimated.

use std::io::Write;
use std::path::Path;

use aetrace_graph::EntityRef;
use iced_x86::{Decoder, DecoderOptions, Mnemonic};
use serde::Serialize;
use serde_json::{json, Value};

use crate::cfg::{BlockKind, CallKind, Cfg, JumpResolution};
use crate::elf::Module;
use crate::error::{Error, Result};
use crate::{ProcKind, Procedure, Program};

/// What `aetrace cfg` prints.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Output {
    /// The module summary and coverage figures as text.
    Summary,
    /// The CFGs as Graphviz dot.
    Dot,
    /// The procedures and CFGs as JSON.
    Json,
}

/// One kind of executable bytes outside recovered procedures.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Gap {
    /// The kind of gap.
    pub reason: GapKind,
    /// Total bytes of gaps of this kind.
    pub bytes: u64,
    /// How many gaps of this kind.
    pub count: u64,
    /// The first few gaps of this kind, for a human to look at.
    pub examples: Vec<(u64, u64)>,
}

/// Why bytes are outside every procedure.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub enum GapKind {
    /// Alignment fill between procedures.
    #[default]
    Padding,
    /// PLT section bytes that are not a stub.
    Plt,
    /// Procedures found but refused.
    NotAnalysable,
    /// Code nothing leads to.
    Unreferenced,
}

impl GapKind {
    /// Every kind, in report order.
    pub const ALL: [GapKind; 4] = [
        GapKind::Padding,
        GapKind::Plt,
        GapKind::NotAnalysable,
        GapKind::Unreferenced,
    ];

    /// The kind's name in reports.
    pub fn name(self) -> &'static str {
        match self {
            GapKind::Padding => "padding",
            GapKind::Plt => "plt",
            GapKind::NotAnalysable => "not-analysable",
            GapKind::Unreferenced => "unreferenced",
        }
    }

    /// What the kind means, for a human.
    pub fn description(self) -> &'static str {
        match self {
            GapKind::Padding => "nop/int3/zero fill between procedures",
            GapKind::Plt => "PLT section bytes that are not a stub",
            GapKind::NotAnalysable => {
                "procedures found but refused (undecodable bytes, a branch into an instruction)"
            }
            GapKind::Unreferenced => "code no FDE, symbol, call, jump or code pointer leads to",
        }
    }
}

/// Module-wide figures.
#[derive(Clone, Debug, Default)]
pub struct Summary {
    /// Procedures found, PLT stubs included.
    pub procedures: usize,
    /// PLT stubs among them.
    pub plt_stubs: usize,
    /// Procedures whose CFG could not be recovered.
    pub not_analysable: usize,
    /// Procedures that never return.
    pub noreturn_procedures: usize,
    /// Basic blocks over all recovered CFGs.
    pub blocks: usize,
    /// CFG edges over all recovered CFGs.
    pub edges: usize,
    /// Blocks with two or more distinct successors, over all CFGs.
    pub predicates: usize,
    /// Direct calls (outside PLT stubs).
    pub calls_direct: usize,
    /// Calls through the PLT.
    pub calls_plt: usize,
    /// Indirect calls.
    pub calls_indirect: usize,
    /// Tail calls.
    pub calls_tail: usize,
    /// Calls that do not return (not tail calls).
    pub calls_noreturn: usize,
    /// Indirect jumps.
    pub ijumps_total: usize,
    /// Indirect jumps resolved (jump tables or computed targets).
    pub ijumps_resolved: usize,
    /// Indirect jumps taken as tail calls.
    pub ijumps_tailcall: usize,
    /// Indirect jumps left unresolved.
    pub ijumps_unresolved: usize,
    /// Why jumps were left unresolved, with counts, by reason.
    pub unresolved_reasons: Vec<(&'static str, usize)>,
    /// Bytes of executable sections.
    pub exec_bytes: u64,
    /// Executable bytes inside procedures with a recovered CFG.
    pub covered_bytes: u64,
    /// Executable bytes outside them, by kind (kinds with no gap omitted).
    pub gaps: Vec<Gap>,
}

impl Summary {
    /// Counts the figures of a recovered program.
    pub fn of(program: &Program) -> Summary {
        let mut s = Summary::default();
        let mut reasons: std::collections::BTreeMap<&'static str, usize> = Default::default();
        for p in program.procs.values() {
            s.procedures += 1;
            if p.kind == ProcKind::Plt {
                s.plt_stubs += 1;
            }
            if p.noreturn {
                s.noreturn_procedures += 1;
            }
            let Ok(cfg) = &p.cfg else {
                s.not_analysable += 1;
                continue;
            };
            s.blocks += cfg.blocks.len();
            s.edges += cfg.edges.len();
            s.predicates += cfg.num_predicates();
            if p.kind == ProcKind::Plt {
                continue;
            }
            for c in &cfg.calls {
                match c.kind {
                    CallKind::Direct => s.calls_direct += 1,
                    CallKind::Plt => s.calls_plt += 1,
                    CallKind::Indirect => s.calls_indirect += 1,
                    CallKind::Syscall => {}
                }
                s.calls_tail += usize::from(c.tail);
                s.calls_noreturn += usize::from(!c.returns && !c.tail);
            }
            for j in &cfg.indirect_jumps {
                s.ijumps_total += 1;
                match j.resolution {
                    JumpResolution::Table { .. } | JumpResolution::Computed(_) => {
                        s.ijumps_resolved += 1
                    }
                    JumpResolution::TailCall => s.ijumps_tailcall += 1,
                    JumpResolution::Unresolved(r) => {
                        s.ijumps_unresolved += 1;
                        *reasons.entry(r).or_default() += 1;
                    }
                }
            }
        }
        s.unresolved_reasons = reasons.into_iter().collect();
        s.coverage(program);
        s
    }

    fn coverage(&mut self, program: &Program) {
        let m = &program.module;
        let mut covered: Vec<(u64, u64, bool)> = program
            .procs
            .values()
            .flat_map(|p| p.ranges.iter().map(move |&(a, b)| (a, b, p.cfg.is_ok())))
            .collect();
        covered.sort_unstable();
        let mut gaps: Vec<Gap> = GapKind::ALL
            .iter()
            .map(|&reason| Gap {
                reason,
                ..Gap::default()
            })
            .collect();
        let mut add = |reason: GapKind, a: u64, b: u64| {
            if b > a {
                let g = gaps
                    .iter_mut()
                    .find(|g| g.reason == reason)
                    .expect("known reason");
                g.bytes += b - a;
                g.count += 1;
                if g.examples.len() < 8 {
                    g.examples.push((a, b));
                }
            }
        };
        for sec in m.exec_sections() {
            self.exec_bytes += sec.size;
            let is_plt = sec.name.starts_with(".plt");
            let mut pos = sec.addr;
            let i0 = covered.partition_point(|&(_, e, _)| e <= sec.addr);
            for &(a, b, ok) in &covered[i0..] {
                if a >= sec.end() {
                    break;
                }
                let (a, b) = (a.max(sec.addr), b.min(sec.end()));
                if a > pos {
                    hole(m, is_plt, pos, a, &mut add);
                }
                if ok {
                    self.covered_bytes += b - a;
                } else {
                    add(GapKind::NotAnalysable, a, b);
                }
                pos = pos.max(b);
            }
            if sec.end() > pos {
                hole(m, is_plt, pos, sec.end(), &mut add);
            }
        }
        gaps.retain(|g| g.count > 0);
        self.gaps = gaps;
    }

    /// Covered share of the executable bytes that are neither PLT nor
    /// padding, in percent.
    pub fn code_coverage(&self) -> f64 {
        let excluded: u64 = self
            .gaps
            .iter()
            .filter(|g| matches!(g.reason, GapKind::Padding | GapKind::Plt))
            .map(|g| g.bytes)
            .sum();
        let plt_covered = 0;
        let base = self.exec_bytes - excluded - plt_covered;
        if base == 0 {
            100.0
        } else {
            100.0 * self.covered_bytes as f64 / base as f64
        }
    }
}

fn is_padding(insn: &iced_x86::Instruction, bytes: &[u8]) -> bool {
    insn.mnemonic() == Mnemonic::Nop
        || insn.mnemonic() == Mnemonic::Int3
        || bytes.iter().all(|&b| b == 0)
}

/// Whether `[a, b)` is all alignment fill (`nop`, `int3`, zero bytes),
/// classified as `aetrace cfg` classifies holes between procedures.
pub fn is_fill(m: &Module, a: u64, b: u64) -> bool {
    let mut fill = true;
    hole(m, false, a, b, &mut |reason, s, e| {
        fill &= reason == GapKind::Padding || s >= e;
    });
    fill
}

/// Splits the hole `[a, b)` into padding and the rest.
fn hole(m: &Module, is_plt: bool, a: u64, b: u64, add: &mut impl FnMut(GapKind, u64, u64)) {
    if is_plt {
        add(GapKind::Plt, a, b);
        return;
    }
    let Some(bytes) = m.bytes_at(a, b - a) else {
        add(GapKind::Unreferenced, a, b);
        return;
    };
    // Non-padding instructions span [first, last): the rest is fill.
    let mut first = None;
    let mut last = a;
    let mut pos = 0usize;
    while pos < bytes.len() {
        let ip = a + pos as u64;
        let mut d = Decoder::with_ip(64, &bytes[pos..], ip, DecoderOptions::NONE);
        let insn = d.decode();
        let len = if insn.is_invalid() { 1 } else { insn.len() };
        let chunk = &bytes[pos..(pos + len).min(bytes.len())];
        if insn.is_invalid() || !is_padding(&insn, chunk) {
            first.get_or_insert(ip);
            last = ip + len as u64;
        }
        pos += len;
    }
    match first {
        None => add(GapKind::Padding, a, b),
        Some(f) => {
            let last = last.min(b);
            add(GapKind::Padding, a, f);
            add(GapKind::Unreferenced, f, last);
            add(GapKind::Padding, last, b);
        }
    }
}

fn text_summary(w: &mut impl Write, program: &Program, s: &Summary) -> std::io::Result<()> {
    let m = &program.module;
    writeln!(
        w,
        "{}: ELF64 x86-64 {}{}{}, entry {:#x}",
        m.path.display(),
        m.kind.as_str(),
        if m.is_static { ", static" } else { "" },
        if m.stripped { ", stripped" } else { "" },
        m.entry
    )?;
    writeln!(
        w,
        "procedures: {} ({} PLT stubs, {} not analysable, {} never return; {} FDEs)",
        s.procedures, s.plt_stubs, s.not_analysable, s.noreturn_procedures, program.fdes
    )?;
    let unowned: u64 = program.unowned.iter().map(|(a, b)| b - a).sum();
    writeln!(
        w,
        "code no procedure holds: {} ranges, {unowned} bytes",
        program.unowned.len()
    )?;
    writeln!(
        w,
        "blocks: {}  edges: {}  predicates: {}",
        s.blocks, s.edges, s.predicates
    )?;
    writeln!(
        w,
        "call sites: {} direct, {} plt, {} indirect; {} tail calls, {} to non-returning callees",
        s.calls_direct, s.calls_plt, s.calls_indirect, s.calls_tail, s.calls_noreturn
    )?;
    writeln!(
        w,
        "indirect jumps: {} total, {} resolved (tables, constant targets), {} indirect tail calls, {} unresolved",
        s.ijumps_total, s.ijumps_resolved, s.ijumps_tailcall, s.ijumps_unresolved
    )?;
    for (r, n) in &s.unresolved_reasons {
        writeln!(w, "  unresolved: {n} {r}")?;
    }
    writeln!(
        w,
        "executable bytes: {}, inside procedures: {} ({:.3}% of code, PLT and padding aside)",
        s.exec_bytes,
        s.covered_bytes,
        s.code_coverage()
    )?;
    for g in &s.gaps {
        writeln!(
            w,
            "  gap {}: {} bytes in {} places ({})",
            g.reason.name(),
            g.bytes,
            g.count,
            g.reason.description()
        )?;
    }
    for p in program.procs.values() {
        if let Err(e) = &p.cfg {
            writeln!(w, "  not analysable: {} at {:#x}: {e}", p.name, p.start)?;
        }
    }
    Ok(())
}

fn proc_text(w: &mut impl Write, p: &Procedure) -> std::io::Result<()> {
    writeln!(
        w,
        "{} [{:#x}, {:#x}) kind {:?}{}",
        p.name,
        p.start,
        p.end,
        p.kind,
        if p.noreturn { ", never returns" } else { "" }
    )?;
    match &p.cfg {
        Err(e) => writeln!(w, "  not analysable: {e}"),
        Ok(cfg) => {
            writeln!(
                w,
                "  {} blocks, {} edges, {} predicates, {} call sites, {} indirect jumps",
                cfg.blocks.len(),
                cfg.edges.len(),
                cfg.num_predicates(),
                cfg.calls.len(),
                cfg.indirect_jumps.len()
            )?;
            for (id, b) in cfg.blocks.iter() {
                write!(
                    w,
                    "  {id} [{:#x}, {:#x}) {} insns ->",
                    b.start,
                    b.end,
                    b.insns.len()
                )?;
                for e in cfg.edges.values().filter(|e| e.from == id) {
                    let to = if e.to == cfg.exit() {
                        "EXIT".to_owned()
                    } else {
                        e.to.to_string()
                    };
                    write!(w, " {to}({})", e.kind.as_str())?;
                }
                writeln!(w)?;
            }
            Ok(())
        }
    }
}

fn dot(w: &mut impl Write, p: &Procedure) -> std::io::Result<()> {
    let title = p.name.replace('"', "\\\"");
    writeln!(w, "digraph \"{title}\" {{")?;
    writeln!(
        w,
        "  label=\"{title} [{:#x}, {:#x})\"; node [shape=box fontname=monospace];",
        p.start, p.end
    )?;
    match &p.cfg {
        Err(e) => writeln!(
            w,
            "  error [label=\"not analysable: {}\"];",
            e.replace('"', "'")
        )?,
        Ok(cfg) => {
            for (id, b) in cfg.blocks.iter() {
                let call = cfg.calls.iter().find(|c| c.block == id);
                let callee = call
                    .map(|c| {
                        let who = c
                            .name
                            .clone()
                            .or(c.target.map(|t| format!("{t:#x}")))
                            .unwrap_or_else(|| "*".into());
                        format!(
                            "\\n{} {}",
                            if c.tail { "tail" } else { "call" },
                            who.replace('"', "'")
                        )
                    })
                    .unwrap_or_default();
                let style = if b.kind == BlockKind::Call {
                    " style=rounded"
                } else {
                    ""
                };
                let entry = if id == cfg.entry { " penwidth=2" } else { "" };
                writeln!(
                    w,
                    "  b{} [label=\"{id} {:#x}..{:#x}\\n{} insns{callee}\"{style}{entry}];",
                    id.index(),
                    b.start,
                    b.end,
                    b.insns.len()
                )?;
            }
            writeln!(w, "  exit [label=\"EXIT\" shape=oval];")?;
            for e in cfg.edges.values() {
                let to = if e.to == cfg.exit() {
                    "exit".to_owned()
                } else {
                    format!("b{}", e.to.index())
                };
                writeln!(
                    w,
                    "  b{} -> {to} [label=\"{}\"];",
                    e.from.index(),
                    e.kind.as_str()
                )?;
            }
        }
    }
    writeln!(w, "}}")
}

/// A procedure as the JSON report writes it (streamed, not built as a
/// `serde_json::Value`: libc's report has 90k blocks).
#[derive(Serialize)]
struct JProc<'a> {
    id: usize,
    name: &'a str,
    start: u64,
    end: u64,
    ranges: &'a [(u64, u64)],
    entries: &'a [u64],
    kind: &'static str,
    sources: Vec<&'static str>,
    noreturn: bool,
    analysable: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    entry_block: Option<usize>,
    blocks: Vec<JBlock>,
    edges: Vec<JEdge>,
    calls: Vec<JCall<'a>>,
    indirect_jumps: Vec<JJump>,
}

#[derive(Serialize)]
struct JBlock {
    id: usize,
    start: u64,
    end: u64,
    insns: Vec<u64>,
    kind: &'static str,
}

#[derive(Serialize)]
#[serde(untagged)]
enum JTo {
    Block(usize),
    Exit(&'static str),
}

#[derive(Serialize)]
struct JEdge {
    from: usize,
    to: JTo,
    kind: &'static str,
}

#[derive(Serialize)]
struct JCall<'a> {
    block: usize,
    kind: &'static str,
    target: Option<u64>,
    name: Option<&'a str>,
    returns: bool,
    tail: bool,
}

#[derive(Serialize)]
struct JJump {
    block: usize,
    addr: u64,
    resolved: bool,
    class: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    table: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    entries: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<&'static str>,
    targets: Vec<u64>,
}

fn proc_json(id: usize, p: &Procedure) -> JProc<'_> {
    let mut j = JProc {
        id,
        name: &p.name,
        start: p.start,
        end: p.end,
        ranges: &p.ranges,
        entries: &p.entries,
        kind: match p.kind {
            ProcKind::Function => "function",
            ProcKind::Plt => "plt",
        },
        sources: p.sources.iter().map(|s| s.as_str()).collect(),
        noreturn: p.noreturn,
        analysable: p.cfg.is_ok(),
        error: p.cfg.as_ref().err().map(String::as_str),
        entry_block: None,
        blocks: Vec::new(),
        edges: Vec::new(),
        calls: Vec::new(),
        indirect_jumps: Vec::new(),
    };
    if let Ok(cfg) = &p.cfg {
        cfg_json(cfg, &mut j);
    }
    j
}

fn cfg_json<'a>(cfg: &'a Cfg, j: &mut JProc<'a>) {
    let exit = cfg.exit();
    j.entry_block = Some(cfg.entry.index());
    j.blocks = cfg
        .blocks
        .iter()
        .map(|(id, b)| JBlock {
            id: id.index(),
            start: b.start,
            end: b.end,
            insns: b.insns.iter().map(|&o| b.start + u64::from(o)).collect(),
            kind: match b.kind {
                BlockKind::Plain => "plain",
                BlockKind::Call => "call",
            },
        })
        .collect();
    j.edges = cfg
        .edges
        .values()
        .map(|e| JEdge {
            from: e.from.index(),
            to: if e.to == exit {
                JTo::Exit("exit")
            } else {
                JTo::Block(e.to.index())
            },
            kind: e.kind.as_str(),
        })
        .collect();
    j.calls = cfg
        .calls
        .iter()
        .map(|c| JCall {
            block: c.block.index(),
            kind: c.kind.as_str(),
            target: c.target,
            name: c.name.as_deref(),
            returns: c.returns,
            tail: c.tail,
        })
        .collect();
    j.indirect_jumps = cfg
        .indirect_jumps
        .iter()
        .map(|ij| {
            let mut o = JJump {
                block: ij.block.index(),
                addr: ij.addr,
                resolved: false,
                class: "unresolved",
                table: None,
                entries: None,
                reason: None,
                targets: Vec::new(),
            };
            match &ij.resolution {
                JumpResolution::Table { table, targets } => {
                    let mut t = targets.clone();
                    t.sort_unstable();
                    t.dedup();
                    o.resolved = true;
                    o.class = "jumptable";
                    o.table = Some(*table);
                    o.entries = Some(targets.len());
                    o.targets = t;
                }
                JumpResolution::Computed(targets) => {
                    o.resolved = true;
                    o.class = "computed";
                    o.targets = targets.clone();
                }
                JumpResolution::TailCall => o.class = "tailcall",
                JumpResolution::Unresolved(r) => o.reason = Some(r),
            }
            o
        })
        .collect();
}

fn summary_json(program: &Program, s: &Summary) -> Value {
    json!({
        "procedures": s.procedures,
        "plt_stubs": s.plt_stubs,
        "not_analysable": s.not_analysable,
        "noreturn_procedures": s.noreturn_procedures,
        "fdes": program.fdes,
        "unowned": program.unowned.iter().map(|&(a, b)| json!([a, b])).collect::<Vec<_>>(),
        "blocks": s.blocks,
        "edges": s.edges,
        "predicates": s.predicates,
        "calls": {
            "direct": s.calls_direct, "plt": s.calls_plt, "indirect": s.calls_indirect,
            "tail": s.calls_tail, "noreturn": s.calls_noreturn,
        },
        "indirect_jumps": {
            "total": s.ijumps_total, "resolved": s.ijumps_resolved,
            "tailcalls": s.ijumps_tailcall, "unresolved": s.ijumps_unresolved,
            "unresolved_reasons": s.unresolved_reasons.iter().map(|(r, n)| json!({"reason": r, "count": n})).collect::<Vec<_>>(),
        },
        "exec_bytes": s.exec_bytes,
        "covered_bytes": s.covered_bytes,
        "code_coverage_percent": s.code_coverage(),
        "gaps": s.gaps.iter().map(|g| json!({
            "reason": g.reason.name(), "bytes": g.bytes, "count": g.count,
            "examples": g.examples.iter().map(|&(a, b)| json!([a, b])).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
    })
}

/// Writes what `aetrace cfg FILE [--function NAME|ADDR] [--dot|--json]`
/// prints to `w`.
pub fn write_cfg(
    file: &Path,
    function: Option<&str>,
    output: Output,
    mut w: &mut dyn Write,
) -> Result<()> {
    let program = Program::open(file)?;
    let selected: Vec<usize> = match function {
        Some(name) => {
            let id = program.find(name).ok_or_else(|| Error::NoSuchFunction {
                path: file.to_owned(),
                name: name.to_owned(),
            })?;
            vec![id.index()]
        }
        None => (0..program.procs.len()).collect(),
    };
    Ok(write_report(&mut w, &program, function, &selected, output)?)
}

/// The report of every procedure of an analysed `program`, as `aetrace
/// cfg FILE` writes it (the fuzz targets render it from bytes).
pub fn write_program(
    program: &Program,
    output: Output,
    mut w: &mut dyn Write,
) -> std::io::Result<()> {
    let all: Vec<usize> = (0..program.procs.len()).collect();
    write_report(&mut w, program, None, &all, output)
}

fn write_report(
    w: &mut impl Write,
    program: &Program,
    function: Option<&str>,
    selected: &[usize],
    output: Output,
) -> std::io::Result<()> {
    let procs = program.procs.as_slice();
    match output {
        Output::Summary => {
            let s = Summary::of(program);
            match function {
                None => text_summary(w, program, &s)?,
                Some(_) => proc_text(w, &procs[selected[0]])?,
            }
        }
        Output::Dot => {
            for &i in selected {
                dot(w, &procs[i])?;
            }
        }
        Output::Json => {
            let s = Summary::of(program);
            let m = &program.module;
            // The module fields, then the procedures streamed one by one.
            let head = json!({
                "path": m.path.display().to_string(),
                "elf_type": m.kind.as_str(),
                "static": m.is_static,
                "stripped": m.stripped,
                "entry": m.entry,
                "summary": summary_json(program, &s),
            });
            let head = serde_json::to_string(&head).map_err(std::io::Error::from)?;
            let head = head.strip_suffix('}').expect("a JSON object ends with }");
            write!(w, "{head},\"procedures\":[")?;
            for (k, &i) in selected.iter().enumerate() {
                if k > 0 {
                    w.write_all(b",")?;
                }
                serde_json::to_writer(&mut *w, &proc_json(i, &procs[i]))
                    .map_err(std::io::Error::from)?;
            }
            writeln!(w, "]}}")?;
        }
    }
    Ok(())
}
