//! The static rewriter (design decisions 2-6; paper 003 Section 4): decides
//! which procedures are traced, places their witnesses (Section 4.2:
//! blocking witnesses, then the constrained maximum spanning tree), plans
//! what each call site records, generates the instrumented copies
//! ([`codegen`]) next to the generated runtime, and writes the new ELF
//! ([`elfout`]) and the program database the regenerator reads.
//!
//! Invariants:
//! - a procedure is either traced (relocated, springboard at its entry) or
//!   left alone with a reason recorded in the database; nothing in between;
//! - the database's witness numbers are the placement's
//!   (`WitnessPlacement` numbering) and call-return edges never carry one
//!   (their weight forces them into the spanning tree), so a witness is
//!   always written in the procedure that owns it;
//! - a call site has a RETURN record exactly when its callee may run traced
//!   code as a callback before control comes back (`docs/rewrite.md`).

mod checks;
pub mod codegen;
pub mod counters;
pub mod elfout;
pub mod error;

pub mod liveness;
pub mod pathprof;
pub mod unwind;

use std::collections::{HashMap, HashSet};
use std::path::Path;

use aetrace_format::progdb::{
    BlockDb, CallDb, CallTarget, EdgeDb, EdgeKindDb, ProcDb, ProcStatus, ProgramDb,
};
use aetrace_graph::trace::{
    all_predicate_edges, naive_blocking_needed, place_witnesses, WitnessPlacement,
};
use aetrace_graph::weights::heuristic;
use aetrace_graph::{BlockId, EntityRef, ProcId, VertexKind};
use aetrace_runtime::RuntimeAddrs;

pub use crate::error::{Error, Result};
use aetrace_analysis::cfg::{BlockKind, CallKind, Cfg, EdgeKind, JumpResolution};
use aetrace_analysis::elf::ElfKind;
use aetrace_analysis::imports;
use aetrace_analysis::{ProcKind, Program};
use codegen::{CallPlan, EntryStub, ProcPlan, Table};

/// Which witness placement to use (paper 003 compares them).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Default)]
pub enum Placement {
    /// Blocking witnesses, then the constrained maximum spanning tree.
    #[default]
    Optimal,
    /// Old AE: a witness on every edge out of a predicate.
    AllPredicates,
    /// A witness on every edge into a call or EXIT, then the tree.
    NaiveBlocking,
}

/// What the rewritten program writes.
#[derive(Clone, Debug)]
pub enum How {
    /// Witnesses (`aetrace record`), with this placement.
    Trace(Placement),
    /// Counters (`aetrace profile`, [`counters`]).
    Count(counters::CountSpec),
}

/// Where the counters of a counting rewrite are.
#[derive(Clone, Debug, Default)]
pub struct CountLayout {
    /// Link-time address of counter 0 (page-aligned).
    pub vaddr: u64,
    /// Number of 8-byte counters.
    pub len: u32,
    /// Bytes mapped from the recorder's memfd (whole pages).
    pub bytes: u64,
    /// Increments are `lock add` (the program can start threads).
    pub atomic: bool,
    /// Per procedure (by index), its counters when traced.
    pub procs: Vec<Option<counters::ProcCounters>>,
    /// Event counting: the increment of each counter number, all added to
    /// counter 0 (`codegen::Counting::amounts`).
    pub amounts: Vec<i32>,
    /// Path profiling: per procedure (by index), its path numbering when it
    /// has path counters (else its edge counters are in `procs`).
    pub paths: Vec<Option<pathprof::ProcPaths>>,
    /// Path profiling: the operation list of each counter number.
    pub ops: Vec<Vec<pathprof::PathOp>>,
    /// Path profiling: link-time address of the state segment.
    pub path_state: u64,
}

/// The rewritten module.
pub struct Instrumented {
    pub elf: Vec<u8>,
    pub db: ProgramDb,
    pub build_id: Vec<u8>,
    /// Bytes of address space from vaddr 0 in the original module.
    pub size: u64,
    /// Procedures left alone and why, one line each.
    pub notes: Vec<String>,
    pub traced: usize,
    pub witness_edges: usize,
    /// Counting mode: where the counters are.
    pub counting: Option<CountLayout>,
}

const PAGE: u64 = 4096;
/// R_X86_64_IRELATIVE: its addend is an IFUNC resolver, run by ld.so
/// before the runtime is initialised.
const R_X86_64_IRELATIVE: u32 = 37;

/// The initial value of the event counter for `--stop-at n`: `-n`.
pub fn stop_start(n: u64) -> i64 {
    0i64.saturating_sub_unsigned(n)
}

/// A property that spreads up the call graph, to its least fixpoint: `may`
/// holds the seeds (a procedure missing from it: false); a procedure with
/// a CFG gains the property when one of its calls `spreads` under the
/// current map.
fn spread_up_calls(
    prog: &Program,
    mut may: HashMap<ProcId, bool>,
    spreads: impl Fn(&HashMap<ProcId, bool>, &aetrace_analysis::cfg::CallSite) -> bool,
) -> HashMap<ProcId, bool> {
    loop {
        let mut changed = false;
        for (id, p) in prog.procs.iter() {
            let Ok(cfg) = &p.cfg else { continue };
            if !may.get(&id).copied().unwrap_or(false) && cfg.calls.iter().any(|c| spreads(&may, c))
            {
                may.insert(id, true);
                changed = true;
            }
        }
        if !changed {
            return may;
        }
    }
}

/// Procedures whose every way out is a tail jump to a `fork`-like callee
/// (an import by name, a static libc's `fork`, or another such
/// procedure), as perl's `Perl_my_fork` is (`jmp fork@plt`): a call to one
/// returns twice, in the parent and in the child, like a call to `fork`,
/// so it gets `fork_child` at its return point (a tail jump has none: the
/// child ran on in its parent's slot). The value: whether that `fork` runs
/// `pthread_atfork` handlers. A procedure that can also return by itself
/// is not one (its return point would take any 0 it returns for a child).
fn fork_wrappers(
    prog: &Program,
    by_start: &HashMap<u64, ProcId>,
    fork_like: impl Fn(&aetrace_analysis::cfg::CallSite) -> Option<bool>,
) -> HashMap<ProcId, bool> {
    let mut found: HashMap<ProcId, bool> = HashMap::new();
    loop {
        let mut changed = false;
        for (id, p) in prog.procs.iter() {
            let Ok(cfg) = &p.cfg else { continue };
            if found.contains_key(&id) {
                continue;
            }
            let mut atfork = false;
            let mut tails = 0;
            let all = cfg.edges.values().all(|e| match e.kind {
                EdgeKind::Return | EdgeKind::Halt => false,
                EdgeKind::TailCall => {
                    tails += 1;
                    let site = cfg.calls.iter().find(|c| c.block == e.from && c.tail);
                    let forks = site.and_then(|c| {
                        fork_like(c).or_else(|| {
                            c.target
                                .and_then(|t| by_start.get(&t))
                                .and_then(|q| found.get(q).copied())
                        })
                    });
                    atfork |= forks == Some(true);
                    forks.is_some()
                }
                _ => true,
            });
            if all && tails > 0 {
                found.insert(id, atfork);
                changed = true;
            }
        }
        if !changed {
            return found;
        }
    }
}

fn rewrite_err(path: &Path, what: impl Into<String>) -> Error {
    Error::Rewrite {
        path: path.to_owned(),
        what: what.into(),
    }
}

/// Length of the `jmp rel32` written over a traced procedure's entry.
const SPRINGBOARD: u64 = 5;

/// Whether the springboard fits at `p`'s entry: inside its primary range,
/// or, for a shorter procedure (liblzma's 4-byte `mov 0x18(%rdi), %eax;
/// ret`), running on into the alignment fill after it, when everything from
/// its end to the next procedure's range (or the section's end) is fill
/// (`nop`, `int3`, zero bytes) that belongs to no procedure: no code runs
/// or reads those bytes, so overwriting them changes nothing else.
fn springboard_fits(prog: &Program, p: &aetrace_analysis::Procedure) -> bool {
    let need = p.start + SPRINGBOARD;
    if p.end >= need {
        return true;
    }
    let Some(section) = prog.module.exec_sections().find(|s| s.contains(p.start)) else {
        return false;
    };
    let next = prog
        .procs
        .values()
        .flat_map(|q| q.ranges.iter().map(|&(s, _)| s))
        .filter(|&s| s >= p.end)
        .fold(section.end(), u64::min);
    next >= need && aetrace_analysis::report::is_fill(&prog.module, p.end, next)
}

/// The PLT stubs whose import jump is traced without a witness
/// (docs/rewrite.md step 5, "PLT stubs"; `CallDb::plt`): the bound
/// outcome writes nothing, the lazy one a LAZY record first, and the way
/// into the stub is the counted transfer. A stub qualifies when its
/// `jmp [GOT]` either has one outcome (a slot bound at load time, e.g.
/// `.plt.got`'s GLOB_DAT: no lazy binding ever) or falls back to its own
/// lazy-binding half, where its JUMP_SLOT's initial value points (that
/// value is then redirected to the copy's LAZY piece, `Copies::lazy_slots`;
/// ld.so relocates it like the original), the half being the stub's own
/// second block or, in the IBT layout (`.plt.sec`), a `.plt` entry of its
/// own. `exit`-like imports keep the GOT compare: their EXIT record would
/// precede LAZY.
fn recorded_stubs(
    prog: &Program,
    traced: impl Fn(ProcId) -> bool,
    plt0: Option<ProcId>,
) -> HashMap<ProcId, RecordedStub> {
    let module = &prog.module;
    let by_start: HashMap<u64, ProcId> = prog.procs.iter().map(|(id, p)| (p.start, id)).collect();
    let mut out = HashMap::new();
    for (id, p) in prog.procs.iter() {
        let Ok(cfg) = &p.cfg else { continue };
        if p.kind != ProcKind::Plt || Some(id) == plt0 || !traced(id) {
            continue;
        }
        let mut jumps = cfg
            .calls
            .iter()
            .filter(|c| c.kind == CallKind::Plt && c.target.is_none() && c.tail);
        let (Some(c), None) = (jumps.next(), jumps.next()) else {
            continue;
        };
        if c.name.as_deref().is_some_and(imports::is_exit_like) {
            continue;
        }
        let blk = &cfg.blocks[c.block];
        let at = blk.last_insn();
        let Some(bytes) = module.bytes_at(at, blk.end - at) else {
            continue;
        };
        let insn =
            iced_x86::Decoder::with_ip(64, bytes, at, iced_x86::DecoderOptions::NONE).decode();
        if !insn.is_ip_rel_memory_operand() {
            continue;
        }
        let slot = insn.ip_rel_memory_address();
        let jump_slot = module
            .plt_relocs
            .iter()
            .any(|r| r.offset == slot && r.r_type == aetrace_analysis::elf::R_X86_64_JUMP_SLOT);
        let initial = module
            .bytes_at(slot, 8)
            .and_then(|v| v.try_into().ok())
            .map(u64::from_le_bytes);
        let out_edges: Vec<_> = cfg.edges.values().filter(|e| e.from == c.block).collect();
        match out_edges[..] {
            [e] if e.to == cfg.exit() && !jump_slot => {
                out.insert(id, RecordedStub::default());
            }
            // IBT (`.plt.sec`): the lazy half is a `.plt` entry of its own
            // (`endbr64; push n; jmp <plt0>`), where the slot points.
            [e] if e.to == cfg.exit() => {
                let entry = initial
                    .and_then(|a| by_start.get(&a).copied())
                    .filter(|&l| {
                        l != id
                            && Some(l) != plt0
                            && traced(l)
                            && prog.procs[l].kind == ProcKind::Plt
                    });
                if let Some(l) = entry {
                    out.insert(
                        id,
                        RecordedStub {
                            slot: Some(slot),
                            entry: Some(l),
                        },
                    );
                }
            }
            [a, b] if jump_slot => {
                let Some(lazy) = [a, b].into_iter().find(|e| e.to != cfg.exit()) else {
                    continue;
                };
                if initial == Some(cfg.blocks[lazy.to].start) {
                    out.insert(
                        id,
                        RecordedStub {
                            slot: Some(slot),
                            entry: None,
                        },
                    );
                }
            }
            _ => {}
        }
    }
    out
}

/// A PLT stub of [`recorded_stubs`].
#[derive(Clone, Copy, Debug, Default)]
struct RecordedStub {
    /// The GOT slot whose initial value becomes the LAZY piece (`None`:
    /// bound at load time, no lazy outcome).
    slot: Option<u64>,
    /// The lazy-binding half when it is a procedure of its own (IBT's
    /// `.plt` entry), entered from the LAZY piece past its outside-entry
    /// stub (`CallDb::lazy`).
    entry: Option<ProcId>,
}

/// Why procedure `proc` cannot be traced, if it cannot.
fn left_alone_reason(prog: &Program, id: ProcId, ifuncs: &[u64]) -> Option<String> {
    let p = &prog.procs[id];
    let cfg = match &p.cfg {
        Err(e) => return Some(format!("not analysable: {e}")),
        Ok(c) => c,
    };
    if !springboard_fits(prog, p) {
        return Some(format!(
            "shorter than a springboard ({SPRINGBOARD} bytes) and not followed by enough fill"
        ));
    }
    if ifuncs.contains(&p.start) {
        return Some("IFUNC resolver (runs before the runtime)".into());
    }
    if p.entries.len() > 1 {
        return Some(format!("{} entry points", p.entries.len()));
    }
    // `xbegin` ends its block; its abort path is not relocated (a witness
    // inside a transaction would abort it anyway).
    for b in cfg.blocks.values() {
        let at = b.last_insn();
        let insn = prog.module.bytes_at(at, b.end - at).map(|bytes| {
            iced_x86::Decoder::with_ip(64, bytes, at, iced_x86::DecoderOptions::NONE).decode()
        });
        if insn.is_some_and(|i| i.mnemonic() == iced_x86::Mnemonic::Xbegin) {
            return Some(format!("transactional memory (xbegin at {at:#x})"));
        }
    }
    for j in &cfg.indirect_jumps {
        match &j.resolution {
            JumpResolution::Unresolved(why) => {
                return Some(format!("unresolved indirect jump at {:#x}: {why}", j.addr))
            }
            // No path reaches the jump (its guards compare constants).
            JumpResolution::Computed(t) if t.is_empty() => {}
            JumpResolution::Computed(_) => {
                return Some(format!(
                    "indirect jump at {:#x} to computed code addresses",
                    j.addr
                ))
            }
            JumpResolution::Table { .. } | JumpResolution::TailCall => {}
        }
    }
    None
}

/// Entry addresses of a static libc's functions that must run untraced,
/// like the imports of a dynamic program, by any of their symbol names
/// (glibc's `longjmp`, `siglongjmp` and `__libc_siglongjmp` are one
/// function).
#[derive(Default)]
struct LibcFamily {
    /// Save a context (`setjmp`).
    setjmp: Vec<u64>,
    /// Resume one (`longjmp`): never return.
    longjmp: Vec<u64>,
    /// Create a process (`fork`): the child must get its own slot before
    /// it runs traced code.
    fork: Vec<u64>,
    /// Those of `fork` that run `pthread_atfork` handlers.
    atfork: Vec<u64>,
}

fn libc_family(module: &aetrace_analysis::elf::Module) -> LibcFamily {
    let mut f = LibcFamily::default();
    if !module.is_static {
        return f;
    }
    for s in &module.func_symbols {
        let n = s.name.as_str();
        if imports::is_setjmp_like(n) {
            f.setjmp.push(s.addr);
        } else if imports::is_longjmp_like(n) || matches!(n, "__libc_siglongjmp" | "__libc_longjmp")
        {
            f.longjmp.push(s.addr);
        } else if imports::is_fork_like(n) || n == "__fork" {
            f.fork.push(s.addr);
            if imports::runs_atfork_handlers(n) {
                f.atfork.push(s.addr);
            }
        }
    }
    f
}

/// A stripped static libc's setjmp and longjmp (no names to go by),
/// recognised by what they do with glibc's pointer guard `fs:[0x30]`: a
/// setjmp mangles its caller's stack pointer (`lea R, [rsp+8]`, then
/// `xor R, fs:[0x30]`), a longjmp demangles one and switches to it
/// (`xor R, fs:[0x30]`, then `mov rsp, R`). The wrappers that tail-jump
/// to a setjmp (`_setjmp`, `setjmp`) save a context too.
fn guarded_family(prog: &Program, f: &mut LibcFamily) {
    use iced_x86::{Decoder, DecoderOptions, Mnemonic, OpKind, Register};
    for (_, p) in prog.procs.iter() {
        let Ok(cfg) = &p.cfg else { continue };
        let mut blocks: Vec<_> = cfg.blocks.values().collect();
        blocks.sort_by_key(|b| b.start);
        let (mut rsp8, mut demangled) = (Vec::new(), Vec::new());
        let (mut saves, mut switches) = (false, false);
        for b in blocks {
            let Some(bytes) = prog.module.bytes_at(b.start, b.end - b.start) else {
                continue;
            };
            for i in Decoder::with_ip(64, bytes, b.start, DecoderOptions::NONE) {
                let reg0 = (i.op_count() == 2 && i.op0_kind() == OpKind::Register)
                    .then(|| i.op0_register());
                let mem = i.op_count() == 2 && i.op1_kind() == OpKind::Memory;
                match (i.mnemonic(), reg0) {
                    (Mnemonic::Lea, Some(r))
                        if mem
                            && i.memory_base() == Register::RSP
                            && i.memory_index() == Register::None
                            && i.memory_displacement64() == 8 =>
                    {
                        rsp8.push(r)
                    }
                    (Mnemonic::Xor, Some(r))
                        if mem
                            && i.memory_segment() == Register::FS
                            && i.memory_base() == Register::None
                            && i.memory_index() == Register::None
                            && i.memory_displacement64() == 0x30 =>
                    {
                        saves |= rsp8.contains(&r);
                        demangled.push(r);
                    }
                    (Mnemonic::Mov, Some(Register::RSP))
                        if i.op1_kind() == OpKind::Register
                            && demangled.contains(&i.op1_register()) =>
                    {
                        switches = true
                    }
                    _ => {}
                }
            }
        }
        if switches {
            f.longjmp.push(p.start);
        } else if saves {
            f.setjmp.push(p.start);
        }
    }
    loop {
        let wrappers: Vec<u64> = prog
            .procs
            .values()
            .filter(|p| !f.setjmp.contains(&p.start))
            .filter(|p| {
                p.cfg.as_ref().is_ok_and(|cfg| {
                    cfg.calls
                        .iter()
                        .any(|c| c.tail && c.target.is_some_and(|t| f.setjmp.contains(&t)))
                })
            })
            .map(|p| p.start)
            .collect();
        if wrappers.is_empty() {
            return;
        }
        f.setjmp.extend(wrappers);
    }
}

/// Decodes the entry format of a jump table from its first entry.
fn table_format(prog: &Program, table: u64, first: u64) -> Option<bool> {
    let rel = prog.module.bytes_at(table, 4)?;
    let rel = i32::from_le_bytes(rel.try_into().ok()?);
    if table.wrapping_add(rel as i64 as u64) == first {
        return Some(true);
    }
    let abs = prog.module.bytes_at(table, 8)?;
    (u64::from_le_bytes(abs.try_into().ok()?) == first).then_some(false)
}

fn edge_kind_db(k: EdgeKind) -> EdgeKindDb {
    match k {
        EdgeKind::FallThrough => EdgeKindDb::FallThrough,
        EdgeKind::Taken => EdgeKindDb::Taken,
        EdgeKind::JumpTable => EdgeKindDb::JumpTable,
        EdgeKind::CallReturn => EdgeKindDb::CallReturn,
        EdgeKind::Return => EdgeKindDb::Return,
        EdgeKind::TailCall => EdgeKindDb::TailCall,
        EdgeKind::NoReturn => EdgeKindDb::NoReturn,
        EdgeKind::Halt => EdgeKindDb::Halt,
    }
}

/// The witness placement of one procedure.
fn placement(cfg: &Cfg, which: Placement) -> WitnessPlacement {
    let g = cfg.to_graph();
    let mut w = heuristic(&g);
    // Edges out of call vertices never carry a witness: it would be
    // written after the callee's records (or never, after a call that does
    // not return). Such edges form no cycle among themselves, so a weight
    // above every other puts all of them in the maximum spanning tree.
    let top = w.values().fold(1.0f64, |m, &x| m.max(x)) * 4.0 + 1.0;
    for e in g.edge_ids() {
        if g.kind(g.edge(e).from) == VertexKind::Call && e != g.exit_root() {
            w[e] = top;
        }
    }
    match which {
        Placement::Optimal => place_witnesses(&g, &w),
        Placement::AllPredicates => all_predicate_edges(&g),
        // Not the paper's naive placement itself, which would also force a
        // witness on the edge from one call vertex into another (no code
        // could write it: see the weights above) and in procedures without
        // predicates, which need none (`<plt0>`'s witness before its jump to
        // ld.so came after an `exit` stub's EXIT record: regen refused it).
        Placement::NaiveBlocking => naive_blocking_needed(&g, &w),
    }
}

/// Fault injection for the tests of `aetrace verify` (docs/verify.md):
/// `AETRACE_FAULT_DROP_WITNESS=PROC:K` makes the copy of procedure PROC
/// not write witness K while the program database still says it does, a
/// deliberately broken placement. The trace gets a NOTE saying so.
pub const FAULT_ENV: &str = "AETRACE_FAULT_DROP_WITNESS";

/// The procedure and witness [`FAULT_ENV`] names, if it is set.
pub fn fault_injection(path: &Path) -> Result<Option<(String, u32)>> {
    let Some(v) = std::env::var_os(FAULT_ENV) else {
        return Ok(None);
    };
    let v = v.to_string_lossy();
    v.rsplit_once(':')
        .and_then(|(p, k)| Some((p.to_owned(), k.parse().ok()?)))
        .map(Some)
        .ok_or_else(|| rewrite_err(path, format!("{FAULT_ENV}={v}: expected PROCEDURE:WITNESS")))
}

/// Rewrites the executable at `path` to write witnesses.
pub fn instrument(path: &Path, which: Placement) -> Result<Instrumented> {
    instrument_module(path, which, 0)
}

/// Rewrites the executable (`tag` 0) or a shared library (`tag` in
/// `1..MAX_MODULES`, its module id in the trace) to write witnesses. A
/// library's ENTER and LANDING records carry `tag` above `TAG_SHIFT`; its
/// runtime copy has no preinit entry (shared objects have no
/// DT_PREINIT_ARRAY) and attaches to the executable's region when its
/// first traced code runs.
pub fn instrument_module(path: &Path, which: Placement, tag: u32) -> Result<Instrumented> {
    instrument_with(path, &How::Trace(which), tag)
}

/// Imports that start threads: counters then need `lock add`.
const THREAD_STARTERS: &[&str] = &["pthread_create", "clone", "clone3", "thrd_create"];

/// The module imports a function that starts threads, or, static, has one
/// (its libc is part of it).
pub fn starts_threads(module: &aetrace_analysis::elf::Module) -> bool {
    imports_any(module, THREAD_STARTERS)
        || (module.is_static
            && module
                .func_symbols
                .iter()
                .any(|s| THREAD_STARTERS.contains(&s.name.as_str())))
}

/// Whether `module` imports one of `names` (symbol versions ignored).
fn imports_any(module: &aetrace_analysis::elf::Module, names: &[&str]) -> bool {
    module
        .plt_relocs
        .iter()
        .chain(&module.dyn_relocs)
        .filter_map(|r| r.sym_name.as_deref())
        .any(|n| names.contains(&n.split('@').next().unwrap_or(n)))
}

/// Rewrites module `tag` at `path` (see [`instrument_module`]): witnesses or
/// counters.
pub fn instrument_with(path: &Path, how: &How, tag: u32) -> Result<Instrumented> {
    use aetrace_runtime::layout::{MAX_MODULES, TAG_SHIFT};
    let fault = fault_injection(path)?;
    let which = match how {
        How::Trace(p) => *p,
        How::Count(_) => Placement::Optimal,
    };
    let prog = Program::open(path)?;
    let module = &prog.module;
    let library = module.kind == ElfKind::Shared;
    if let How::Count(spec) = how {
        // A static executable's counters are mapped at its entry point,
        // before its libc sets up `fs` (TLS): the thread owner of
        // `--stop-at` and of path profiles cannot be read there.
        if module.is_static && (spec.stop_at.is_some() || spec.paths) && starts_threads(module) {
            return Err(rewrite_err(
                path,
                format!(
                    "{} of a static executable that can start threads (it has {}): not \
                     supported, its first thread is not known at the entry point",
                    if spec.paths {
                        "path profiles"
                    } else {
                        "--stop-at"
                    },
                    THREAD_STARTERS
                        .iter()
                        .find(|n| module.func_symbols.iter().any(|s| s.name == **n))
                        .unwrap_or(&"a thread starter")
                ),
            ));
        }
    }
    if library != (tag != 0) || tag >= MAX_MODULES {
        return Err(rewrite_err(
            path,
            if library {
                "a shared object can only be instrumented as a library (--libs)"
            } else {
                "an executable cannot be instrumented as a library"
            },
        ));
    }
    if prog.procs.len() >= 1 << TAG_SHIFT {
        return Err(rewrite_err(
            path,
            format!(
                "{} procedures: ENTER records number at most {} per module",
                prog.procs.len(),
                1u32 << TAG_SHIFT
            ),
        ));
    }
    let elf = goblin::elf::Elf::parse(module.bytes())
        .map_err(|e| rewrite_err(path, format!("program headers: {e}")))?;
    let loads: Vec<_> = elf
        .program_headers
        .iter()
        .filter(|ph| ph.p_type == goblin::elf::program_header::PT_LOAD)
        .collect();
    let link_base = loads.iter().map(|ph| ph.p_vaddr).min().unwrap_or(0) & !(PAGE - 1);
    let size = loads
        .iter()
        .map(|ph| ph.p_vaddr + ph.p_memsz)
        .max()
        .unwrap_or(0);
    // In a static executable the runtime's init runs at the entry point,
    // before the libc's startup code applies IRELATIVE relocations: its
    // IFUNC resolvers are ordinary callbacks there.
    let mut ifuncs: Vec<u64> = module
        .dyn_relocs
        .iter()
        .chain(&module.plt_relocs)
        .filter(|r| r.r_type == R_X86_64_IRELATIVE && !module.is_static)
        .map(|r| r.addend as u64)
        .collect();
    // An exported IFUNC's resolver runs when ld.so relocates the objects
    // that import it, before the executable's preinit: a library's too.
    ifuncs.extend(
        elf.syms
            .iter()
            .chain(elf.dynsyms.iter())
            .filter(|s| s.st_type() == goblin::elf::sym::STT_GNU_IFUNC && s.st_shndx != 0)
            .map(|s| s.st_value),
    );

    // 1. What is traced.
    let mut reasons: HashMap<ProcId, String> = HashMap::new();
    for id in prog.procs.keys() {
        if let Some(r) = left_alone_reason(&prog, id, &ifuncs) {
            reasons.insert(id, r);
        }
    }
    // Jump tables must be rewritable.
    let mut tables: HashMap<ProcId, Vec<(u64, bool, aetrace_analysis::cfg::IndirectJump)>> =
        HashMap::new();
    for (id, p) in prog.procs.iter() {
        let Ok(cfg) = &p.cfg else { continue };
        if reasons.contains_key(&id) {
            continue;
        }
        for j in &cfg.indirect_jumps {
            if let JumpResolution::Table { table, targets } = &j.resolution {
                // A case in another procedure (a `.cold` part) would be a
                // tail call through the table: not rewritten.
                if let Some(t) = targets.iter().find(|&&t| cfg.block_at(t).is_none()) {
                    reasons.insert(
                        id,
                        format!(
                            "jump table at {table:#x} has a case outside the procedure ({t:#x})"
                        ),
                    );
                    continue;
                }
                match targets
                    .first()
                    .and_then(|&t| table_format(&prog, *table, t))
                {
                    Some(false) if module.kind == ElfKind::Pie => {
                        reasons.insert(id, format!("absolute jump table at {table:#x} in a PIE"));
                    }
                    Some(rel) => tables.entry(id).or_default().push((*table, rel, j.clone())),
                    None => {
                        reasons.insert(
                            id,
                            format!("jump table at {table:#x}: unknown entry format"),
                        );
                    }
                }
            }
        }
    }
    let traced = |id: ProcId, reasons: &HashMap<ProcId, String>| !reasons.contains_key(&id);
    let by_start: HashMap<u64, ProcId> = prog.procs.iter().map(|(id, p)| (p.start, id)).collect();

    // A static libc's setjmp, longjmp and fork families are left alone,
    // with everything they call, and called like the imports: SETJMP,
    // LONGJMP records and `fork_child` at their call sites, whatever alias
    // the call names. (A fork child must not run traced code before
    // `fork_child` gives it its own slot.)
    let mut family = libc_family(module);
    let stripped = module.is_static && family.setjmp.is_empty() && family.longjmp.is_empty();
    if stripped {
        guarded_family(&prog, &mut family);
    }
    let (setjmps, longjmps) = (&family.setjmp, &family.longjmp);
    let fork_tails = fork_wrappers(&prog, &by_start, |c| {
        let named = c.name.as_deref();
        (c.target.is_some_and(|t| family.fork.contains(&t))
            || named.is_some_and(imports::is_fork_like))
        .then(|| {
            c.target.is_some_and(|t| family.atfork.contains(&t))
                || named.is_some_and(imports::runs_atfork_handlers)
        })
    });
    // A call that saves a context (may return again, through `longjmp`).
    let setjmp_call = |c: &aetrace_analysis::cfg::CallSite| {
        !c.tail
            && (c.target.is_some_and(|t| setjmps.contains(&t))
                || c.name.as_deref().is_some_and(imports::is_setjmp_like))
    };
    let mut family_procs: HashSet<ProcId> = HashSet::new();
    if module.is_static {
        let mut work: Vec<u64> = setjmps
            .iter()
            .chain(longjmps)
            .chain(&family.fork)
            .copied()
            .collect();
        while let Some(a) = work.pop() {
            let Some(&id) = by_start.get(&a) else {
                continue;
            };
            if !family_procs.insert(id) {
                continue;
            }
            reasons.entry(id).or_insert_with(|| {
                "setjmp/longjmp/fork family of a static libc (runs untraced, called like \
                 an import)"
                    .into()
            });
            if let Ok(cfg) = &prog.procs[id].cfg {
                work.extend(cfg.calls.iter().filter_map(|c| c.target));
            }
        }
    }

    // 2. Call targets and which calls need a RETURN record.
    let plt0 = prog
        .procs
        .iter()
        .find(|(_, p)| p.kind == ProcKind::Plt && p.name == "<plt0>")
        .map(|(id, _)| id);
    let lazy_stubs = match how {
        How::Trace(_) => recorded_stubs(&prog, |q| traced(q, &reasons), plt0),
        How::Count(_) => HashMap::new(),
    };
    let callback_capable = |name: Option<&str>| match name {
        Some(n) => !imports::is_callback_free(n) && !imports::is_exit_like(n),
        None => true,
    };
    // Procedures that call or tail-call a traced procedure directly (past
    // its outside-entry stub): see `checks`.
    let calls_traced: HashSet<ProcId> = prog
        .procs
        .iter()
        .filter(|(_, p)| {
            p.cfg.as_ref().is_ok_and(|cfg| {
                checks::reaches_call(cfg, |t| {
                    by_start.get(&t).is_some_and(|&q| traced(q, &reasons))
                })
            })
        })
        .map(|(id, _)| id)
        .collect();
    // Bounded procedures (see `checks`): calls to them need no
    // return-point check. `<plt0>` jumps to ld.so's resolver.
    let bounded: HashSet<ProcId> = prog
        .procs
        .iter()
        .filter(|&(id, p)| {
            p.start != module.entry
                && p.cfg.as_ref().is_ok_and(|cfg| {
                    checks::bounded(cfg, !p.landing_pads.is_empty(), |c| {
                        match c.target.and_then(|t| by_start.get(&t)) {
                            Some(&q) if traced(q, &reasons) => Some(q) == plt0,
                            _ => {
                                Some(id) == plt0
                                    || c.name.as_deref().is_some_and(|n| {
                                        imports::is_callback_free(n) && !imports::is_exit_like(n)
                                    })
                            }
                        }
                    })
                })
        })
        .map(|(id, _)| id)
        .collect();
    // may_tail[p]: p may leave by a tail call into code that calls back.
    let mut may_tail: HashMap<ProcId, bool> = HashMap::new();
    for (id, p) in prog.procs.iter() {
        let Ok(cfg) = &p.cfg else { continue };
        let direct = cfg.calls.iter().filter(|c| c.tail).any(|c| {
            let to_traced = c
                .target
                .and_then(|t| by_start.get(&t))
                .is_some_and(|&q| traced(q, &reasons));
            !to_traced && Some(id) != plt0 && callback_capable(c.name.as_deref())
        });
        may_tail.insert(id, direct);
    }
    let may_tail = spread_up_calls(&prog, may_tail, |may, c| {
        c.tail
            && c.target
                .and_then(|t| by_start.get(&t))
                .is_some_and(|q| traced(*q, &reasons) && may[q])
    });

    // Counting: which calls may leave their frame abandoned (virtual exit
    // edges, `counters`: the process ends below them, a throw or a longjmp
    // passes them): a call that does not return (`exit`, `__cxa_throw`,
    // `_Unwind_Resume`, `longjmp`, ...), a call to a procedure that may,
    // and calls that can run traced code or throw (indirect, external)
    // once any procedure may.
    let may_exit_call = {
        // A static libc's longjmp ends in an indirect jump: the CFG cannot
        // tell that it does not return.
        let jumps = |c: &aetrace_analysis::cfg::CallSite| {
            !c.returns
                || c.name.as_deref().is_some_and(imports::is_longjmp_like)
                || c.target.is_some_and(|t| longjmps.contains(&t))
        };
        let mut may: HashMap<ProcId, bool> = HashMap::new();
        for (id, p) in prog.procs.iter() {
            let m = match &p.cfg {
                Ok(cfg) => cfg.calls.iter().any(jumps),
                Err(_) => true,
            };
            may.insert(id, m);
        }
        // A program with landing pads catches or cleans up after
        // exceptions: any external call may throw through its caller.
        let any =
            may.values().any(|&m| m) || prog.procs.iter().any(|(_, p)| !p.landing_pads.is_empty());
        let by_start = &by_start;
        let callback_capable = &callback_capable;
        let call_may =
            move |may: &HashMap<ProcId, bool>, c: &aetrace_analysis::cfg::CallSite| -> bool {
                if jumps(c) {
                    return true;
                }
                match c.target.and_then(|t| by_start.get(&t)) {
                    Some(q) if Some(*q) != plt0 => may[q],
                    _ => any && callback_capable(c.name.as_deref()),
                }
            };
        let may = spread_up_calls(&prog, may, call_may);
        move |c: &aetrace_analysis::cfg::CallSite| call_may(&may, c)
    };
    // Counting: calls after which the process may be two (`fork`, `vfork`,
    // or a traced procedure that may call one, a fixpoint over direct
    // calls): each returns once per process, as a `setjmp` call returns
    // again per `longjmp`, so it gets the same split return edge (`R0 -> S`
    // derived: the children's returns). A child's counts add to the
    // parent's (shared counters, docs/profile.md).
    let may_fork_call = {
        let by_start = &by_start;
        let forks = &family.fork;
        let call_forks = move |may: &HashMap<ProcId, bool>, c: &aetrace_analysis::cfg::CallSite| {
            c.name.as_deref().is_some_and(imports::is_fork_like)
                || c.target.is_some_and(|t| forks.contains(&t))
                || c.target
                    .and_then(|t| by_start.get(&t))
                    .is_some_and(|q| may.get(q).copied().unwrap_or(false))
        };
        let may = spread_up_calls(&prog, HashMap::new(), call_forks);
        // A tail call's frame is gone: its caller's call returns twice.
        move |c: &aetrace_analysis::cfg::CallSite| !c.tail && call_forks(&may, c)
    };
    let (stop_at, stop_events) = match how {
        How::Count(spec) => (spec.stop_at, spec.events),
        How::Trace(_) => (None, None),
    };
    // With `--event calls`, a stop after a rethrow from a `.cold` catch
    // handler came one entry off the trace's (tests/stop_at.rs), not
    // understood yet: refused rather than a plausible wrong stop.
    if stop_at.is_some()
        && stop_events == Some(counters::Event::Calls)
        && imports_any(module, &["__cxa_throw", "__cxa_rethrow"])
    {
        return Err(rewrite_err(
            path,
            "--stop-at with --event calls cannot stop exactly yet in a program that throws C++ exceptions (use --event insns or blocks)",
        ));
    }
    // Another module of the process may start the threads (`--libs`).
    // `--stop-at`: only the first thread runs counted code (a second one
    // ends the program at its first outside entry), so no `lock`.
    let atomic =
        stop_at.is_none() && (matches!(how, How::Count(s) if s.threads) || starts_threads(module));
    let mut layout = CountLayout {
        atomic,
        procs: vec![None; prog.procs.len()],
        paths: vec![None; prog.procs.len()],
        ..CountLayout::default()
    };
    // Path profiles and `--stop-at` cannot follow frames a `longjmp`
    // abandons. A static libc calls setjmp in its startup code
    // (`__libc_start_call_main`, for a `pthread_exit` of the main thread)
    // and setjmp/longjmp on its error paths (`_dl_catch_exception`), so
    // every static glibc program has such calls: there, each call to the
    // longjmp family from counted code ends the program with a message
    // instead (`CallPlan::fatal_longjmp`), so that every setjmp returns
    // once. A longjmp by a tail jump, or from a procedure left alone
    // (outside the family, which runs untraced with what it calls), could
    // not be stopped: refused.
    let to_longjmp = |c: &aetrace_analysis::cfg::CallSite| {
        c.target.is_some_and(|t| longjmps.contains(&t))
            || c.name.as_deref().is_some_and(imports::is_longjmp_like)
    };
    let fatal_longjmps =
        module.is_static && matches!(how, How::Count(s) if s.paths || s.stop_at.is_some());
    if fatal_longjmps {
        for (id, p) in prog.procs.iter() {
            let Ok(cfg) = p.cfg.as_ref() else { continue };
            let untraced = !traced(id, &reasons) && !family_procs.contains(&id);
            if let Some(c) = cfg
                .calls
                .iter()
                .find(|c| to_longjmp(c) && (c.tail || untraced))
            {
                return Err(rewrite_err(
                    path,
                    format!(
                        "path profiles and --stop-at cannot follow a longjmp: procedure {} ({}) \
                         {} longjmp at {:#x}",
                        p.name,
                        if untraced { "left alone" } else { "counted" },
                        if c.tail { "tail-jumps to" } else { "calls" },
                        cfg.blocks[c.block].last_insn()
                    ),
                ));
            }
        }
    }
    // A static C program's libc has cleanup landing pads (for a thread's
    // cancellation): their entry is made fatal (`PathCode::fatal_pads`).
    // A program that throws C++ exceptions could catch one in a procedure
    // left alone, past frames without pads: refused below.
    let fatal_pads = module.is_static
        && matches!(how, How::Count(s) if s.paths)
        && !module.func_symbols.iter().any(|s| s.name == "__cxa_throw");
    let vforks: Vec<u64> = module
        .func_symbols
        .iter()
        .filter(|s| module.is_static && matches!(s.name.as_str(), "vfork" | "__vfork"))
        .map(|s| s.addr)
        .collect();
    if matches!(how, How::Count(s) if s.paths) {
        // The shadow stacks must follow the machine stacks (`pathprof`).
        for (id, p) in prog.procs.iter() {
            let Ok(cfg) = p.cfg.as_ref() else { continue };
            if !traced(id, &reasons) {
                continue;
            }
            let jumps = cfg.calls.iter().find(|c| {
                !fatal_longjmps
                    && (c.target.is_some_and(|t| setjmps.contains(&t))
                        || c.name.as_deref().is_some_and(imports::is_setjmp_like)
                        || to_longjmp(c))
            });
            // A vfork child runs in its parent's memory: its pops would
            // be the parent's.
            let vfork = cfg.calls.iter().find(|c| {
                c.target.is_some_and(|t| vforks.contains(&t))
                    || c.name
                        .as_deref()
                        .is_some_and(|n| n.split('@').next() == Some("vfork"))
            });
            let at = |c: &aetrace_analysis::cfg::CallSite| cfg.blocks[c.block].last_insn();
            let pad = p.landing_pads.first().filter(|_| !fatal_pads);
            let why = match (jumps, vfork, pad) {
                (Some(c), _, _) => format!(
                    "abandon frames: procedure {} calls setjmp/longjmp at {:#x}",
                    p.name,
                    at(c)
                ),
                (None, Some(c), _) => format!(
                    "share memory with a child: procedure {} calls vfork at {:#x}",
                    p.name,
                    at(c)
                ),
                (None, None, Some(pad)) => format!(
                    "abandon frames: procedure {} has a C++ landing pad at {pad:#x}",
                    p.name
                ),
                // Each process takes back the paths its inherited frames
                // counted as active once (shared counters): measured, a
                // fork caller's active path at -1.
                (None, None, None) => match cfg.calls.iter().find(|c| may_fork_call(c)) {
                    Some(c) => format!(
                        "fork: procedure {} calls a fork at {:#x} (each process would take \
                         back the active paths of the frames it inherits)",
                        p.name,
                        at(c)
                    ),
                    None => continue,
                },
            };
            return Err(rewrite_err(
                path,
                format!("path profiles of programs that {why} are not supported yet"),
            ));
        }
    }

    // 3. Placements, liveness, plans.
    let mut db = ProgramDb {
        link_base,
        runtime_vaddr: 0,
        procs: Vec::with_capacity(prog.procs.len()),
    };
    let mut plans: Vec<ProcPlan<'_>> = Vec::new();
    let mut notes = Vec::new();
    if stripped {
        // docs/rewrite.md, "Static executables".
        notes.push(format!(
            "static executable without setjmp/longjmp symbols (stripped): {} setjmp-like and {} \
             longjmp-like procedures recognised by their use of the pointer guard (fs:[0x30]); \
             a context switch they do not cover (setcontext, swapcontext, an own stack switch) \
             is not recognised",
            family.setjmp.len(),
            family.longjmp.len()
        ));
    }
    let mut witness_edges = 0;
    let first_free = elfout::first_free_vaddr(module.bytes())?;
    let blob = aetrace_runtime::generate().map_err(|e| rewrite_err(path, e.to_string()))?;
    let runtime_vaddr = first_free;
    let rt = RuntimeAddrs::new(&blob, runtime_vaddr);
    let code_seg = runtime_vaddr + blob.bytes.len() as u64;
    debug_assert_eq!(code_seg % PAGE, 0);
    let mut table_cursor = code_seg;
    let pads = aetrace_analysis::lsda::call_site_pads(module);
    for (id, p) in prog.procs.iter() {
        let number = tag << TAG_SHIFT | id.index() as u32;
        if let Some(r) = reasons.get(&id) {
            notes.push(format!(
                "procedure {} at {:#x} left alone: {r}",
                p.name, p.start
            ));
            db.procs.push(ProcDb {
                name: p.name.clone(),
                status: ProcStatus::LeftAlone(r.clone()),
                entry: 0,
                blocks: Vec::new(),
                edges: Vec::new(),
                sigmap: None,
            });
            continue;
        }
        let cfg = p.cfg.as_ref().expect("traced procedures have a CFG");
        let insns = liveness::decode_blocks(module, cfg)?;
        let live = liveness::analyze(cfg, &insns);
        let landing_pads: Vec<BlockId> = p
            .landing_pads
            .iter()
            .filter_map(|&a| cfg.block_at(a))
            .collect();
        let (witness, code_witness, plan_counters) = match how {
            // A PLT stub's jump decided by LAZY: no witness in the stub.
            How::Trace(_) if lazy_stubs.contains_key(&id) => {
                let none = vec![None; cfg.edges.len()];
                (none.clone(), none, None)
            }
            How::Trace(_) => {
                let pl = placement(cfg, which);
                witness_edges += pl.len();
                let witness: Vec<Option<u32>> = cfg.edges.keys().map(|e| pl.witness(e)).collect();
                // The code writes `code_witness`, the database promises
                // `witness`: they differ only under fault injection.
                let mut code_witness = witness.clone();
                if let Some((name, k)) = fault.as_ref().filter(|(name, _)| *name == p.name) {
                    let Some(w) = code_witness.iter_mut().find(|w| **w == Some(*k)) else {
                        return Err(rewrite_err(
                            path,
                            format!("{FAULT_ENV}: procedure {name} has no witness {k}"),
                        ));
                    };
                    *w = None;
                    notes.push(format!(
                        "FAULT INJECTED ({FAULT_ENV}): procedure {name} does not write witness {k}"
                    ));
                }
                (witness, code_witness, None)
            }
            How::Count(spec) if spec.paths => {
                let virt = counters::virtual_exits(cfg, &may_exit_call);
                let mut c = codegen::PlanCounters::default();
                let mut w = vec![None; cfg.edges.len()];
                let mut add = |ops: Vec<pathprof::PathOp>| -> Option<u32> {
                    (!ops.is_empty()).then(|| {
                        layout.ops.push(ops);
                        layout.ops.len() as u32 - 1
                    })
                };
                match pathprof::number(cfg, virt.clone(), layout.len, pathprof::PATH_LIMIT) {
                    Ok(pp) => {
                        let o = pathprof::ops(cfg, &pp);
                        for (i, ops) in o.edges.into_iter().enumerate() {
                            w[i] = add(ops);
                        }
                        c.entry = add(o.entry);
                        c.before_call = o.before_call.into_iter().map(&mut add).collect();
                        let n = u32::try_from(pp.numbering.num_paths())
                            .ok()
                            .and_then(|n| layout.len.checked_add(n))
                            .ok_or_else(|| rewrite_err(path, "too many path counters"))?;
                        layout.len = n;
                        layout.paths[id.index()] = Some(pp);
                    }
                    Err(aetrace_graph::Error::TooManyPaths { .. }) => {
                        // The documented fallback: edge counters (QP).
                        let edges = counters::CountSpec::default();
                        let start = cfg.blocks[cfg.entry].start;
                        // Paths refuse landing pads and setjmp: exits only.
                        let virt = counters::Virtual {
                            exits: virt,
                            ..counters::Virtual::default()
                        };
                        let pc = counters::place(cfg, &edges, start, virt, layout.len)
                            .map_err(|e| rewrite_err(path, format!("{}: {e}", p.name)))?;
                        for (i, k) in pc.chords.iter().enumerate() {
                            let n = add(vec![pathprof::PathOp::Word {
                                word: pc.first + i as u32,
                            }]);
                            match *k {
                                counters::Counted::Edge(e) => w[e.index()] = n,
                                counters::Counted::Entry => c.entry = n,
                                counters::Counted::Landing(_) | counters::Counted::Resume(_) => {
                                    return Err(rewrite_err(
                                        path,
                                        format!("{}: internal: a landing or setjmp counter in a path profile", p.name),
                                    ))
                                }
                            }
                        }
                        layout.len += pc.len(cfg.blocks.len());
                        layout.procs[id.index()] = Some(pc);
                    }
                    Err(e) => return Err(rewrite_err(path, format!("{}: {e}", p.name))),
                }
                (w.clone(), w, Some(c))
            }
            How::Count(spec) => {
                let mut setjmp_blocks: Vec<BlockId> = cfg
                    .calls
                    .iter()
                    .filter(|c| setjmp_call(c) || may_fork_call(c))
                    .map(|c| c.block)
                    .filter(|&b| {
                        cfg.edges
                            .values()
                            .any(|e| e.from == b && e.kind == EdgeKind::CallReturn)
                    })
                    .collect();
                setjmp_blocks.sort_unstable();
                setjmp_blocks.dedup();
                let virt = counters::Virtual {
                    exits: counters::virtual_exits(cfg, &may_exit_call),
                    pads: landing_pads.clone(),
                    setjmps: setjmp_blocks,
                };
                let pc = counters::place(cfg, spec, cfg.blocks[cfg.entry].start, virt, layout.len)
                    .map_err(|e| rewrite_err(path, format!("{}: {e}", p.name)))?;
                let mut w = vec![None; cfg.edges.len()];
                let mut c = codegen::PlanCounters::default();
                for (i, k) in pc.chords.iter().enumerate() {
                    let n = pc.first + i as u32;
                    match *k {
                        counters::Counted::Edge(e) => w[e.index()] = Some(n),
                        counters::Counted::Entry => c.entry = Some(n),
                        counters::Counted::Landing(b) => {
                            c.landing.resize_with(cfg.blocks.len(), || None);
                            c.landing[b.index()] = Some(n);
                        }
                        counters::Counted::Resume(b) => {
                            c.resume.resize_with(cfg.blocks.len(), || None);
                            c.resume[b.index()] = Some(n);
                        }
                    }
                }
                c.split_return = vec![false; cfg.blocks.len()];
                for &b in &pc.virt.setjmps {
                    c.split_return[b.index()] = true;
                }
                c.stop = pc.stop.clone();
                if pc.every_block {
                    c.blocks = (0..cfg.blocks.len() as u32)
                        .map(|i| Some(pc.first + i))
                        .collect();
                }
                layout.len += pc.len(cfg.blocks.len());
                layout.amounts.extend_from_slice(&pc.amounts);
                layout.procs[id.index()] = Some(pc);
                (w.clone(), w, Some(c))
            }
        };
        let mut calls = vec![CallPlan::default(); cfg.blocks.len()];
        let mut call_db: Vec<Option<CallDb>> = vec![None; cfg.blocks.len()];
        for c in &cfg.calls {
            let name = c.name.as_deref();
            let target_proc = c
                .target
                .and_then(|t| by_start.get(&t).copied())
                .filter(|&q| traced(q, &reasons));
            let got_jump = c.kind != CallKind::Direct && c.target.is_none();
            let (target, marker) = match target_proc {
                Some(q) => (CallTarget::Proc(q.index() as u32), may_tail[&q]),
                None => (
                    CallTarget::External,
                    callback_capable(name) || c.kind == CallKind::Direct,
                ),
            };
            let exit_record = got_jump && name.is_some_and(imports::is_exit_like);
            // A system call writes EXIT before it when it is exit or
            // exit_group, and RETURN after it when it returned: the
            // regenerator cannot mistake the EXIT of a later one for it.
            let syscall = c.kind == CallKind::Syscall;
            let to_setjmp = c.target.is_some_and(|t| setjmps.contains(&t));
            let to_longjmp = c.target.is_some_and(|t| longjmps.contains(&t));
            let to_fork = c.target.is_some_and(|t| family.fork.contains(&t));
            // A traced procedure that only tail-jumps to `fork`.
            let wrapper = target_proc.and_then(|q| fork_tails.get(&q).copied());
            // Left alone with all it calls: no callback, and a longjmp
            // never returns (its last jump is indirect, so the CFG cannot
            // tell).
            let returns = c.returns && !to_longjmp;
            let marker = (marker || syscall) && returns && !c.tail && !to_setjmp;
            calls[c.block.index()] = CallPlan {
                count: false,
                lazy_record: false,
                lazy_entry: None,
                unchecked_return: returns
                    && !c.tail
                    && !marker
                    && c.kind != CallKind::Syscall
                    && target_proc.is_some_and(|q| bounded.contains(&q)),
                marker,
                exit_record,
                syscall_exit: syscall,
                fork: !c.tail
                    && (to_fork || name.is_some_and(imports::is_fork_like) || wrapper.is_some()),
                atfork: !c.tail
                    && (c.target.is_some_and(|t| family.atfork.contains(&t))
                        || name.is_some_and(imports::runs_atfork_handlers)
                        || wrapper == Some(true)),
                fatal_longjmp: fatal_longjmps
                    && !c.tail
                    && (to_longjmp || name.is_some_and(imports::is_longjmp_like)),
                jmpbuf: match name {
                    _ if setjmp_call(c) => Some(aetrace_runtime::RecordKind::Setjmp),
                    _ if !c.tail && to_longjmp => Some(aetrace_runtime::RecordKind::Longjmp),
                    Some(n) if !c.tail && imports::is_longjmp_like(n) => {
                        Some(aetrace_runtime::RecordKind::Longjmp)
                    }
                    _ => None,
                },
            };
            let db = CallDb {
                jmpbuf: calls[c.block.index()].jmpbuf.is_some(),
                target: if (exit_record && !c.tail) || syscall {
                    CallTarget::Exit
                } else {
                    target
                },
                marker,
                returns,
                tail: c.tail,
                // IBT: the `.plt` entry the LAZY piece enters.
                lazy: lazy_stubs
                    .get(&id)
                    .and_then(|s| s.entry)
                    .filter(|_| target_proc.is_none() && got_jump && c.tail)
                    .map(|l| l.index() as u32),
                plt: match target_proc {
                    Some(q) => lazy_stubs.contains_key(&q),
                    None => got_jump && c.tail && lazy_stubs.contains_key(&id),
                },
                landing: {
                    let at = cfg.blocks[c.block].last_insn();
                    let i = pads.partition_point(|&(s, _, _)| s <= at);
                    i.checked_sub(1)
                        .map(|i| pads[i])
                        .filter(|&(_, end, _)| at < end)
                        .and_then(|(_, _, pad)| cfg.block_at(pad))
                        .map(|b| b.index() as u32)
                },
            };
            calls[c.block.index()].count = db.counts_transfer();
            calls[c.block.index()].lazy_record = db.plt && db.target == CallTarget::External;
            calls[c.block.index()].lazy_entry =
                db.lazy.map(|l| prog.procs[ProcId::new(l as usize)].start);
            call_db[c.block.index()] = Some(db);
        }
        // `--stop-at` and a throw: every frame it leaves stands at a call
        // with a virtual exit edge, whose query increment is 0 (the counter
        // is exact for the caller there), and the unwinder's entry at a
        // pad adds `R0 -> pad`'s increment: exact. A `setjmp` call's query
        // increment would be taken back once more at each of its returns
        // through `longjmp`.
        if stop_at.is_some() && !fatal_longjmps && calls.iter().any(|c| c.jmpbuf.is_some()) {
            return Err(rewrite_err(
                path,
                format!(
                    "--stop-at cannot count exactly: procedure {} calls setjmp or longjmp",
                    p.name
                ),
            ));
        }
        let mut ptables = Vec::new();
        for (old, rel32, j) in tables.remove(&id).unwrap_or_default() {
            let JumpResolution::Table { targets, .. } = &j.resolution else {
                continue;
            };
            let targets: Vec<_> = targets
                .iter()
                .map(|&t| cfg.block_at(t).ok_or(t))
                .collect::<std::result::Result<_, _>>()
                .map_err(|t| {
                    rewrite_err(path, format!("{}: case {t:#x} is not a block", p.name))
                })?;
            let t = Table {
                old,
                new: table_cursor,
                rel32,
                targets,
                block: j.block,
            };
            table_cursor += t.size().next_multiple_of(8);
            ptables.push(t);
        }
        // Direct calls and tail calls to traced procedures skip their
        // outside-entry stubs (and its check); every other entry passes one.
        // A chain of calls without entry checks is at most two deep.
        let chain_end = p.start != module.entry
            && !checks::reaches_call(cfg, |t| {
                by_start
                    .get(&t)
                    .is_some_and(|&q| traced(q, &reasons) && calls_traced.contains(&q))
            });
        let unchecked_return: Vec<bool> = calls.iter().map(|c| c.unchecked_return).collect();
        let loop_header = checks::check_blocks(
            cfg,
            &insns,
            &witness,
            &landing_pads,
            chain_end,
            &unchecked_return,
        );
        db.procs.push(ProcDb {
            name: p.name.clone(),
            status: ProcStatus::Traced,
            entry: cfg.entry.index() as u32,
            blocks: cfg
                .blocks
                .iter()
                .map(|(b, blk)| BlockDb {
                    start: blk.start,
                    insn_lens: insns[b.index()].iter().map(|i| i.len() as u8).collect(),
                    call: call_db[b.index()].filter(|c| c.tail || blk.kind == BlockKind::Call),
                })
                .collect(),
            edges: cfg
                .edges
                .iter()
                .map(|(e, ed)| EdgeDb {
                    from: ed.from.index() as u32,
                    to: ed.to.index() as u32,
                    kind: edge_kind_db(ed.kind),
                    witness: witness[e.index()]
                        .filter(|_| plan_counters.is_none())
                        .map(|w| w as u16),
                })
                .collect(),
            // Filled in from the generated code below.
            sigmap: None,
        });
        plans.push(ProcPlan {
            number,
            name: &p.name,
            start: p.start,
            stub: if p.start == module.entry && module.is_static {
                EntryStub::StaticEntry
            } else if p.start == module.entry && !library {
                EntryStub::ProcessEntry
            } else {
                EntryStub::Full
            },
            cfg,
            insns,
            live,
            witness: code_witness,
            calls,
            tables: ptables,
            loop_header,
            // The copy's LSDAs point at LANDING stubs (see `unwind`).
            landing_pads,
            counters: plan_counters,
        });
    }
    if plans.is_empty() {
        return Err(rewrite_err(path, "no procedure can be traced"));
    }
    // A static executable has no preinit array: its traced entry procedure
    // is the only place to run the runtime's init before any traced code.
    if module.is_static && !plans.iter().any(|p| p.stub == EntryStub::StaticEntry) {
        let why = prog
            .procs
            .iter()
            .find(|(_, p)| p.start == module.entry)
            .map_or("no procedure starts there".to_owned(), |(id, p)| {
                format!(
                    "{} is left alone: {}",
                    p.name,
                    reasons.get(&id).map_or("", String::as_str)
                )
            });
        return Err(rewrite_err(
            path,
            format!(
                "static executable: the entry point {:#x} cannot be traced ({why}), so the \
                 runtime has nowhere to start",
                module.entry
            ),
        ));
    }
    if db.procs.iter().any(|p| {
        p.edges
            .iter()
            .any(|e| e.witness.is_some_and(|w| w == u16::MAX))
    }) {
        return Err(rewrite_err(
            path,
            "a procedure has more than 65535 witness edges",
        ));
    }
    db.runtime_vaddr = runtime_vaddr;

    // 4. Code, tables, runtime, springboards.
    let code_vaddr = table_cursor.next_multiple_of(64);
    let counting = match how {
        How::Trace(_) => None,
        How::Count(spec) => Some(codegen::Counting {
            base: 0, // set below, once the layout is known
            atomic,
            amounts: if spec.events.is_some() {
                layout.amounts.clone()
            } else {
                Vec::new()
            },
            paths: spec.paths.then(|| codegen::PathCode {
                fatal_pads,
                state: pathprof::PathState {
                    threads: atomic,
                    ..pathprof::PathState::default()
                },
                ops: std::mem::take(&mut layout.ops),
            }),
        }),
    };
    // The counters go after everything else: their address depends on the
    // code size, which does not depend on it (increments are rip-relative
    // with a 32-bit displacement whatever the target). Encode once to
    // learn the size, then again at the final address.
    let mut code = codegen::generate(&plans, &rt, code_vaddr, counting.clone())
        .map_err(|e| rewrite_err(path, e))?;
    // Where a signal can interrupt each copy (tracing: the code is final).
    // The database numbers procedures within the module, without its tag.
    let local = |n: u32| n & ((1 << TAG_SHIFT) - 1);
    for (plan, copy) in plans.iter().zip(&code.procs) {
        let ranges = copy
            .sigmap
            .iter()
            .cloned()
            .map(|mut r| {
                if let aetrace_format::progdb::SigPoint::Insn { proc, .. } = &mut r.point {
                    *proc = local(*proc);
                }
                r
            })
            .collect();
        db.procs[local(plan.number) as usize].sigmap = Some(aetrace_format::progdb::SigMap {
            start: copy.new_start,
            len: copy.new_end - copy.new_start,
            ranges,
        });
    }
    // Unwind tables for the copies, in a read-only segment on the page
    // after the code (see `unwind`).
    let unwind_vaddr = (code_vaddr + code.bytes.len() as u64).next_multiple_of(PAGE);
    let unwind = unwind::build(module, &code.procs, &code.bytes, code_vaddr, unwind_vaddr)?;
    let unwind = (unwind.fdes > 0).then_some(unwind);
    // Counting: the init code on the page after the unwind tables (or the
    // code), then the counters.
    let mut preinit = None;
    // Counting a static executable: its new entry point (`emit_static_entry`).
    let mut static_entry = None;
    let mut count_segments = Vec::new();
    if let Some(mut c) = counting.clone() {
        let init_vaddr = match &unwind {
            Some(u) => u.hdr_vaddr + u.bytes.len() as u64,
            None => code_vaddr + code.bytes.len() as u64,
        }
        .next_multiple_of(PAGE);
        layout.vaddr = init_vaddr + PAGE;
        // Event counting: the counter; `--stop-at`: then the first
        // thread's `fs:[0]` (`counters::STOP_OWNER`).
        let words = if c.amounts.is_empty() {
            u64::from(layout.len)
        } else if stop_at.is_some() {
            // The event counter, `STOP_OWNER`, `STOP_REFUSED`.
            3
        } else {
            1
        };
        layout.bytes = (words * 8).max(1).next_multiple_of(PAGE);
        let mut init_code = counters::emit_init(
            init_vaddr,
            layout.vaddr,
            layout.bytes,
            &counters::env_fd(tag),
            // A static executable has no TLS at its entry point: the owner
            // stays 0 (only one thread: see the refusal above).
            stop_at
                .filter(|_| !module.is_static)
                .map(|_| layout.vaddr + counters::STOP_OWNER),
        )
        .map_err(|e| rewrite_err(path, e))?;
        let mut entry = init_vaddr;
        if let Some(pc) = c.paths.as_mut() {
            // The path state after the counters; its initialiser after the
            // counters' (which it ends by jumping to).
            layout.path_state = layout.vaddr + layout.bytes;
            let at = init_vaddr + (init_code.len() as u64).next_multiple_of(16);
            let (bytes, ic) =
                pathprof::emit_init(at, layout.path_state, init_vaddr, !module.is_static)
                    .map_err(|e| rewrite_err(path, e))?;
            init_code.resize((at - init_vaddr) as usize, 0xCC);
            init_code.extend_from_slice(&bytes);
            entry = at + ic.init;
            pc.state = pathprof::PathState {
                base: layout.vaddr,
                overflow: at + ic.overflow,
                attach: at + ic.attach,
                threads: atomic,
            };
        }
        c.base = layout.vaddr;
        let again = codegen::generate(&plans, &rt, code_vaddr, Some(c))
            .map_err(|e| rewrite_err(path, e))?;
        if again.bytes.len() != code.bytes.len() {
            return Err(rewrite_err(
                path,
                "counter code changed size between passes",
            ));
        }
        code = again;
        if module.is_static {
            // No preinit array: a new entry point calls `entry` first.
            let copy = code
                .springboards
                .iter()
                .find(|&&(from, _)| from == module.entry)
                .map(|&(_, to)| to)
                .ok_or_else(|| rewrite_err(path, "internal: no springboard at the entry point"))?;
            let at = init_vaddr + (init_code.len() as u64).next_multiple_of(16);
            let bytes =
                counters::emit_static_entry(at, entry, copy).map_err(|e| rewrite_err(path, e))?;
            init_code.resize((at - init_vaddr) as usize, 0xCC);
            init_code.extend_from_slice(&bytes);
            static_entry = Some(at);
        }
        debug_assert!(init_code.len() as u64 <= PAGE);
        preinit = Some(entry);
        count_segments.push(elfout::NewSegment {
            vaddr: init_vaddr,
            flags: 5,
            mem_size: init_code.len() as u64,
            bytes: init_code,
        });
        count_segments.push(elfout::NewSegment {
            vaddr: layout.vaddr,
            flags: 6,
            mem_size: layout.bytes,
            // `--stop-at N`: the counter starts at -N (`counters::StopChecks`).
            bytes: stop_at
                .map(|n| stop_start(n).to_le_bytes().to_vec())
                .unwrap_or_default(),
        });
        if layout.path_state != 0 {
            count_segments.push(elfout::NewSegment {
                vaddr: layout.path_state,
                flags: 6,
                mem_size: pathprof::state_bytes(),
                bytes: Vec::new(),
            });
        }
    }
    let code_end = code_vaddr + code.bytes.len() as u64;
    let mut seg = vec![0u8; (code_end - code_seg) as usize];
    for (at, bytes) in &code.tables {
        let o = (at - code_seg) as usize;
        seg[o..o + bytes.len()].copy_from_slice(bytes);
    }
    let o = (code_vaddr - code_seg) as usize;
    seg[o..].copy_from_slice(&code.bytes);
    let mut blob_bytes = blob.bytes.clone();
    for (sym, value) in [
        ("witness_code_start", code_vaddr - runtime_vaddr),
        ("witness_code_end", code_end - runtime_vaddr),
        ("module_tag", u64::from(tag)),
    ] {
        let off = blob
            .symbol(sym)
            .ok_or_else(|| rewrite_err(path, format!("runtime lacks {sym}")))?
            as usize;
        blob_bytes[off..off + 8].copy_from_slice(&value.to_le_bytes());
    }
    // Every redirected slot belongs to a stub chosen for it, and the other way round.
    let mut want: Vec<u64> = lazy_stubs.values().filter_map(|s| s.slot).collect();
    let mut got: Vec<u64> = code.lazy_slots.iter().map(|&(slot, _)| slot).collect();
    want.sort_unstable();
    got.sort_unstable();
    if want != got {
        return Err(rewrite_err(
            path,
            format!("internal: GOT slots with a LAZY piece {got:x?}, expected {want:x?}"),
        ));
    }
    let data = blob.data_offset as usize;
    let patches = code
        .springboards
        .iter()
        .map(|&(from, to)| {
            let rel = i32::try_from(to as i64 - (from as i64 + SPRINGBOARD as i64))
                .map_err(|_| rewrite_err(path, "springboard out of range"))?;
            let mut bytes = vec![0xE9];
            bytes.extend_from_slice(&rel.to_le_bytes());
            Ok(elfout::Patch { vaddr: from, bytes })
        })
        // A lazily bound GOT slot's initial value (the stub's own
        // lazy-binding half) becomes the copy's LAZY piece.
        .chain(code.lazy_slots.iter().map(|&(slot, piece)| {
            Ok(elfout::Patch {
                vaddr: slot,
                bytes: piece.to_le_bytes().to_vec(),
            })
        }))
        .collect::<Result<Vec<_>>>()?;
    let init = runtime_vaddr
        + blob
            .symbol("init")
            .ok_or_else(|| rewrite_err(path, "runtime lacks init"))?;
    let mut add = elfout::Additions {
        segments: vec![
            elfout::NewSegment {
                vaddr: runtime_vaddr,
                flags: 5,
                mem_size: data as u64,
                bytes: blob_bytes[..data].to_vec(),
            },
            elfout::NewSegment {
                vaddr: runtime_vaddr + data as u64,
                flags: 6,
                mem_size: (blob_bytes.len() - data) as u64,
                bytes: blob_bytes[data..].to_vec(),
            },
            elfout::NewSegment {
                vaddr: code_seg,
                flags: 5,
                mem_size: seg.len() as u64,
                bytes: seg,
            },
        ],
        patches,
        preinit: (!library && !module.is_static).then(|| preinit.unwrap_or(init)),
        // A library's counters are mapped by its own first constructor.
        init: preinit.filter(|_| library),
        entry: if module.is_static {
            static_entry.or_else(|| {
                code.springboards
                    .iter()
                    .find(|&&(from, _)| from == module.entry)
                    .map(|&(_, to)| to)
            })
        } else {
            None
        },
        eh_frame_hdr: unwind.as_ref().map(|u| (u.hdr_vaddr, u.hdr_size)),
        eh_frame: unwind
            .as_ref()
            .map(|u| (u.eh_frame.0, u.eh_frame.1 - u.eh_frame.0)),
    };
    if let Some(u) = unwind {
        add.segments.push(elfout::NewSegment {
            vaddr: u.hdr_vaddr,
            flags: 4,
            mem_size: u.bytes.len() as u64,
            bytes: u.bytes,
        });
    }
    add.segments.extend(count_segments);
    let out = elfout::write(path, module.bytes(), &add)?;
    Ok(Instrumented {
        elf: out,
        traced: plans.len(),
        witness_edges,
        db,
        build_id: prog.module.build_id(),
        size,
        notes,
        counting: counting.map(|_| layout),
    })
}

#[cfg(test)]
mod tests {
    use aetrace_format::progdb::SigPoint;
    use iced_x86::{Decoder, DecoderOptions};

    /// The machine's gzip (Debian 12) has two procedures shorter than a
    /// springboard: `orl $0x20, (%rdi); ret` (4 bytes, then 12 bytes of
    /// `nop` fill up to the next function) takes one running into the
    /// fill; a lone `ret` at the very end of `.text` (then `.fini`) has
    /// no room.
    #[test]
    fn springboards_of_short_procedures_use_the_fill_after_them() {
        let prog = crate::Program::open(std::path::Path::new("/usr/bin/gzip")).unwrap();
        let short: Vec<(u64, bool)> = prog
            .procs
            .values()
            .filter(|p| p.end - p.start < super::SPRINGBOARD)
            .map(|p| (p.start, super::springboard_fits(&prog, p)))
            .collect();
        assert_eq!(short, [(0x105d0, true), (0x11670, false)]);
        assert!(prog
            .procs
            .values()
            .filter(|p| p.end - p.start >= super::SPRINGBOARD)
            .all(|p| super::springboard_fits(&prog, p)));
    }

    /// The signal map against the rewritten code itself: every original
    /// instruction of every traced procedure is in exactly one run of
    /// copies, and at the address the run gives it the rewritten module
    /// holds an instruction with the original's mnemonic (and length, but
    /// for a run's last).
    #[test]
    fn signal_maps_locate_every_copied_instruction() {
        let path = std::path::Path::new("/usr/bin/gzip");
        let ins = super::instrument(path, Default::default()).unwrap();
        let old_bytes = std::fs::read(path).unwrap();
        // Bytes at a virtual address, through the PT_LOAD that holds it.
        let at_vaddr = |file: &[u8], at: u64| -> Vec<u8> {
            let elf = goblin::elf::Elf::parse(file).unwrap();
            let ph = elf
                .program_headers
                .iter()
                .find(|ph| {
                    ph.p_type == goblin::elf::program_header::PT_LOAD
                        && ph.p_vaddr <= at
                        && at < ph.p_vaddr + ph.p_filesz
                })
                .unwrap_or_else(|| panic!("{at:#x} is in no PT_LOAD"));
            let off = (ph.p_offset + at - ph.p_vaddr) as usize;
            let end = (ph.p_offset + ph.p_filesz) as usize;
            file[off..end.min(off + 15)].to_vec()
        };
        let decode = |file: &[u8], at: u64| {
            let bytes = at_vaddr(file, at);
            let mut d = Decoder::with_ip(64, &bytes, at, DecoderOptions::NONE);
            d.decode()
        };
        let (mut runs, mut copies) = (0, 0);
        for (pi, p) in ins.db.procs.iter().enumerate() {
            let Some(map) = &p.sigmap else {
                assert!(!p.is_traced(), "{}: traced without a signal map", p.name);
                continue;
            };
            let mut seen: Vec<Vec<u32>> = p
                .blocks
                .iter()
                .map(|b| vec![0; b.insn_lens.len()])
                .collect();
            assert_eq!(map.ranges[0].offset, 0, "{}", p.name);
            for (i, r) in map.ranges.iter().enumerate() {
                let end = map.ranges.get(i + 1).map_or(map.len, |n| n.offset);
                assert!(r.offset < end, "{}: range {i}", p.name);
                let SigPoint::Insn {
                    proc,
                    block,
                    insn,
                    count,
                } = r.point
                else {
                    continue;
                };
                if count == 0 {
                    continue;
                }
                assert_eq!(proc as usize, pi, "{}: a run of another procedure", p.name);
                runs += 1;
                let b = &p.blocks[block as usize];
                let mut at = map.start + r.offset;
                let mut orig = b.start
                    + b.insn_lens[..insn as usize]
                        .iter()
                        .map(|&l| u64::from(l))
                        .sum::<u64>();
                for k in insn..insn + count {
                    let (o, c) = (decode(&old_bytes, orig), decode(&ins.elf, at));
                    assert_eq!(
                        o.mnemonic(),
                        c.mnemonic(),
                        "{}: instruction {k} of block {:#x} ({orig:#x}) copied at {at:#x}",
                        p.name,
                        b.start
                    );
                    let len = u64::from(b.insn_lens[k as usize]);
                    if k + 1 < insn + count {
                        assert_eq!(c.len() as u64, len, "{}: copy at {at:#x}", p.name);
                    } else {
                        assert!(
                            at + c.len() as u64 <= map.start + end,
                            "{}: run end",
                            p.name
                        );
                    }
                    seen[block as usize][k as usize] += 1;
                    copies += 1;
                    at += len;
                    orig += len;
                }
            }
            for (bi, s) in seen.iter().enumerate() {
                assert!(
                    s.iter().all(|&n| n == 1),
                    "{}: block {bi}: instructions mapped {s:?} times",
                    p.name
                );
            }
        }
        assert!(runs > 1000 && copies > runs, "{runs} runs, {copies} copies");
    }
}
