//! `aetrace regen --format lackey|xdin --data`: the instruction *and* data
//! trace of a `record --data --check` run (issue 21, point 4). The walk is
//! `regen::visit`'s (the executed blocks, per thread, identical for any
//! `-j`); each instruction's references come from
//! `analysis::addr::forms` (kind and size as lackey counts them) and their
//! addresses from the instruction (static ones) or from the thread's
//! VALUE records in order, as `analysis::addr::full` — the table the
//! rewriter placed them by — says.
//!
//! Output: `lackey` is valgrind lackey's text (`I  %08lx,%lu`, then ` L`,
//! ` S`, ` M` lines with `%08lx,%lu`); a `rep` string instruction is one
//! `I` per iteration plus one for the final `rcx == 0` test, as lackey
//! prints it. `xdin` is `i ADDR LEN`, `r ADDR SIZE`, `w ADDR SIZE` (hex; a
//! read-modify-write is `r` then `w`).
//!
//! Invariants: every value of a thread is used exactly once (too few or
//! too many is an error naming the thread); a module rewritten without
//! `--data --check` is refused, never printed without its references.

use std::collections::HashMap;
use std::io::Write;
use std::path::Path;
use std::rc::Rc;

use aetrace_analysis::addr::full::{self, Planned, DF};
use aetrace_analysis::addr::{Access, Repeat};
use aetrace_format::section::module_flags;
use aetrace_format::{ModuleId, ThreadId, Trace};
use aetrace_regen::visit::{BlockRun, Event, Visit};
use iced_x86::{Decoder, DecoderOptions, InstructionInfoFactory};

/// The two data-trace formats.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum DataFormat {
    /// valgrind lackey's `--trace-mem=yes` text.
    Lackey,
    /// Extended din with `r`/`w` lines.
    Xdin,
}

type Error = Box<dyn std::error::Error>;

/// What a data trace holds, counted while it is written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// Data references (lackey's ` L`, ` S`, ` M` lines).
    pub refs: u64,
    /// Those whose address the instruction gives (never recorded).
    pub static_refs: u64,
}

/// Writes the data trace of `trace` to `out`.
pub fn write(
    trace: &Path,
    opts: &aetrace_regen::Options,
    format: DataFormat,
    out: &mut dyn Write,
) -> Result<Counts, Error> {
    let trace = Trace::open(trace)?;
    if !trace
        .modules()
        .iter()
        .any(|m| m.flags & module_flags::DATA_CHECK != 0)
    {
        return Err("the trace has no data addresses: record it with --data --check".into());
    }
    let visit = Visit::new(&trace, opts)?;
    let mut w = Writer {
        format,
        out,
        images: Vec::new(),
        blocks: HashMap::new(),
        values: Vec::new(),
        next: 0,
        thread: None,
        info: InstructionInfoFactory::new(),
        counts: Counts::default(),
    };
    for m in visit.modules() {
        w.images.push(image(&trace, m)?);
    }
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

/// A module's bytes, checked to be the one recorded with data.
fn image<B: AsRef<[u8]>>(
    trace: &Trace<B>,
    m: &aetrace_regen::compile::Module,
) -> Result<Option<aetrace_analysis::elf::Module>, Error> {
    let Some(rec) = trace.module(ModuleId(m.tag)) else {
        return Err(format!("module {} is not in the trace", m.name).into());
    };
    if rec.flags & module_flags::DATA_CHECK == 0 {
        return Err(format!(
            "module {} was recorded without data addresses: record with --data --check",
            m.name
        )
        .into());
    }
    let path = std::str::from_utf8(&rec.path)?;
    let elf = aetrace_analysis::elf::Module::open(Path::new(path))?;
    if elf.build_id() != rec.build_id {
        return Err(format!("{path} is not the file that was recorded (build-id differs)").into());
    }
    Ok(Some(elf))
}

struct Writer<'o> {
    format: DataFormat,
    out: &'o mut dyn Write,
    images: Vec<Option<aetrace_analysis::elf::Module>>,
    blocks: HashMap<(u32, u32), Rc<Vec<Planned>>>,
    /// The current thread's values and the next one to use.
    values: Vec<u64>,
    next: usize,
    thread: Option<ThreadId>,
    info: InstructionInfoFactory,
    counts: Counts,
}

impl Writer<'_> {
    fn event<B: AsRef<[u8]> + Sync>(
        &mut self,
        trace: &Trace<B>,
        visit: &Visit<'_, B>,
        e: Event,
    ) -> Result<(), Error> {
        match e {
            Event::Thread(t) => {
                self.end_thread()?;
                self.values = aetrace_regen::data_values(trace, t)?;
                self.next = 0;
                self.thread = Some(t);
                Ok(())
            }
            Event::Run(r) => self.run(visit, r),
        }
    }

    /// Every value of the finished thread must have been used.
    fn end_thread(&mut self) -> Result<(), Error> {
        match self.thread {
            Some(t) if self.next != self.values.len() => Err(format!(
                "thread {}: {} data values recorded, {} used: the trace and the reference table disagree",
                t.0,
                self.values.len(),
                self.next
            )
            .into()),
            _ => Ok(()),
        }
    }

    fn decoded(
        &mut self,
        visit_mod: &aetrace_regen::compile::Module,
        r: BlockRun,
    ) -> Result<Rc<Vec<Planned>>, Error> {
        let key = (r.module, r.block.as_u32());
        if let Some(b) = self.blocks.get(&key) {
            return Ok(b.clone());
        }
        let blk = &visit_mod.blocks[r.block];
        let elf = self.images[r.module as usize]
            .as_ref()
            .ok_or("a module without its image")?;
        let bytes = elf
            .bytes_at(blk.start, u64::from(blk.size))
            .ok_or_else(|| format!("block {:#x}: no bytes in {}", blk.start, visit_mod.name))?;
        let mut d = Decoder::with_ip(64, bytes, blk.start, DecoderOptions::NONE);
        let mut insns = Vec::with_capacity(blk.ninsns as usize);
        for _ in 0..blk.ninsns {
            insns.push(Planned::new(d.decode(), &mut self.info)?);
        }
        let insns = Rc::new(insns);
        self.blocks.insert(key, insns.clone());
        Ok(insns)
    }

    fn run<B: AsRef<[u8]> + Sync>(
        &mut self,
        visit: &Visit<'_, B>,
        r: BlockRun,
    ) -> Result<(), Error> {
        let m = &visit.modules()[r.module as usize];
        let insns = self.decoded(m, r)?;
        for i in &insns[r.first as usize..r.end as usize] {
            let vals = self.take(i.plan.len())?;
            let refs = i.addresses(&vals, m.load_base);
            if m.shown {
                self.print(i, m.load_base, &vals, &refs)?;
            }
        }
        Ok(())
    }

    /// The next `n` values of the thread.
    fn take(&mut self, n: usize) -> Result<Vec<u64>, Error> {
        let end = self.next + n;
        let v = self.values.get(self.next..end).ok_or_else(|| {
            format!(
                "thread {}: the data values end after {} (the trace is short of values)",
                self.thread.map_or(0, |t| t.0),
                self.values.len()
            )
        })?;
        self.next = end;
        Ok(v.to_vec())
    }

    fn print(&mut self, i: &Planned, base: u64, vals: &[u64], refs: &[u64]) -> Result<(), Error> {
        let ip = base.wrapping_add(i.insn.ip());
        let len = i.insn.len() as u64;
        let rep = i.prog.refs.iter().any(|r| r.repeat == Repeat::Rcx);
        if !rep {
            self.insn_line(ip, len)?;
            return self.ref_lines(i, refs, 0, 1);
        }
        // `rep`: values start with rcx and rflags (`full::plan`).
        let (count, flags) = (vals[0], vals[1]);
        let dir: i64 = if flags & DF != 0 { -1 } else { 1 };
        for k in 0..count {
            self.insn_line(ip, len)?;
            self.ref_lines(i, refs, k, dir)?;
        }
        Ok(self.insn_line(ip, len)?)
    }

    fn insn_line(&mut self, ip: u64, len: u64) -> std::io::Result<()> {
        match self.format {
            DataFormat::Lackey => writeln!(self.out, "I  {ip:08x},{len}"),
            DataFormat::Xdin => writeln!(self.out, "i {ip:x} {len:x}"),
        }
    }

    /// The references of iteration `k` (a `rep`'s pointers advance by the
    /// size each iteration, in direction `dir`).
    fn ref_lines(&mut self, i: &Planned, refs: &[u64], k: u64, dir: i64) -> Result<(), Error> {
        for (r, &a) in i.prog.refs.iter().zip(refs) {
            self.counts.refs += 1;
            if full::static_addr(&i.insn, r).is_some() {
                self.counts.static_refs += 1;
            }
            let step = (k as i64).wrapping_mul(dir).wrapping_mul(i64::from(r.size)) as u64;
            let a = a.wrapping_add(step);
            let s = r.size;
            match (self.format, r.access) {
                (DataFormat::Lackey, acc) => writeln!(self.out, " {} {a:08x},{s}", acc.letter())?,
                (DataFormat::Xdin, Access::Load) => writeln!(self.out, "r {a:x} {s:x}")?,
                (DataFormat::Xdin, Access::Store) => writeln!(self.out, "w {a:x} {s:x}")?,
                (DataFormat::Xdin, Access::Modify) => {
                    writeln!(self.out, "r {a:x} {s:x}\nw {a:x} {s:x}")?
                }
            }
        }
        Ok(())
    }
}
