//! The static rewriter (design decisions 2-6; paper 003 Section 4): decides
//! which procedures are traced, places their witnesses (Section 4.2:
//! blocking witnesses, then the constrained maximum spanning tree), plans
//! what each call site records, generates the instrumented copies
//! ([`codegen`]) next to the generated runtime, and writes the new ELF
//! ([`elfout`]) and the program database the regenerator reads.
//!
//! [`instrument_with`] is a list of phases over a [`Rewrite`] context, one
//! module each: what is traced (`traced`), call classification (`calls`),
//! what the mode refuses (`limits`), per-procedure plans (`plan`), code
//! emission (`emit`) and linking (`link`).
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

mod calls;
mod checks;
pub mod codegen;
pub mod counters;
mod data;
pub mod elfout;
mod emit;
pub mod error;
mod insnmap;
mod limits;
mod link;
pub mod liveness;
pub mod pathprof;
pub mod personality;
mod plan;
mod traced;
mod unentered;
pub mod unwind;

use std::path::Path;

use aetrace_analysis::elf::{ElfKind, Module};
use aetrace_analysis::Program;
use aetrace_format::progdb::ProgramDb;

pub use crate::error::{Error, PathLimit, Refusal, Result, SegmentFault};

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
    /// The rewritten ELF file.
    pub elf: Vec<u8>,
    /// Its runtime's image id (`link::image_id`), which the runtime
    /// reports in each slot's `S_IMAGE`.
    pub image_id: u64,
    /// The program database regen needs to decode the module's trace.
    pub db: ProgramDb,
    /// The original module's GNU build-id (the rewrite cache's and the trace's key).
    pub build_id: Vec<u8>,
    /// Bytes of address space from vaddr 0 in the original module.
    pub size: u64,
    /// Procedures left alone and why, one line each.
    pub notes: Vec<String>,
    /// How many procedures are traced (the rest are left alone).
    pub traced: usize,
    /// How many witness edges the traced procedures have in all.
    pub witness_edges: usize,
    /// Counting mode: where the counters are.
    pub counting: Option<CountLayout>,
}

const PAGE: u64 = 4096;

/// The initial value of the event counter for `--stop-at n`: `-n`.
pub fn stop_start(n: u64) -> i64 {
    0i64.saturating_sub_unsigned(n)
}

/// Fault injection for the tests of `aetrace verify` (docs/verify.md):
/// `AETRACE_FAULT_DROP_WITNESS=PROC:K` makes the copy of procedure PROC
/// not write witness K while the program database still says it does, a
/// deliberately broken placement. The trace gets a NOTE saying so.
pub const FAULT_ENV: &str = "AETRACE_FAULT_DROP_WITNESS";
pub use data::FAULT_DATA_ENV;

fn rewrite_err(path: &Path, what: Refusal) -> Error {
    Error::Rewrite {
        path: path.to_owned(),
        what,
    }
}

/// The procedure and witness [`FAULT_ENV`] names, if it is set.
pub fn fault_injection(path: &Path) -> Result<Option<(String, u32)>> {
    let Some(v) = std::env::var_os(FAULT_ENV) else {
        return Ok(None);
    };
    let v = v.to_string_lossy();
    v.rsplit_once(':')
        .and_then(|(p, k)| Some((p.to_owned(), k.parse().ok()?)))
        .map(Some)
        .ok_or_else(|| rewrite_err(path, Refusal::FaultSyntax(v.into_owned())))
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

/// What `record --data` records (`docs/data.md`).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum DataMode {
    /// No data addresses: control only.
    Off,
    /// `--data`: the values abstract execution cannot recompute
    /// (`analysis::addr::exec`).
    Abstract,
    /// `--data --check`: those, then every non-static address in full
    /// (`analysis::addr::full`), so the regenerator can compare the two.
    Check,
}

/// [`instrument_module`], also recording data addresses as `data` says.
/// `startup`: a library the loader maps before the executable's preinit
/// runs (its DT_NEEDED closure), whose added segments can then be
/// detached (`elfout`, "Detached additions"), so that it and every later
/// mapping lie where they do natively. `search_first`: a directory the
/// loader searches first for an executable's libraries, the DT_NEEDED
/// names the copy names by their path in it, and where its loader reads
/// its cache ([`elfout::Additions::search_first`]). `glibc_traced`: one of glibc's
/// libraries (libc.so.6, libm.so.6, ...) is traced in the same run, so any
/// import may run traced code (its own or a callback) before it returns.
pub fn instrument_module_data(
    path: &Path,
    which: Placement,
    tag: u32,
    data: DataMode,
    (startup, glibc_traced): (bool, bool),
    search_first: Option<&elfout::SearchFirst>,
) -> Result<Instrumented> {
    let how = How::Trace(which);
    instrument_full(path, &how, tag, data, (startup, glibc_traced), search_first)
}

/// Imports that start threads: counters then need `lock add`.
pub(crate) const THREAD_STARTERS: &[&str] = &["pthread_create", "clone", "clone3", "thrd_create"];

/// The module imports a function that starts threads, or, static, has one
/// (its libc is part of it).
pub fn starts_threads(module: &Module) -> bool {
    imports_any(module, THREAD_STARTERS)
        || (module.is_static
            && module
                .func_symbols
                .iter()
                .any(|s| THREAD_STARTERS.contains(&s.name.as_str())))
}

/// Whether `module` imports one of `names` (symbol versions ignored).
pub(crate) fn imports_any(module: &Module, names: &[&str]) -> bool {
    module
        .plt_relocs
        .iter()
        .chain(&module.dyn_relocs)
        .filter_map(|r| r.sym_name.as_deref())
        .any(|n| names.contains(&n.split('@').next().unwrap_or(n)))
}

/// The rewriter's context: the module, its program, the options, and the
/// facts every phase reads.
pub(crate) struct Rewrite<'a> {
    pub path: &'a Path,
    pub prog: &'a Program,
    pub how: &'a How,
    /// The module's id in the trace (0: the executable).
    pub tag: u32,
    /// The module is a shared object.
    pub library: bool,
    /// Its added segments are in no `PT_LOAD` (`elfout`, "Detached
    /// additions"): a traced library loaded at start-up.
    pub detached: bool,
    /// [`FAULT_ENV`]: the procedure and witness the code does not write.
    pub fault: Option<(String, u32)>,
    /// The lowest `PT_LOAD`'s page.
    pub link_base: u64,
    /// Bytes of address space from vaddr 0 in the original module.
    pub size: u64,
    /// IFUNC resolvers that run before the runtime is initialised.
    pub ifuncs: Vec<u64>,
    /// Counting: `--stop-at` and its events.
    pub stop_at: Option<u64>,
    pub stop_events: Option<counters::Event>,
    /// Counting: increments are `lock add`.
    pub atomic: bool,
    /// Counting: calls to the longjmp family end the program.
    pub fatal_longjmps: bool,
    /// Path profiling: entering a landing pad ends the program.
    pub fatal_pads: bool,
    /// `record --data`: which data values are recorded.
    pub data: DataMode,
    /// A directory the loader searches first for the executable's
    /// libraries (`elfout::Additions::search_first`).
    pub search_first: Option<elfout::SearchFirst>,
    /// A glibc library is traced in this run: every import may run traced
    /// code (`calls::Calls::imports_call_back`).
    pub glibc_traced: bool,
}

impl<'a> Rewrite<'a> {
    /// Room left above the original image: an executable's heap
    /// ([`elfout::HEAP_GAP`]), or a detached library's distance to its
    /// additions ([`elfout::DETACH_GAP`]). Another shared object has no
    /// heap, and a static PIE's the kernel starts elsewhere
    /// (`ELF_ET_DYN_BASE`), while a gap would only map its image, placed
    /// top-down like a library, lower.
    pub fn heap_gap(&self) -> u64 {
        let static_pie = self.prog.module.is_static && self.prog.module.kind == ElfKind::Pie;
        if self.detached {
            elfout::DETACH_GAP + u64::from(self.tag - 1) * elfout::DETACH_SLOT
        } else if self.library || static_pie {
            0
        } else {
            elfout::HEAP_GAP
        }
    }

    /// The context, once the module passes [`limits::check_module`].
    fn new(
        path: &'a Path,
        prog: &'a Program,
        how: &'a How,
        tag: u32,
        fault: Option<(String, u32)>,
        data: DataMode,
        startup: bool,
    ) -> Result<Rewrite<'a>> {
        let module = &prog.module;
        let (stop_at, stop_events) = match how {
            How::Count(spec) => (spec.stop_at, spec.events),
            How::Trace(_) => (None, None),
        };
        let mut rw = Rewrite {
            path,
            prog,
            how,
            tag,
            library: module.kind == ElfKind::Shared,
            detached: module.kind == ElfKind::Shared
                && startup
                && (1..=elfout::DETACH_TAGS).contains(&tag)
                && matches!(how, How::Trace(_))
                && elfout::can_detach(module.bytes())?,
            fault,
            link_base: 0,
            size: 0,
            ifuncs: Vec::new(),
            stop_at,
            stop_events,
            // Another module of the process may start the threads
            // (`--libs`). `--stop-at`: only the first thread runs counted
            // code (a second one ends the program at its first outside
            // entry), so no `lock`.
            atomic: stop_at.is_none()
                && (matches!(how, How::Count(s) if s.threads) || starts_threads(module)),
            // A static libc calls setjmp in its startup code
            // (`__libc_start_call_main`, for a `pthread_exit` of the main
            // thread) and setjmp/longjmp on its error paths
            // (`_dl_catch_exception`), so every static glibc program has
            // such calls: there, each call to the longjmp family from
            // counted code ends the program with a message instead, so
            // that every setjmp returns once (`limits`).
            fatal_longjmps: module.is_static
                && matches!(how, How::Count(s) if s.paths || s.stop_at.is_some()),
            // A static C program's libc has cleanup landing pads (for a
            // thread's cancellation): their entry is made fatal
            // (`PathCode::fatal_pads`). A program that throws C++
            // exceptions could catch one in a procedure left alone, past
            // frames without pads: refused (`limits`).
            fatal_pads: module.is_static
                && matches!(how, How::Count(s) if s.paths)
                && !module.func_symbols.iter().any(|s| s.name == "__cxa_throw"),
            data,
            search_first: None,
            glibc_traced: false,
        };
        limits::check_module(&rw)?;
        let elf = goblin::elf::Elf::parse(module.bytes())
            .map_err(|e| rw.err(Refusal::ProgramHeaders(e.to_string())))?;
        let loads: Vec<_> = elf
            .program_headers
            .iter()
            .filter(|ph| ph.p_type == goblin::elf::program_header::PT_LOAD)
            .collect();
        rw.link_base = loads.iter().map(|ph| ph.p_vaddr).min().unwrap_or(0) & !(PAGE - 1);
        rw.size = loads
            .iter()
            .map(|ph| ph.p_vaddr + ph.p_memsz)
            .max()
            .unwrap_or(0);
        rw.ifuncs = traced::ifunc_resolvers(module, &elf);
        Ok(rw)
    }

    /// A refusal or failure of rewriting this module.
    fn err(&self, what: Refusal) -> Error {
        rewrite_err(self.path, what)
    }
}

/// Rewrites module `tag` at `path` (see [`instrument_module`]): witnesses or
/// counters, as a list of phases.
pub fn instrument_with(path: &Path, how: &How, tag: u32) -> Result<Instrumented> {
    instrument_full(path, how, tag, DataMode::Off, (false, false), None)
}

fn instrument_full(
    path: &Path,
    how: &How,
    tag: u32,
    data: DataMode,
    (startup, glibc_traced): (bool, bool),
    search_first: Option<&elfout::SearchFirst>,
) -> Result<Instrumented> {
    let fault = fault_injection(path)?;
    let prog = Program::open(path)?;
    let mut rw = Rewrite::new(path, &prog, how, tag, fault, data, startup)?;
    rw.glibc_traced = glibc_traced;
    rw.search_first = search_first.cloned();
    let traced = traced::Traced::decide(&rw);
    let calls = calls::Calls::classify(&rw, &traced);
    limits::check_counting(&rw, &calls)?;
    let runtime = emit::Runtime::place(&rw)?;
    let mut plans = plan::Plans::build(&rw, &calls, runtime.code_seg)?;
    plans.db.runtime_vaddr = runtime.vaddr;
    let emitted = emit::emit(&rw, &runtime, &mut plans)?;
    let counted = emitted.counted.is_some();
    // Tracing code counts every return (codegen's `transfer`).
    plans.db.counts_returns = !counted;
    let image_id = link::image_id(&runtime, &emitted, tag);
    let elf = link::link(&rw, &runtime, &calls, emitted, image_id)?;
    Ok(Instrumented {
        elf,
        image_id,
        traced: plans.plans.len(),
        witness_edges: plans.witness_edges,
        db: plans.db,
        build_id: prog.module.build_id(),
        size: rw.size,
        notes: plans.notes,
        counting: counted.then_some(plans.layout),
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
            .filter(|p| p.end - p.start < crate::traced::SPRINGBOARD)
            .map(|p| (p.start, crate::traced::springboard_fits(&prog, p)))
            .collect();
        assert_eq!(short, [(0x105d0, true), (0x11670, false)]);
        assert!(prog
            .procs
            .values()
            .filter(|p| p.end - p.start >= crate::traced::SPRINGBOARD)
            .all(|p| crate::traced::springboard_fits(&prog, p)));
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
