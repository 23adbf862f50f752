//! `aetrace regen --format lackey|xdin --data`: the instruction *and* data
//! trace of a `record --data` run (issue 21, points 3-5). The walk is
//! `regen::visit`'s (the executed blocks, per thread, identical for any
//! `-j`); each instruction's references come from `analysis::addr::forms`
//! (kind and size as lackey counts them) and their addresses from
//! `analysis::addr::exec`, the abstract execution the rewriter placed the
//! thread's VALUE records by: static ones from the instruction, the others
//! recomputed from known registers or read from the records in order.
//! With `--check` (MODULE flag `DATA_CHECK`) every non-static address was
//! also recorded in full after those: each recomputed address is compared
//! with it, and the first difference is an error naming the procedure,
//! block, instruction and both addresses.
//!
//! Output: `lackey` is valgrind lackey's text (`I  %08lx,%lu`, then ` L`,
//! ` S`, ` M` lines with `%08lx,%lu`); a `rep` string instruction is one
//! `I` per iteration plus one for the final `rcx == 0` test, as lackey
//! prints it. `xdin` is `i ADDR LEN`, `r ADDR SIZE`, `w ADDR SIZE` (hex; a
//! read-modify-write is `r` then `w`). Both are a [`Sink`] of the walk;
//! `aetrace cachesim TRACE` is another ([`walk`]).
//!
//! Invariants: every value of a thread is used exactly once (too few or
//! too many is an error naming the thread); a module rewritten without
//! `--data` is refused, never printed without its references; a block
//! that inherits known registers (`exec::entry_knowledge`) is entered only
//! by one of the ways the analysis assumed (`exec::WayIn`: right after a
//! plain predecessor, after a `ret` of the callee of the call it returns
//! from, or at a procedure entry with `rsp` from the direct call or jump
//! before it, or from the outside-entry stub's VALUE right after its
//! ENTER, `exec::Entered`), else an error naming procedure and block.
//! A signal handler's values sit among the interrupted instruction's
//! (`signals`).

// (A path the `cachesim` binary, which includes this file by its path, finds too.)
#[path = "dataout/signals.rs"]
mod signals;

use std::io::Write;
use std::path::Path;
use std::rc::Rc;

use aetrace_analysis::addr::exec::code::BlockCode;
use aetrace_analysis::addr::exec::{self, Entered, Exec, InsnAddrs, WayIn};
use aetrace_analysis::addr::full::{self, Recorded, DF};
use aetrace_analysis::addr::returns::Returns;
use aetrace_analysis::addr::{forms, Access, Gpr, InsnProgram, RegSet};
use aetrace_format::progdb::ProgramDb;
use aetrace_format::section::module_flags;
use aetrace_format::{ModuleId, ThreadId, Trace};
use aetrace_regen::compile::{BlockIx, Module};
use aetrace_regen::visit::{BlockRun, Event, Visit};
use iced_x86::{Decoder, DecoderOptions, Instruction, InstructionInfoFactory, Mnemonic};

/// The two data-trace formats.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum DataFormat {
    /// valgrind lackey's `--trace-mem=yes` text.
    Lackey,
    /// Extended din with `r`/`w` lines.
    Xdin,
}

type Error = Box<dyn std::error::Error>;

/// The walk's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Where the walk's references go, in program order.
pub trait Sink {
    /// The trace's modules, which [`BlockRun::module`] indexes, before
    /// any reference.
    fn modules(&mut self, _: &[Module]) {}
    /// A run of a block starts: its instructions follow.
    fn run(&mut self, _: BlockRun) {}
    /// An executed instruction, the `k`-th of its block (each iteration
    /// of a `rep` string instruction, and its final `rcx == 0` test, is
    /// one).
    fn insn(&mut self, k: u32, addr: u64, len: u32) -> Result<(), Error>;
    /// A data reference of the instruction given last.
    fn data(&mut self, access: Access, addr: u64, size: u32) -> Result<(), Error>;
}

/// The two text formats as a sink.
struct Text<'o> {
    format: DataFormat,
    out: &'o mut dyn Write,
}

impl Sink for Text<'_> {
    fn insn(&mut self, _: u32, ip: u64, len: u32) -> Result<(), Error> {
        Ok(match self.format {
            DataFormat::Lackey => writeln!(self.out, "I  {ip:08x},{len}"),
            DataFormat::Xdin => writeln!(self.out, "i {ip:x} {len:x}"),
        }?)
    }

    fn data(&mut self, access: Access, a: u64, s: u32) -> Result<(), Error> {
        Ok(match (self.format, access) {
            (DataFormat::Lackey, acc) => writeln!(self.out, " {} {a:08x},{s}", acc.letter()),
            (DataFormat::Xdin, Access::Load) => writeln!(self.out, "r {a:x} {s:x}"),
            (DataFormat::Xdin, Access::Store) => writeln!(self.out, "w {a:x} {s:x}"),
            (DataFormat::Xdin, Access::Modify) => {
                writeln!(self.out, "r {a:x} {s:x}\nw {a:x} {s:x}")
            }
        }?)
    }
}

/// Whether `trace` holds data addresses (`record --data`).
pub fn has_data(trace: &Path) -> Result<bool, Error> {
    let trace = Trace::open(trace)?;
    Ok(trace.modules().iter().any(has_data_flag))
}

fn has_data_flag(m: &aetrace_format::section::Module) -> bool {
    m.flags & module_flags::DATA_ABS != 0
}

/// One decoded instruction with its references and, with `--check`, the
/// full addresses recorded after the abstract execution's values.
struct Insn {
    insn: Instruction,
    prog: InsnProgram,
    full: Vec<Recorded>,
}

/// What a data trace holds, counted while it is written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// Data references (lackey's ` L`, ` S`, ` M` lines).
    pub refs: u64,
    /// Those whose address the instruction gives (never recorded).
    pub static_refs: u64,
    /// Those whose address was read from a VALUE record (the others are
    /// recomputed by abstract execution).
    pub recorded_refs: u64,
    /// References compared with their full address (`--check`).
    pub checked_refs: u64,
}

/// How a module was recorded, its database for abstract execution, and
/// its blocks and procedures as decoded so far (by index: looked up once
/// per executed block).
struct ModData {
    image: aetrace_analysis::elf::Module,
    check: bool,
    db: ProgramDb,
    returns: Returns,
    blocks: Vec<Option<Rc<Vec<Insn>>>>,
    /// Per block: its compiled address program from its first
    /// instruction (`exec::code`: the known registers at a block's start
    /// are fixed, so it is compiled at its first run).
    codes: Vec<Option<Rc<BlockCode>>>,
    procs: Vec<Option<Rc<ProcFacts>>>,
}

/// A traced procedure's cross-block facts (`exec::entry_knowledge`), per
/// block.
struct ProcFacts {
    ways: Vec<Vec<WayIn>>,
    known: Vec<RegSet>,
    /// The block records `rsp` before its last instruction if unknown
    /// (`exec::anchors_rsp`).
    anchors: Vec<bool>,
}

/// A thread's abstract execution state.
struct ThreadExec {
    exec: Exec,
    /// The run before: module, block, and whether it ran to its end.
    prev: Option<(u32, BlockIx, bool)>,
}

/// Writes the data trace of `trace` to `out`.
pub fn write(
    trace: &Path,
    opts: &aetrace_regen::Options,
    format: DataFormat,
    out: &mut dyn Write,
) -> Result<Counts, Error> {
    walk(trace, opts, &mut Text { format, out })
}

/// Gives every instruction and data reference of `trace` to `sink`.
pub fn walk(
    trace: &Path,
    opts: &aetrace_regen::Options,
    sink: &mut impl Sink,
) -> Result<Counts, Error> {
    let trace = Trace::open(trace)?;
    if !trace.modules().iter().any(has_data_flag) {
        return Err("the trace has no data addresses: record it with --data".into());
    }
    let visit = Visit::new(&trace, opts)?;
    let mut w = Writer {
        sink,
        mods: Vec::new(),
        values: Vec::new(),
        next: 0,
        entered: Vec::new(),
        thread: None,
        state: ThreadExec {
            exec: Exec::unknown(0),
            prev: None,
        },
        sig: signals::Signals::default(),
        info: InstructionInfoFactory::new(),
        addrs: InsnAddrs::default(),
        counts: Counts::default(),
    };
    for m in visit.modules() {
        w.mods.push(mod_data(&trace, m)?);
    }
    w.sink.modules(visit.modules());
    let mut failed: Option<Error> = None;
    visit.run(&mut |runs| {
        for e in runs.events() {
            if let Err(err) = w.event(&trace, &visit, e) {
                failed = Some(err);
                return false;
            }
        }
        true
    })?;
    if let Some(e) = failed {
        return Err(e);
    }
    w.end_thread()?;
    Ok(w.counts)
}

/// A module's bytes and database, checked to be the one recorded with data.
fn mod_data<B: AsRef<[u8]>>(trace: &Trace<B>, m: &Module) -> Result<ModData, Error> {
    let Some(rec) = trace.module(ModuleId(m.tag)) else {
        return Err(format!("module {} is not in the trace", m.name).into());
    };
    if rec.flags & module_flags::DATA_ABS == 0 {
        return Err(format!(
            "module {} was recorded without data addresses: record with --data",
            m.name
        )
        .into());
    }
    let path = std::str::from_utf8(&rec.path)?;
    let image = aetrace_analysis::elf::Module::open(Path::new(path))?;
    if image.build_id() != rec.build_id {
        return Err(format!("{path} is not the file that was recorded (build-id differs)").into());
    }
    let db = trace
        .program_database(ModuleId(m.tag))
        .ok_or_else(|| format!("module {} has no program database", m.name))?;
    let db = ProgramDb::decode(&db.decompress()?)?;
    Ok(ModData {
        image,
        check: rec.flags & module_flags::DATA_CHECK != 0,
        returns: Returns::of(&db),
        db,
        blocks: vec![None; m.blocks.len()],
        codes: vec![None; m.blocks.len()],
        procs: vec![None; m.procs.len()],
    })
}

/// The walk's state; generic over the sink so that its calls, one per
/// reference, are inlined.
struct Writer<'o, S> {
    sink: &'o mut S,
    mods: Vec<ModData>,
    /// The current thread's values and the next one to use.
    values: Vec<u64>,
    next: usize,
    /// The values outside-entry stubs wrote (`DataValues::entered`),
    /// reversed: the next one last.
    entered: Vec<(usize, u32)>,
    thread: Option<ThreadId>,
    state: ThreadExec,
    /// The thread's signal handlers, entered and returned (`signals`).
    sig: signals::Signals,
    info: InstructionInfoFactory,
    /// The addresses of the instruction walked last (reused).
    addrs: InsnAddrs,
    counts: Counts,
}

impl<S: Sink> Writer<'_, S> {
    fn event<B: AsRef<[u8]> + Sync>(
        &mut self,
        trace: &Trace<B>,
        visit: &Visit<'_, B>,
        e: Event,
    ) -> Result<(), Error> {
        match e {
            Event::Thread(t) => {
                self.end_thread()?;
                let v = aetrace_regen::data_values_entered(trace, t)?;
                self.values = v.values;
                self.entered = v.entered;
                self.entered.reverse();
                self.sig = signals::Signals::of(v.signals);
                self.next = 0;
                self.thread = Some(t);
                self.state = ThreadExec {
                    exec: Exec::unknown(0),
                    prev: None,
                };
                Ok(())
            }
            Event::Run(r) => self.run(visit, r),
            Event::Signal {
                signo,
                offset,
                raised,
            } => self.deliver(signo, offset, raised),
            Event::SigReturn { offset } => self.sigreturn(offset),
        }
    }

    /// Every value of the finished thread must have been used (but an
    /// instruction's before the FAULT that ended it).
    fn end_thread(&mut self) -> Result<(), Error> {
        let Some(t) = self.thread else {
            return Ok(());
        };
        let unread = (self.sig.unread_at_end(self.values.len(), self.next))
            .map_err(|e| format!("thread {}: {e}", t.0))?;
        match self.thread {
            Some(t) if self.next + unread != self.values.len() => Err(format!(
                "thread {}: {} data values recorded, {} used: the trace and the reference table disagree",
                t.0,
                self.values.len(),
                self.next
            )
            .into()),
            _ => Ok(()),
        }
    }

    /// The decoded instructions of `block` (decoded at its first run).
    #[inline]
    fn decoded(&mut self, m: &Module, module: u32, block: BlockIx) -> Result<Rc<Vec<Insn>>, Error> {
        match &self.mods[module as usize].blocks[block.as_u32() as usize] {
            Some(b) => Ok(b.clone()),
            None => self.decode(m, module, block),
        }
    }

    #[cold]
    fn decode(&mut self, m: &Module, module: u32, block: BlockIx) -> Result<Rc<Vec<Insn>>, Error> {
        let md = &self.mods[module as usize];
        let blk = &m.blocks[block];
        let bytes = md
            .image
            .bytes_at(blk.start, u64::from(blk.size))
            .ok_or_else(|| format!("block {:#x}: no bytes in {}", blk.start, m.name))?;
        let mut d = Decoder::with_ip(64, bytes, blk.start, DecoderOptions::NONE);
        let mut insns = Vec::with_capacity(blk.ninsns as usize);
        for _ in 0..blk.ninsns {
            let insn = d.decode();
            let prog = forms::program(&insn, &mut self.info);
            let full = if md.check {
                full::plan(&insn, &prog)
                    .map_err(|why| format!("instruction at {:#x} ({insn}): {why}", insn.ip()))?
            } else {
                Vec::new()
            };
            insns.push(Insn { insn, prog, full });
        }
        let insns = Rc::new(insns);
        self.mods[module as usize].blocks[block.as_u32() as usize] = Some(insns.clone());
        Ok(insns)
    }

    /// The cross-block facts of the procedure of `block`.
    fn proc_facts(
        &mut self,
        m: &Module,
        module: u32,
        block: BlockIx,
    ) -> Result<Rc<ProcFacts>, Error> {
        let pi = m.blocks[block].proc;
        if let Some(f) = &self.mods[module as usize].procs[pi.as_u32() as usize] {
            return Ok(f.clone());
        }
        let range = m.procs[pi].blocks.clone();
        let mut blocks = Vec::with_capacity(range.len());
        for b in range {
            let insns = self.decoded(m, module, BlockIx::from_u32(b))?;
            blocks.push(
                insns
                    .iter()
                    .map(|i| (i.insn, i.prog.clone()))
                    .collect::<Vec<_>>(),
            );
        }
        let md = &self.mods[module as usize];
        let p = &md.db.procs[pi.as_u32() as usize];
        let facts = Rc::new(ProcFacts {
            ways: exec::ways_in(p, &md.returns),
            known: exec::entry_knowledge(p, &md.returns, &blocks),
            anchors: p.blocks.iter().map(exec::anchors_rsp).collect(),
        });
        self.mods[module as usize].procs[pi.as_u32() as usize] = Some(facts.clone());
        Ok(facts)
    }

    /// Sets the thread's state for the start of run `r`: the registers
    /// the analysis says are known there, carried from the run before.
    /// The code of its instructions from `r.first`, compiled for them.
    fn enter(&mut self, m: &Module, r: BlockRun) -> Result<Rc<BlockCode>, Error> {
        if let Some(code) = self.resumed_run(m, r)? {
            return Ok(code);
        }
        let facts = self.proc_facts(m, r.module, r.block)?;
        let first = m.procs[m.blocks[r.block].proc].blocks.start;
        let local = (r.block.as_u32() - first) as usize;
        let known = facts.known[local];
        if r.first != 0 && known.0 != 0 {
            return Err(format!(
                "block {:#x} of {} entered in its middle",
                m.blocks[r.block].start, m.name
            )
            .into());
        }
        if known.0 != 0 && !self.came_by(m, r, &facts.ways[local])? {
            match facts.ways[local].contains(&WayIn::Entry) {
                true => self.entry_rsp(m, r)?,
                false => {
                    return Err(format!(
                        "block {:#x} of {} entered from a block the data analysis did not assume",
                        m.blocks[r.block].start, m.name
                    )
                    .into())
                }
            }
        }
        let st = &mut self.state.exec;
        st.keep(known);
        debug_assert_eq!(
            st.known(),
            known,
            "a predecessor's end state covers the block's"
        );
        if st.known() != known {
            return Err("the data walk lost a register the analysis knows".into());
        }
        st.bias = m.load_base;
        let codes = &self.mods[r.module as usize].codes;
        match &codes[r.block.as_u32() as usize] {
            Some(c) if r.first == 0 => Ok(c.clone()),
            _ => self.compile(m, r, known, facts.anchors[local]),
        }
    }

    /// Compiles run `r`'s block from `r.first` for `known`, kept when
    /// from its start (a run from the middle starts with nothing known).
    #[cold]
    fn compile(
        &mut self,
        m: &Module,
        r: BlockRun,
        known: RegSet,
        anchor: bool,
    ) -> Result<Rc<BlockCode>, Error> {
        let insns = self.decoded(m, r.module, r.block)?;
        let progs: Vec<_> = (insns.iter()).map(|i| (i.insn, i.prog.clone())).collect();
        let code = Rc::new(BlockCode::compile(known, &progs, r.first as usize, anchor));
        if r.first == 0 {
            self.mods[r.module as usize].codes[r.block.as_u32() as usize] = Some(code.clone());
        }
        Ok(code)
    }

    /// At a procedure's entry not reached along a plain edge: the thread's
    /// state becomes the entry's `rsp` alone, from the call or jump the run
    /// before ended with, or the outside-entry stub's VALUE (`Entered`).
    fn entry_rsp(&mut self, m: &Module, r: BlockRun) -> Result<(), Error> {
        let pi = m.blocks[r.block].proc;
        let prev = match self.state.prev {
            Some((pm, pb, true)) if pm == r.module => {
                let pp = m.blocks[pb].proc;
                let local = pb.as_u32() - m.procs[pp].blocks.start;
                let db = &self.mods[pm as usize].db;
                db.procs[pp.as_u32() as usize].blocks[local as usize].call
            }
            _ => None,
        };
        let here = || {
            format!(
                "procedure {} block {:#x}",
                m.procs[pi].name, m.blocks[r.block].start
            )
        };
        let st = &mut self.state.exec;
        let carried = st.regs[Gpr::RSP.index()];
        let rsp = match Entered::by(prev.as_ref(), pi.as_u32()) {
            Entered::Call => carried.map(|v| v.wrapping_sub(8)),
            Entered::Jump => carried,
            Entered::Outside => Some(self.stub_rsp(m, pi.as_u32(), &here)?),
        };
        let rsp = rsp.ok_or_else(|| {
            format!(
                "{}: entered by a call or jump whose rsp the data walk does not know",
                here()
            )
        })?;
        let st = &mut self.state.exec;
        st.keep(RegSet(0));
        st.regs[Gpr::RSP.index()] = Some(rsp);
        Ok(())
    }

    /// The VALUE the outside-entry stub of procedure `q` wrote right after
    /// its ENTER: it must be the thread's next value.
    fn stub_rsp(&mut self, m: &Module, q: u32, here: &dyn Fn() -> String) -> Result<u64, Error> {
        let raw = (m.tag << 24) | q;
        // Values after an ENTER that were not a stub's (an entry that
        // does not start with `rsp` known) were read as addresses.
        while self.entered.last().is_some_and(|&(n, _)| n < self.next) {
            self.entered.pop();
        }
        match self.entered.last() {
            Some(&(n, w)) if n == self.next && w == raw => {
                self.entered.pop();
                self.next += 1;
                Ok(self.values[n])
            }
            _ => Err(format!(
                "{}: entered from outside, but the thread's next data value is not its stub's rsp",
                here()
            )
            .into()),
        }
    }

    /// Whether the run before `r` (in its thread, to its end) is one of
    /// the ways in the analysis assumed that carry the state: a plain
    /// predecessor in the same procedure, or a `ret` of the callee or of a
    /// procedure it reaches by tail calls.
    fn came_by(&mut self, m: &Module, r: BlockRun, ways: &[WayIn]) -> Result<bool, Error> {
        let Some((pm, pb, true)) = self.state.prev else {
            return Ok(false);
        };
        if pm != r.module {
            return Ok(false);
        }
        let (pp, pr) = (m.blocks[pb].proc, m.blocks[r.block].proc);
        let first = m.procs[pr].blocks.start;
        let by_ret =
            self.decoded(m, pm, pb)?.last().map(|i| i.insn.mnemonic()) == Some(Mnemonic::Ret);
        let returns = &self.mods[pm as usize].returns;
        Ok(ways.iter().any(|w| match *w {
            WayIn::Plain(b) => pp == pr && pb.as_u32() == first + b,
            WayIn::Return(f) => by_ret && returns.tail_reaches(f, pp.as_u32()),
            WayIn::Entry => false,
        }))
    }

    fn run<B: AsRef<[u8]> + Sync>(
        &mut self,
        visit: &Visit<'_, B>,
        r: BlockRun,
    ) -> Result<(), Error> {
        let m = &visit.modules()[r.module as usize];
        let insns = self.decoded(m, r.module, r.block)?;
        let code = self.enter(m, r)?;
        if m.shown {
            self.sink.run(r);
        }
        let check = self.mods[r.module as usize].check;
        // The reused addresses, out of `self` while `self` is borrowed.
        let mut got = std::mem::take(&mut self.addrs);
        let walked =
            (insns[r.first as usize..r.end as usize].iter().enumerate()).try_for_each(|(k, i)| {
                self.abstract_insn(m, i, &code, k, &mut got)?;
                if check {
                    let vals = self.take(i.full.len())?;
                    self.compare(m, r, r.first as usize + k, i, &got, &vals)?;
                }
                if m.shown {
                    self.print(i, &code, k, r.first + k as u32, m.load_base, &got)?;
                }
                Ok::<_, Error>(())
            });
        self.addrs = got;
        walked?;
        self.state.prev = Some((r.module, r.block, r.end == m.blocks[r.block].ninsns));
        Ok(())
    }

    /// Runs `i`, instruction `k` of `code`, in the thread's abstract
    /// execution, reading its values; its addresses into `got`. A
    /// recorded address is the original program's: the copies read
    /// copied jump tables (`Module::original_data_address`).
    #[inline]
    fn abstract_insn(
        &mut self,
        m: &Module,
        i: &Insn,
        code: &BlockCode,
        k: usize,
        got: &mut InsnAddrs,
    ) -> Result<(), Error> {
        let (values, next, thread) = (&self.values, &mut self.next, self.thread);
        let take = &mut |what| {
            let v = values
                .get(*next)
                .copied()
                .ok_or_else(|| short(thread, values.len()))?;
            *next += 1;
            Ok(match what {
                Recorded::Addr(_) => m.original_data_address(v),
                _ => v,
            })
        };
        let r = self.state.exec.run_code(code, k, take, got);
        r.map_err(|why| format!("instruction at {:#x} ({}): {why}", i.insn.ip(), i.insn).into())
    }

    /// `--check`: every rebuilt address (and a `rep`'s count) against the
    /// one recorded in full.
    fn compare(
        &mut self,
        m: &Module,
        r: BlockRun,
        k: usize,
        i: &Insn,
        got: &InsnAddrs,
        vals: &[u64],
    ) -> Result<(), Error> {
        let full = addresses(i, vals, m);
        let rep_full = i
            .full
            .iter()
            .zip(vals)
            .find(|(p, _)| **p == Recorded::Rcx)
            .map(|(_, &v)| v);
        let rep_got = got.rep.map(|(c, _)| c);
        let bad = (0..full.len()).find(|&j| full[j] != got.addrs[j]);
        self.counts.checked_refs += full.len() as u64;
        if bad.is_none() && rep_full == rep_got {
            return Ok(());
        }
        let pi = m.blocks[r.block].proc;
        let (expected, rebuilt) = bad.map_or((rep_full.unwrap_or(0), rep_got.unwrap_or(0)), |j| {
            (full[j], got.addrs[j])
        });
        Err(format!(
            "data check: procedure {} block {:#x} instruction {k} at {:#x} ({}), reference {}: expected {expected:#x}, rebuilt {rebuilt:#x}",
            m.procs[pi].name,
            m.blocks[r.block].start,
            i.insn.ip(),
            i.insn,
            bad.map_or("rcx".to_owned(), |j| j.to_string()),
        )
        .into())
    }

    /// The next `n` values of the thread.
    fn take(&mut self, n: usize) -> Result<Vec<u64>, Error> {
        let end = self.next + n;
        let v = self
            .values
            .get(self.next..end)
            .ok_or_else(|| short(self.thread, self.values.len()))?;
        self.next = end;
        Ok(v.to_vec())
    }

    /// Gives instruction `k` of `code` (`i`, the `at`-th of its block)
    /// and its references to the sink.
    #[inline]
    fn print(
        &mut self,
        i: &Insn,
        code: &BlockCode,
        k: usize,
        at: u32,
        base: u64,
        got: &InsnAddrs,
    ) -> Result<(), Error> {
        let ip = base.wrapping_add(i.insn.ip());
        let len = i.insn.len() as u32;
        let refs = code.refs(k);
        self.count(code, k, got);
        let Some((count, flags)) = got.rep else {
            self.sink.insn(at, ip, len)?;
            for (r, &a) in refs.iter().zip(&got.addrs) {
                self.sink.data(r.access, a, r.size)?;
            }
            return Ok(());
        };
        let dir: i64 = if flags & DF != 0 { -1 } else { 1 };
        for n in 0..count {
            self.sink.insn(at, ip, len)?;
            // A `rep`'s pointers advance by the size each iteration.
            for (r, &a) in refs.iter().zip(&got.addrs) {
                let step = (n as i64).wrapping_mul(dir).wrapping_mul(i64::from(r.size)) as u64;
                self.sink.data(r.access, a.wrapping_add(step), r.size)?;
            }
        }
        self.sink.insn(at, ip, len)
    }

    /// Counts the references of instruction `k` of `code`, every
    /// iteration of a `rep`.
    #[inline]
    fn count(&mut self, code: &BlockCode, k: usize, got: &InsnAddrs) {
        let times = got.rep.map_or(1, |(count, _)| count);
        let c = &code.insns[k];
        let n = &mut self.counts;
        n.refs += times.wrapping_mul(code.refs(k).len() as u64);
        n.static_refs += times.wrapping_mul(u64::from(c.statik));
        n.recorded_refs += times.wrapping_mul(u64::from(c.recorded));
    }
}

fn short(thread: Option<ThreadId>, n: usize) -> String {
    format!(
        "thread {}: the data values end after {n} (the trace is short of values)",
        thread.map_or(0, |t| t.0)
    )
}

/// The run-time address of each reference of `i` (a `rep`'s first
/// iteration), from the instruction or from its full values `vals` (the
/// original program's, as in `Writer::abstract_insn`).
fn addresses(i: &Insn, vals: &[u64], m: &Module) -> Vec<u64> {
    let base = m.load_base;
    let mut out: Vec<u64> = i
        .prog
        .refs
        .iter()
        .map(|r| match full::static_addr(&i.insn, r) {
            Some(s) if s.module => base.wrapping_add(s.addr),
            Some(s) => s.addr,
            None => 0,
        })
        .collect();
    for (p, &v) in i.full.iter().zip(vals) {
        if let Recorded::Addr(k) = *p {
            out[k] = m.original_data_address(v);
        }
    }
    out
}
