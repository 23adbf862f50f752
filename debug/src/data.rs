//! The data references of one thread's instructions, for watchpoints and
//! `monitor last-write` (issue 22, point 5): a trace recorded with
//! `aetrace record --data --check` (`docs/data.md`) holds, in each
//! thread's stream, the values recorded before each instruction in
//! execution order; `addr::full` (the table the rewriter placed them by,
//! which `regen --format lackey` reads too) turns an instruction and its
//! values into its references.
//!
//! A module recorded by abstract execution (`DATA_ABS`) writes before
//! each instruction the values the abstract execution reads, then the
//! full ones; which abstract values an instruction has depends only on
//! the registers its procedure's analysis knows at the block's start
//! (`exec::entry_knowledge` over the module's `returns::Returns`,
//! `exec::plan_block`), so they are skipped without running it; and a
//! procedure entry that starts with `rsp` known has one value more when
//! an outside-entry stub entered it (`exec::Entered`), which the
//! position before it tells.
//!
//! A thread that handled signals reads its values in another order than
//! the stream's (`docs/data.md`, "Signals with data"): a handler's values
//! follow its SIGNAL record, the interrupted instruction's values written
//! before the signal (its early values) are read when the handler
//! returned, and a faulting instruction reads none. Where each of these
//! happens comes from the regenerator: the positions of deliveries,
//! returns and faults from its walk (`regen::visit`, the data walk's
//! events), each SIGNAL record's place among the values from
//! `regen::data_values_entered` ([`Marks`]).
//!
//! Invariants: position `n`'s values follow position `n - 1`'s in the
//! reading order ([`Cursor`]), so the values of an interval of the
//! [`Timeline`] start where the earlier intervals' counts left the
//! cursor, learnt in order and kept (`starts`); an interval's references
//! are computed from its first position on, for any order of visits; a
//! `rep` string instruction is one position whose reference spans every
//! iteration's bytes.

use crate::blocks::Blocks;
use crate::image::Image;
use crate::pcmap::PcMap;
use crate::rebuilt::Lazy;
use crate::timeline::Timeline;
use aetrace_analysis::addr::exec::{self, Entered, Exec, WayIn};
use aetrace_analysis::addr::full::{self, Planned, Recorded, DF};
use aetrace_analysis::addr::returns::Returns;
use aetrace_analysis::addr::{
    forms, value, Access, AddrExpr, Gpr, InsnProgram, ProcProgram, Repeat, Seg,
};
use aetrace_format::progdb::{CallDb, ProgramDb};
use aetrace_format::section::module_flags;
use aetrace_format::{ModuleId, ThreadId, Trace};
use aetrace_regen::compile::{BlockIx, Module as Compiled, ProcIx};
use aetrace_regen::handlers::Handlers;
use aetrace_regen::visit::{Event, Visit};
use aetrace_regen::{Options, SignalAt};
use iced_x86::{Decoder, DecoderOptions, Instruction, InstructionInfoFactory, Mnemonic};
use std::ops::Range;
use std::rc::Rc;

/// One data reference: the bytes `start..end` an instruction touched.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ref {
    /// The first byte.
    pub start: u64,
    /// Past the last byte.
    pub end: u64,
    /// Load, store or both.
    pub access: Access,
    /// The register the address is computed from, with the displacement
    /// added to it, when that is all (no segment base, no index): the
    /// register's value before the instruction is `start - disp`
    /// (`crate::frames`).
    pub from: Option<(Gpr, u64)>,
}

impl Ref {
    /// An outside entry's `rsp` recorded by its stub, in a control-only
    /// trace ([`entry_values`]): a reference of no bytes at it.
    fn entry_rsp(rsp: u64) -> Ref {
        Ref {
            start: rsp,
            end: rsp,
            access: Access::Load,
            from: Some((Gpr::RSP, 0)),
        }
    }

    /// The `rsp` an outside entry's stub recorded, if this is it.
    pub fn entered_with(&self) -> Option<u64> {
        (self.start == self.end && self.from == Some((Gpr::RSP, 0))).then_some(self.start)
    }
}

impl Ref {
    /// Whether it reads memory.
    pub fn reads(&self) -> bool {
        self.access != Access::Store
    }

    /// Whether it writes memory.
    pub fn writes(&self) -> bool {
        self.access != Access::Load
    }

    /// Whether it touches a byte of `start..end`.
    pub fn overlaps(&self, start: u64, end: u64) -> bool {
        self.start < end && start < self.end
    }
}

/// How an instruction moves the procedure stack ([`Data::scan_back`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flow {
    /// A call (not a system call) returning to this address.
    Call(u64),
    /// A return.
    Ret,
    /// Anything else.
    Other,
}

/// Where the code is: the bytes gdb reads and the traced blocks (for each
/// address's module and its load bias).
pub struct Code<'a, 'm> {
    /// The modules' read-only segments.
    pub image: &'a Image,
    /// The traced blocks.
    pub blocks: &'a Blocks<'m>,
    /// The regenerator's modules (load biases).
    pub modules: &'a [&'m Compiled],
}

/// A thread's recorded values, per module (in the regenerator's order)
/// its program database when it was recorded by abstract execution, and
/// where signals change the order the values are read in.
pub struct Values<'a> {
    values: Vec<u64>,
    dbs: Vec<Option<(ProgramDb, Returns)>>,
    marks: Marks,
    /// Handlers' returns have the registers before them (format 1.11).
    registers: bool,
    /// `rep` faults have their registers after their SIGNAL (format 1.13).
    rep_faults: bool,
    /// Every reference, rebuilt by the data walk as asked (no values
    /// then).
    rebuilt: Option<Lazy<'a>>,
    /// A control-only trace's values: each outside entry's `rsp` alone.
    entry_only: bool,
}

/// What happens to the reading order before the instruction at a
/// position ([`Marks`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mark {
    /// A handler was entered: its values start at value `at` (the
    /// SIGNAL record's place), and the unread ones before it are the
    /// interrupted instruction's early values; `rep`: a `rep` string
    /// instruction's three registers come first (format 1.16).
    Deliver { at: usize, offset: u64, rep: bool },
    /// The handler of the SIGNAL record at `offset` returned, having
    /// `moved` the rip or not.
    Return { offset: u64, moved: bool },
    /// The instruction at this position raised a fault: it read nothing
    /// and made no reference (its handler follows, or the thread ends).
    Fault,
}

/// A thread's [`Mark`]s by position, in the regenerator's order.
type Marks = Vec<(u64, Mark)>;

/// The marks of `thread`, whose SIGNAL and FAULT records are `signals`,
/// from the regenerator's walk (positions count its instructions).
fn marks<B: AsRef<[u8]> + Sync>(
    trace: &Trace<B>,
    thread: u32,
    signals: &[SignalAt],
) -> Result<Marks, String> {
    let opts = Options {
        thread: Some(thread),
        ..Options::default()
    };
    let visit = Visit::new(trace, &opts).map_err(|e| e.to_string())?;
    let (mut marks, mut pos, mut bad) = (Vec::new(), 0u64, None);
    visit
        .run(&mut |runs| {
            for e in runs.events() {
                match e {
                    Event::Run(r) if r.faults => marks.push((pos, Mark::Fault)),
                    Event::Signal { offset, .. } => {
                        match signals.iter().find(|s| s.offset == offset) {
                            Some(s) => marks.push((
                                pos,
                                Mark::Deliver {
                                    at: s.at,
                                    offset,
                                    rep: s.rep,
                                },
                            )),
                            None => bad = Some(offset),
                        }
                    }
                    Event::SigReturn { offset, moved } => {
                        marks.push((pos, Mark::Return { offset, moved }))
                    }
                    _ => {}
                }
                if let Event::Run(r) = e {
                    pos += u64::from(r.end - r.first);
                }
            }
            bad.is_none()
        })
        .map_err(|e| e.to_string())?;
    match bad {
        Some(o) => Err(format!(
            "thread {thread}: a handler was entered at the SIGNAL record at stream offset {o}, which the data values do not have"
        )),
        None => Ok(marks),
    }
}

/// Where the next values are read from: the interrupted instructions'
/// early values put back (`pending`, in order), then the stream from
/// `next`; the last position's address (an outside-entry stub's value
/// depends on it); the handlers running, and the next [`Mark`].
#[derive(Clone, Debug, Default)]
struct Cursor {
    next: usize,
    /// Each handler's return has the registers before it (format 1.11).
    registers: bool,
    /// A `rep` string instruction's fault has its registers after its
    /// SIGNAL (format 1.13).
    rep_faults: bool,
    /// Values the next delivery passes over (a `rep` fault's registers).
    after_signal: usize,
    pending: Vec<Range<usize>>,
    prev: Option<u64>,
    saved: Handlers<Saved>,
    mark: usize,
    /// Bit `k`: the thread (or the handler running) has read thread
    /// constant `k` (`Recorded::Once`), as the runtime's slot word `ONCE`.
    once: u8,
}

/// What a handler's delivery saved of the code it interrupted.
#[derive(Clone, Debug)]
struct Saved {
    early: Vec<Range<usize>>,
    prev: Option<u64>,
    once: u8,
}

impl Cursor {
    /// Takes the next `n` values, a range of indices at a time to `f`.
    fn advance(&mut self, mut n: usize, mut f: impl FnMut(Range<usize>)) {
        while n > 0 {
            let Some(r) = self.pending.first_mut() else {
                f(self.next..self.next + n);
                self.next += n;
                return;
            };
            let k = n.min(r.len());
            f(r.start..r.start + k);
            (r.start, n) = (r.start + k, n - k);
            if r.start == r.end {
                self.pending.remove(0);
            }
        }
    }

    /// Applies the marks before the instruction at position `p`; whether
    /// that instruction raised a fault.
    fn apply(&mut self, marks: &[(u64, Mark)], p: u64) -> Result<bool, String> {
        let mut fault = false;
        while let Some(&(q, m)) = marks.get(self.mark).filter(|m| m.0 <= p) {
            if q < p {
                return Err(format!(
                    "internal: a signal's mark at position {q} was passed"
                ));
            }
            self.mark += 1;
            match m {
                Mark::Deliver { at, offset, rep } => self.deliver(at, offset, rep)?,
                Mark::Return { offset, moved } => self.sigreturn(offset, moved)?,
                Mark::Fault => fault = true,
            }
        }
        Ok(fault)
    }

    /// A handler was entered (as `regen`'s data walk, `deliver`): the
    /// unread values before value `at` are saved as the interrupted
    /// instruction's, and the handler reads from `at` on, after a `rep`
    /// string instruction's registers when its SIGNAL says so (`rep`,
    /// format 1.16; a fault's from 1.13, [`Data::fault`]).
    fn deliver(&mut self, at: usize, offset: u64, rep: bool) -> Result<(), String> {
        if at < self.next {
            return Err(format!(
                "the values were read past the SIGNAL record at stream offset {offset}"
            ));
        }
        let mut early = std::mem::take(&mut self.pending);
        early.push(self.next..at);
        let prev = self.prev.take();
        let once = std::mem::take(&mut self.once);
        self.saved.enter(offset, Saved { early, prev, once });
        let regs = std::mem::take(&mut self.after_signal);
        self.next = at + if rep { 3 } else { regs };
        Ok(())
    }

    /// The handler of the SIGNAL record at `offset` returned (as the data
    /// walk's `sigreturn`): handlers entered after it never returned; the
    /// interrupted instruction's early values are read first, unless the
    /// handler `moved` the rip (it never runs); the 16 registers the
    /// runtime's `sigreturn` records then (format 1.11) are passed over.
    fn sigreturn(&mut self, offset: u64, moved: bool) -> Result<(), String> {
        let mut s = self.saved.returned(offset).ok_or_else(|| {
            format!(
                "the handler of the SIGNAL at stream offset {offset} returned, but was not entered"
            )
        })?;
        if moved {
            s.early.clear();
        }
        if self.registers && moved {
            self.next += 16;
        }
        let rest = std::mem::take(&mut self.pending);
        self.pending = s
            .early
            .into_iter()
            .chain(rest)
            .filter(|r| r.start < r.end)
            .collect();
        self.prev = s.prev;
        self.once = s.once;
        Ok(())
    }

    /// The abstract values of an instruction whose plan is `skip`: its
    /// thread constant counts only the first time (then it is read).
    fn abstract_values(&mut self, (n, once): Skip) -> usize {
        match once {
            Some(k) if self.once & 1 << k == 0 => {
                self.once |= 1 << k;
                n + 1
            }
            _ => n,
        }
    }
}

/// An instruction's abstract plan as the values it reads ([`Skip`]).
fn skip_of(plan: &[Recorded]) -> Skip {
    let once = plan.iter().find_map(|r| match *r {
        Recorded::Once(k) => Some(k),
        _ => None,
    });
    (plan.len() - usize::from(once.is_some()), once)
}

/// The file module `m` was recorded from.
fn module_image<B: AsRef<[u8]>>(
    trace: &Trace<B>,
    m: &Compiled,
) -> Result<aetrace_analysis::elf::Module, String> {
    let rec = (trace.module(ModuleId(m.id)))
        .ok_or_else(|| format!("module {} is not in the trace", m.name))?;
    let path = String::from_utf8_lossy(&rec.path).into_owned();
    aetrace_analysis::elf::Module::open(std::path::Path::new(&path))
        .map_err(|e| format!("{path}: {e}"))
}

/// The recorded values of `thread`, or why the trace has none for it
/// (every module the thread runs must have been recorded with data
/// addresses). A module recorded with every address in full (`--data
/// --check`) is read here; one recorded with `--data` alone makes the
/// thread's references `rebuild`'s, the abstract data walk's
/// ([`crate::rebuilt`], rebuilt as asked). A thread that handled signals costs a regeneration of
/// its stream here ([`marks`]).
pub fn values<'a, B: AsRef<[u8]> + Sync>(
    trace: &Trace<B>,
    thread: u32,
    modules: &[&Compiled],
    rebuild: Option<crate::Rebuild<'a>>,
) -> Result<Values<'a>, String> {
    let flags = |m: &Compiled| trace.module(ModuleId(m.id)).map_or(0, |r| r.flags);
    if let Some(m) = modules
        .iter()
        .find(|m| flags(m) & module_flags::DATA_ABS == 0)
    {
        return Err(format!(
            "watchpoints need data addresses, and module {} was recorded without them (record with --data)",
            m.name
        ));
    }
    if modules
        .iter()
        .any(|m| flags(m) & module_flags::DATA_CHECK == 0)
    {
        let rebuild = rebuild.ok_or("the trace's data addresses are not rebuilt here")?;
        return Ok(Values {
            values: Vec::new(),
            // Its entries, for the frames' openers ([`Data::outside_entry`]).
            dbs: module_dbs(trace, modules, |_| true)?,
            marks: Vec::new(),
            registers: false,
            rep_faults: false,
            rebuilt: Some(Lazy::new(rebuild(thread)?)),
            entry_only: false,
        });
    }
    let dbs = module_dbs(trace, modules, |m| flags(m) & module_flags::DATA_ABS != 0)?;
    let (v, signals) =
        aetrace_regen::data_values_entered(trace, ThreadId(thread)).map_err(|e| e.to_string())?;
    let marks = match signals.is_empty() {
        true => Vec::new(),
        false => marks(trace, thread, &signals)?,
    };
    Ok(Values {
        values: v.values,
        dbs,
        marks,
        registers: trace.header().minor >= aetrace_format::header::MINOR_SIGRETURN,
        rep_faults: trace.header().minor >= aetrace_format::header::MINOR_REP_FAULT,
        rebuilt: None,
        entry_only: false,
    })
}

/// The program database and the `returns` of each module that `with`
/// says, in the regenerator's order.
fn module_dbs<B: AsRef<[u8]>>(
    trace: &Trace<B>,
    modules: &[&Compiled],
    with: impl Fn(&Compiled) -> bool,
) -> Result<Vec<Option<(ProgramDb, Returns)>>, String> {
    let db = |m: &Compiled| {
        let db = program_db(trace, m.id).map_err(|e| format!("module {}: {e}", m.name))?;
        let returns = Returns::of_module(&db, &module_image(trace, m)?);
        Ok::<_, String>((db, returns))
    };
    modules
        .iter()
        .map(|m| with(m).then(|| db(m)).transpose())
        .collect()
}

/// A control-only trace's values of `thread` (format 1.21,
/// `MINOR_ENTRY_RSP`): each outside entry's `rsp`, for the frames'
/// addresses alone ([`crate::frames::cfas_by_entries`]), not
/// watchpoints. Refused for a thread that handled signals (a handler's
/// return would have to be placed among them) and for older traces.
pub fn entry_values<B: AsRef<[u8]> + Sync>(
    trace: &Trace<B>,
    thread: u32,
    modules: &[&Compiled],
) -> Result<Values<'static>, String> {
    if trace.header().minor < aetrace_format::header::MINOR_ENTRY_RSP {
        return Err("the trace is older than format 1.21: no entry's rsp".into());
    }
    let (v, signals) =
        aetrace_regen::data_values_entered(trace, ThreadId(thread)).map_err(|e| e.to_string())?;
    if !signals.is_empty() {
        return Err(format!("thread {thread} handled signals"));
    }
    Ok(Values {
        values: v.values,
        dbs: module_dbs(trace, modules, |_| true)?,
        marks: Vec::new(),
        registers: false,
        rep_faults: false,
        rebuilt: None,
        entry_only: true,
    })
}

fn program_db<B: AsRef<[u8]>>(trace: &Trace<B>, id: u32) -> Result<ProgramDb, String> {
    let db = trace
        .program_database(ModuleId(id))
        .ok_or("no program database")?;
    let bytes = db.decompress().map_err(|e| e.to_string())?;
    ProgramDb::decode(&bytes).map_err(|e| e.to_string())
}

/// The last instruction of a block: where it is and the call it ends with.
struct BlockEnd {
    module: usize,
    proc: u32,
    block: u32,
    call: Option<CallDb>,
}

/// A procedure entry: where it is, its plain predecessors (blocks of the
/// procedure), and whether it starts with `rsp` known (then an outside
/// entry's stub wrote a value).
struct EntryFacts {
    module: usize,
    proc: u32,
    plain: Vec<u32>,
    stubbed: bool,
}

/// A decoded instruction, its module's load bias, and how many abstract
/// values come before its full ones.
struct Insn {
    planned: Planned,
    /// Its module, in the regenerator's order.
    module: usize,
    base: u64,
    /// Its abstract values: how many, and the thread constant one of
    /// them is when the thread has not recorded it yet.
    skip: Skip,
}

/// An instruction's abstract values: the values always recorded, and the
/// thread constant (`exec::mark_once`) recorded when the reading thread
/// (or handler) has not yet.
type Skip = (usize, Option<u8>);

/// A thread's data references (see the module comment).
pub struct Data<'a> {
    values: Vec<u64>,
    dbs: Vec<Option<(ProgramDb, Returns)>>,
    marks: Marks,
    /// Abstract values before each instruction, by run-time address, for
    /// the procedures seen so far.
    skips: PcMap<u64, Skip>,
    /// The reading order at the start of each interval learnt so far.
    starts: Vec<Cursor>,
    /// By address, for the procedures seen so far: each block's last
    /// instruction, and each entry that starts with `rsp` known.
    ends: PcMap<u64, BlockEnd>,
    entries: PcMap<u64, EntryFacts>,
    /// Decoded instructions by run-time address.
    insns: PcMap<u64, Rc<Insn>>,
    info: InstructionInfoFactory,
    /// An instruction's values by the reading order, and when it splits
    /// them, the values together.
    ranges: Vec<Range<usize>>,
    split: Vec<u64>,
    /// Every reference, when the data walk rebuilds them
    /// ([`crate::rebuilt`]): the values, the marks and the reading order
    /// are not used then.
    rebuilt: Option<Lazy<'a>>,
    /// The values are each outside entry's `rsp` alone ([`entry_values`]).
    entry_only: bool,
    /// `rsp` less the entry's before each instruction, by run-time
    /// address, where the stack deltas know it (`value::rsp_offsets`):
    /// the procedures seen so far, with [`Data::entry_only`].
    rsp: PcMap<u64, Option<i64>>,
}

impl<'a> Data<'a> {
    /// The references of a thread whose recorded values are `values`.
    pub fn new(v: Values<'a>) -> Data<'a> {
        Data {
            values: v.values,
            dbs: v.dbs,
            marks: v.marks,
            skips: PcMap::default(),
            starts: vec![Cursor {
                registers: v.registers,
                rep_faults: v.rep_faults,
                ..Cursor::default()
            }],
            ends: PcMap::default(),
            entries: PcMap::default(),
            insns: PcMap::default(),
            info: InstructionInfoFactory::new(),
            ranges: Vec::new(),
            split: Vec::new(),
            rebuilt: v.rebuilt,
            entry_only: v.entry_only,
            rsp: PcMap::default(),
        }
    }

    /// The first position at or after `from` (`forward`) or the last before
    /// it (exclusive) for which `f(position, pc, references)` says
    /// something, with what it said; `None` at the end of the timeline.
    pub fn scan<T>(
        &mut self,
        t: &mut Timeline<'_>,
        code: &Code<'_, '_>,
        from: u64,
        forward: bool,
        mut f: impl FnMut(u64, u64, &[Ref]) -> Option<T>,
    ) -> Result<Option<(u64, T)>, String> {
        self.scan_flow(t, code, from, forward, |p, pc, _, refs| f(p, pc, refs))
    }

    /// [`Data::scan`], `f` given each position's [`Flow`] too.
    pub(crate) fn scan_flow<T>(
        &mut self,
        t: &mut Timeline<'_>,
        code: &Code<'_, '_>,
        from: u64,
        forward: bool,
        mut f: impl FnMut(u64, u64, Flow, &[Ref]) -> Option<T>,
    ) -> Result<Option<(u64, T)>, String> {
        let first = match forward {
            true => from,
            false => match from.checked_sub(1) {
                Some(p) => p,
                None => return Ok(None),
            },
        };
        let Some(mut k) = t.interval_of(first) else {
            return Ok(None);
        };
        loop {
            let (lo, hi) = match forward {
                true => (from, u64::MAX),
                false => (0, from),
            };
            let mut found = None;
            let end = self.walk(t, code, k, |p, pc, flow, refs| {
                if (lo..hi).contains(&p) {
                    if let Some(x) = f(p, pc, flow, refs) {
                        found = Some((p, x));
                        return forward;
                    }
                }
                false
            })?;
            if found.is_some() {
                return Ok(found);
            }
            k = match forward {
                true => match t.interval_of(end) {
                    Some(k2) => k2,
                    None => return Ok(None),
                },
                false => match k.checked_sub(1) {
                    Some(k2) => k2,
                    None => return Ok(None),
                },
            };
        }
    }

    /// Calls `f` on positions `to`, `to - 1`, ... 0 (latest first) with
    /// each one's pc, [`Flow`] and references, until it says stop.
    pub fn scan_back(
        &mut self,
        t: &mut Timeline<'_>,
        code: &Code<'_, '_>,
        to: u64,
        mut f: impl FnMut(u64, u64, Flow, &[Ref]) -> bool,
    ) -> Result<(), String> {
        let Some(mut k) = t.interval_of(to) else {
            return Ok(());
        };
        // One buffer of every position's references, reused per interval
        // (a vector per position was a fifth of a data trace's first stop,
        // 2026-12-02).
        let (mut seen, mut all) = (Vec::new(), Vec::new());
        loop {
            seen.clear();
            all.clear();
            self.walk(t, code, k, |p, pc, flow, refs| {
                seen.push((p, pc, flow, all.len()));
                all.extend_from_slice(refs);
                p >= to
            })?;
            let mut end = all.len();
            for &(p, pc, flow, from) in seen.iter().rev() {
                if f(p, pc, flow, &all[from..end]) {
                    return Ok(());
                }
                end = from;
            }
            k = match k.checked_sub(1) {
                Some(j) => j,
                None => return Ok(()),
            };
        }
    }

    /// The [`Flow`] of the instruction at `pc`.
    pub(crate) fn flow(&mut self, code: &Code<'_, '_>, pc: u64) -> Result<Flow, String> {
        let i = self.insn(code, pc)?;
        Ok(flow_of(&i))
    }

    /// Calls `f` on each position of interval `k` in order (its pc,
    /// [`Flow`] and references) until it says stop; the position after
    /// the interval (or the one it stopped at).
    fn walk(
        &mut self,
        t: &mut Timeline<'_>,
        code: &Code<'_, '_>,
        k: usize,
        mut f: impl FnMut(u64, u64, Flow, &[Ref]) -> bool,
    ) -> Result<u64, String> {
        // Rebuilt references need no reading order.
        let mut c = match self.rebuilt {
            Some(_) => Cursor::default(),
            None => self.start_of(t, code, k)?,
        };
        let (base, pcs) = t.interval(k);
        let mut refs = Vec::new();
        for (i, &pc) in pcs.iter().enumerate() {
            let p = base + i as u64;
            refs.clear();
            // Each position's instruction looked up once (twice was a
            // tenth of a data trace's first stop, 2026-12-02).
            let flow = if self.rebuilt.is_some() {
                let insn = self.insn(code, pc)?;
                self.rebuilt_refs(&insn, p, pc, &mut refs)?;
                flow_of(&insn)
            } else if c.apply(&self.marks, p)? {
                self.fault(code, pc, &mut c)?;
                self.flow(code, pc)?
            } else if self.entry_only {
                let insn = self.insn(code, pc)?;
                if self.stub(c.prev, pc) == 1 {
                    let mut at = 0;
                    c.advance(1, |r| at = r.start);
                    refs.push(Ref::entry_rsp(self.entry_value(at, pc)?));
                }
                c.prev = Some(pc);
                flow_of(&insn)
            } else {
                let insn = self.insn(code, pc)?;
                let before = self.stub(c.prev, pc) + c.abstract_values(insn.skip);
                self.refs(code, &insn, pc, &mut c, before, &mut refs)?;
                c.prev = Some(pc);
                flow_of(&insn)
            };
            if f(p, pc, flow, &refs) {
                return Ok(p);
            }
        }
        let end = base + pcs.len() as u64;
        if self.starts.len() == k + 1 {
            self.starts.push(c);
        }
        Ok(end)
    }

    /// Fills `out` with the references the data walk rebuilt for position
    /// `p` (at `pc`), each with the register its address is computed from
    /// as the decoded instruction has it (a `rep`'s none).
    fn rebuilt_refs(
        &mut self,
        insn: &Insn,
        p: u64,
        pc: u64,
        out: &mut Vec<Ref>,
    ) -> Result<(), String> {
        let got = match self.rebuilt.as_mut() {
            Some(r) => r.of(p)?,
            None => &[],
        };
        let prog = &insn.planned.prog;
        let rep = prog.refs.iter().any(|r| r.repeat != Repeat::Once);
        // A faulting instruction made none.
        if !rep && !got.is_empty() && got.len() != prog.refs.len() {
            return Err(format!(
                "the data walk gave instruction {p} at {pc:#x} {} references, where it has {}",
                got.len(),
                prog.refs.len()
            ));
        }
        let with_reg = got.iter().zip(&prog.refs);
        out.extend(with_reg.map(|(&(start, end, access), r)| Ref {
            start,
            end,
            access,
            from: plain_base(&r.addr).filter(|_| !rep),
        }));
        Ok(())
    }

    /// The reading order at interval `k`'s first position, counting
    /// earlier intervals' values if not yet known.
    fn start_of(
        &mut self,
        t: &mut Timeline<'_>,
        code: &Code<'_, '_>,
        k: usize,
    ) -> Result<Cursor, String> {
        while self.starts.len() <= k {
            let j = self.starts.len() - 1;
            let mut c = self.starts[j].clone();
            let (base, pcs) = t.interval(j);
            let pcs = pcs.to_vec();
            for (p, pc) in (base..).zip(pcs) {
                if c.apply(&self.marks, p)? {
                    self.fault(code, pc, &mut c)?;
                    continue;
                }
                let i = self.insn(code, pc)?;
                let full = if self.entry_only {
                    0
                } else {
                    i.planned.plan.len()
                };
                let n = self.stub(c.prev, pc) + c.abstract_values(i.skip) + full;
                c.advance(n, |_| {});
                c.prev = Some(pc);
            }
            self.starts.push(c);
        }
        Ok(self.starts[k].clone())
    }

    /// The instruction at `pc` raised a fault: a `rep` string one's
    /// registers at the fault follow its SIGNAL (format 1.13), and the
    /// delivery passes over them. (Its early values are read as written
    /// when it resumes: its references span every iteration's bytes there,
    /// the ones before the fault too.)
    fn fault(&mut self, code: &Code<'_, '_>, pc: u64, c: &mut Cursor) -> Result<(), String> {
        if c.rep_faults && full::registers_at_fault(&self.insn(code, pc)?.planned.prog) {
            c.after_signal = 3;
        }
        Ok(())
    }

    /// The values an outside-entry stub wrote before the instruction at
    /// `pc` when the one before was at `prev` (`exec::Entered`, as the
    /// regenerator decides it): 1 at an entry that starts with `rsp`
    /// known, not reached along a plain edge of its procedure nor by a
    /// direct call or jump; else 0. Both were decoded before.
    /// `src/cmd/dataout.rs` decides the same by block runs (`came_by`, then
    /// `entry_rsp`): what the two share is `Entered::by`; the rest is how
    /// each finds the run before (here by the previous pc).
    fn stub(&self, prev: Option<u64>, pc: u64) -> usize {
        match self.entries.get(&pc) {
            Some(e) if e.stubbed => self.entered(prev, pc),
            _ => 0,
        }
    }

    /// 1 if the instruction at `pc` is an outside entry (not reached
    /// along a plain edge of its procedure nor by a direct call or jump)
    /// when the one before was at `prev`, whether its stub wrote a value
    /// or not; else 0. Both were decoded before.
    fn entered(&self, prev: Option<u64>, pc: u64) -> usize {
        let Some(e) = self.entries.get(&pc) else {
            return 0;
        };
        let Some(p) = prev
            .and_then(|a| self.ends.get(&a))
            .filter(|p| p.module == e.module)
        else {
            return 1;
        };
        if p.proc == e.proc && e.plain.contains(&p.block) {
            return 0;
        }
        usize::from(Entered::by(p.call.as_ref(), e.proc) == Entered::Outside)
    }

    /// The instruction at run-time address `pc`, decoded once.
    fn insn(&mut self, code: &Code<'_, '_>, pc: u64) -> Result<Rc<Insn>, String> {
        if let Some(i) = self.insns.get(&pc) {
            return Ok(i.clone());
        }
        let b = code
            .blocks
            .at(pc)
            .ok_or_else(|| format!("{pc:#x} is in no traced block"))?;
        let base = code.modules[b.module].load_base;
        let mut bytes = [0u8; 15];
        let n = code.image.read(pc, &mut bytes);
        let mut d = Decoder::with_ip(64, &bytes[..n], pc.wrapping_sub(base), DecoderOptions::NONE);
        let insn = d.decode();
        if insn.is_invalid() {
            return Err(format!("no instruction can be read at {pc:#x}"));
        }
        let planned = match self.entry_only {
            // No full values: its references are not read.
            true => Planned {
                prog: forms::program(&insn, &mut self.info),
                insn,
                plan: Vec::new(),
            },
            false => Planned::new(insn, &mut self.info)?,
        };
        let skip = self.skip(code, b.module, pc)?;
        let i = Rc::new(Insn {
            module: b.module,
            planned,
            base,
            skip,
        });
        self.insns.insert(pc, i.clone());
        Ok(i)
    }

    /// The abstract values before the instruction at `pc` of module
    /// `module` (0 when it was recorded without abstract execution),
    /// planned for its whole procedure at once ([`Data::learn_proc`]).
    fn skip(&mut self, code: &Code<'_, '_>, module: usize, pc: u64) -> Result<Skip, String> {
        let Some(Some(_)) = self.dbs.get(module) else {
            return Ok((0, None));
        };
        if let Some(&n) = self.skips.get(&pc) {
            return Ok(n);
        }
        let m = code.modules[module];
        let (pi, _) = m
            .traced_at(pc.wrapping_sub(m.load_base))
            .ok_or_else(|| format!("{pc:#x} is in no block of {}", m.name))?;
        self.learn_proc(code, module, pi)?;
        self.skips
            .get(&pc)
            .copied()
            .ok_or_else(|| format!("{pc:#x} starts no instruction of its procedure"))
    }

    /// Plans procedure `pi` of module `module` as the recorder did: each
    /// instruction's abstract values (`skips`), each block's end (`ends`)
    /// and its entry if it starts with `rsp` known (`entries`).
    fn learn_proc(&mut self, code: &Code<'_, '_>, module: usize, pi: ProcIx) -> Result<(), String> {
        let m = code.modules[module];
        let mut progs = decode_proc(code.image, m, pi, &mut self.info);
        let Some(Some((db, returns))) = self.dbs.get(module) else {
            return Ok(());
        };
        let p = db
            .procs
            .get(pi.as_u32() as usize)
            .ok_or_else(|| format!("procedure {pi:?} of {} is not in its database", m.name))?;
        // A control-only trace recorded no abstract values: its
        // instructions plan none, and every entry has a stub's value, so
        // the recorder's marks and knowledge (most of a procedure's
        // learning, 2026-12-02) are not needed.
        // Nor one whose references were rebuilt: its values are not read.
        let known = match self.entry_only || self.rebuilt.is_some() {
            true => None,
            false => Some(exec::entry_knowledge(p, returns, &mut progs)),
        };
        let ways = exec::ways_in(p, returns, &progs);
        let proc = pi.as_u32();
        let at = |i: &Instruction| m.load_base.wrapping_add(i.ip());
        if self.entry_only {
            let offsets = value::rsp_offsets(&ProcProgram::of_db(p, &progs));
            for (insns, ks) in progs.iter().zip(offsets) {
                for ((i, _), k) in insns.iter().zip(ks) {
                    self.rsp.insert(at(i), k);
                }
            }
        }
        for (b, (insns, blk)) in progs.iter().zip(&p.blocks).enumerate() {
            let k = match known.as_ref().map(|known| known.get(b)) {
                Some(None) => break,
                k => k.flatten().copied(),
            };
            let plans = match k {
                Some(k) => Exec::plan_block(k, insns, exec::anchors_rsp(blk)).0,
                None => Vec::new(),
            };
            for (j, (i, _)) in insns.iter().enumerate() {
                let plan = match plans.get(j) {
                    Some(Ok(plan)) => &plan[..],
                    _ => &[],
                };
                self.skips.insert(at(i), skip_of(plan));
            }
            if let Some((last, _)) = insns.last() {
                let (block, call) = (b as u32, blk.call);
                let end = BlockEnd {
                    module,
                    proc,
                    block,
                    call,
                };
                self.ends.insert(at(last), end);
            }
            if let Some((first, _)) = insns.first() {
                if let Some(plain) = entry_plain(&ways[b]) {
                    // Only an entry that starts with `rsp` known has a
                    // stub's value (in a control-only trace every entry).
                    let stubbed = k.map_or(true, |k| k.0 != 0);
                    let facts = EntryFacts {
                        module,
                        proc,
                        plain,
                        stubbed,
                    };
                    self.entries.insert(at(first), facts);
                }
            }
        }
        Ok(())
    }

    /// Whether the instruction at `pc`, the one before it being at `prev`,
    /// is an outside entry ([`Data::entered`]; in a control-only trace its
    /// stub wrote a value).
    pub(crate) fn outside_entry(
        &mut self,
        code: &Code<'_, '_>,
        prev: Option<u64>,
        pc: u64,
    ) -> Result<bool, String> {
        // Both procedures learnt (the stub's facts are learnt per procedure).
        if let Some(a) = prev {
            self.insn(code, a)?;
        }
        self.insn(code, pc)?;
        Ok(self.entered(prev, pc) == 1)
    }

    /// Value `at` (an outside entry's at `pc`, [`Data::entry_only`]).
    pub(crate) fn entry_value(&self, at: usize, pc: u64) -> Result<u64, String> {
        let n = self.values.len();
        (self.values.get(at).copied())
            .ok_or_else(|| format!("the thread's {n} entry values end before the entry at {pc:#x}"))
    }

    /// `rsp` less its value at its procedure's entry before the
    /// instruction at `pc`, where the stack deltas know it
    /// ([`Data::entry_only`]).
    pub fn rsp_offset(&mut self, code: &Code<'_, '_>, pc: u64) -> Result<Option<i64>, String> {
        self.insn(code, pc)?;
        Ok(self.rsp.get(&pc).copied().flatten())
    }

    /// `rsp` after the instructions at `body` (latest first, the
    /// procedure's `entry` last) from `rsp` at the entry, by the abstract
    /// execution's evaluator (a call's callee skipped to its return
    /// point); `None` if `body` does not start at `entry`
    /// or `rsp` moved by a value not known (`alloca`).
    pub fn follow_rsp(
        &mut self,
        code: &Code<'_, '_>,
        rsp: u64,
        body: Option<&[u64]>,
        entry: u64,
    ) -> Result<Option<u64>, String> {
        let Some(pcs) = body.filter(|b| b.last() == Some(&entry)) else {
            return Ok(None);
        };
        let mut e = Exec::unknown(self.insn(code, entry)?.base);
        e.regs[Gpr::RSP.index()] = Some(rsp);
        // A call whose return was not traced is in the body: the
        // evaluator runs it as returning with `rsp` as before it, so its
        // callee's positions (a PLT stub's) up to its return point are not.
        let mut back_at = None;
        for &pc in pcs.iter().rev() {
            if back_at.is_some_and(|r| r != pc) {
                continue;
            }
            let i = self.insn(code, pc)?;
            e.registers_only(&i.planned.insn, &i.planned.prog);
            back_at = i
                .planned
                .prog
                .call
                .then(|| pc + i.planned.insn.len() as u64);
        }
        Ok(e.regs[Gpr::RSP.index()])
    }

    /// The values at `ranges`, in order (for the instruction at `pc`).
    fn gather(&mut self, pc: u64) -> Result<&[u64], String> {
        let n = self.values.len();
        let missing =
            || format!("the thread's {n} data values end before the instruction at {pc:#x}");
        if let [r] = &self.ranges[..] {
            return self.values.get(r.clone()).ok_or_else(missing);
        }
        self.split.clear();
        for r in &self.ranges {
            let v = self.values.get(r.clone()).ok_or_else(missing)?;
            self.split.extend_from_slice(v);
        }
        Ok(&self.split)
    }

    /// Fills `out` with the references of `insn` at `pc`, taking its
    /// values from `c` after the `before` that precede them (a stub's,
    /// the abstract ones).
    fn refs(
        &mut self,
        code: &Code<'_, '_>,
        i: &Insn,
        pc: u64,
        c: &mut Cursor,
        before: usize,
        out: &mut Vec<Ref>,
    ) -> Result<(), String> {
        let insn = &i.planned;
        c.advance(before, |_| {});
        let ranges = &mut self.ranges;
        ranges.clear();
        c.advance(insn.plan.len(), |r| ranges.push(r));
        if insn.prog.refs.is_empty() {
            return Ok(());
        }
        let vals = self.gather(pc)?;
        let mut addrs = insn.addresses(vals, i.base);
        // The copies read copied jump tables: a recorded address there is
        // the original table's as gdb knows the program
        // (`Module::original_data_address`, as `regen --format lackey`).
        let m = code.modules[i.module];
        for p in &insn.plan {
            if let Recorded::Addr(k) = *p {
                addrs[k] = m.original_data_address(addrs[k]);
            }
        }
        // A `rep`'s values start with rcx and rflags (`full::plan`).
        let rep = match insn.plan.first() {
            Some(Recorded::Rcx) => Some((vals[0], vals[1] & DF != 0)),
            _ => None,
        };
        for (r, &a) in insn.prog.refs.iter().zip(&addrs) {
            let size = u64::from(r.size);
            let (start, end) = match rep {
                Some((n, down)) if r.repeat == Repeat::Rcx => match (n, down) {
                    (0, _) => continue,
                    (n, false) => (a, a.wrapping_add(n.wrapping_mul(size))),
                    (n, true) => (a.wrapping_sub((n - 1).wrapping_mul(size)), a + size),
                },
                _ => (a, a.wrapping_add(size)),
            };
            out.push(Ref {
                start,
                end,
                access: r.access,
                from: plain_base(&r.addr).filter(|_| rep.is_none()),
            });
        }
        Ok(())
    }
}

/// The [`Flow`] of a decoded instruction.
fn flow_of(i: &Insn) -> Flow {
    let insn = &i.planned.insn;
    match (i.planned.prog.call, insn.mnemonic()) {
        (true, _) => Flow::Call(i.base.wrapping_add(insn.next_ip())),
        (false, Mnemonic::Ret) => Flow::Ret,
        _ => Flow::Other,
    }
}

/// The register an address is computed from, with its displacement, when
/// that is all (no segment base, no index).
fn plain_base(e: &AddrExpr) -> Option<(Gpr, u64)> {
    let plain = e.seg == Seg::Flat && e.index.is_none() && e.bit_offset.is_none();
    e.base.filter(|_| plain).map(|b| (b, e.disp))
}

/// The instructions of procedure `pi`'s blocks, decoded from `image`,
/// with their address programs.
fn decode_proc(
    image: &Image,
    m: &Compiled,
    pi: ProcIx,
    info: &mut InstructionInfoFactory,
) -> Vec<Vec<(Instruction, InsnProgram)>> {
    let blocks = m.procs[pi].blocks.clone().map(BlockIx::from_u32);
    blocks
        .map(|k| {
            let blk = &m.blocks[k];
            let mut bytes = vec![0u8; blk.size as usize];
            image.read(m.load_base.wrapping_add(blk.start), &mut bytes);
            let mut d = Decoder::with_ip(64, &bytes, blk.start, DecoderOptions::NONE);
            (0..blk.ninsns)
                .map(|_| {
                    let i = d.decode();
                    (i, forms::program(&i, info))
                })
                .collect()
        })
        .collect()
}

/// A block's plain predecessors if it is its procedure's entry (`ways`:
/// its ways in), else `None`.
fn entry_plain(ways: &[WayIn]) -> Option<Vec<u32>> {
    if !ways.contains(&WayIn::Entry) {
        return None;
    }
    let plain = ways.iter().filter_map(|w| match *w {
        WayIn::Plain(q) => Some(q),
        _ => None,
    });
    Some(plain.collect())
}
